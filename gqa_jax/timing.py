"""T_infer, the paper's decode time per sample, as ``DIR/timing.json`` records it: ``time`` measures
it (``tools.t_infer``), ``time --predict`` predicts it for a TPU slice from the slice's compiler
(``tools.t_infer_predict``); both construct a :class:`TimingRecord` and write it, and the report
reads it back (``experiments.parts.records``).

The JSON is the record's fields in their order, an optional field left out when it is None: a
measured record has no ``prediction``, a predicted one no ``steps_times_s`` / ``step_bytes``, and a
record written before a field was recorded lacks it (``cache_dtype``, the prefill's and the
decoder steps' times, the bytes model). :func:`read` checks every field: one ValueError naming the
file and the field. What another module computes (``machine``, ``step_bytes``, a program's
``memory``, the ``chip``) is kept whole, the keys the report reads checked.

The roofline (:func:`roofline`): a program's time on one chip is ``max(flops / peak, bytes /
bandwidth)``; a batch of ``B`` rows takes ``prefill + output_len x step`` on every chip at once,
``x chips / B`` per sample per chip (:func:`per_sample_per_chip`, the paper's unit). The read-once
floor (:meth:`TimingRecord.read_once_floor`) is the same roofline with each program's bytes what it
must read or write once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TIMING_FILE = "timing.json"
_Check = Callable[[Any, str], Any]  # (a JSON value, its field's path) -> the record's value


class _Invalid(ValueError):
    """A field of a timing record that is missing or of the wrong kind (its message names it)."""


# ----------------------------------------------------------------------------- the fields' checks
def _invalid(path: str, expected: str, value: Any) -> _Invalid:
    text = repr(value)
    return _Invalid(f"field {path!r} must be {expected}, got {text[:80] + '...' if len(text) > 80 else text}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: Any, path: str) -> float:
    if not _is_number(value):
        raise _invalid(path, "a number", value)
    return value


def _positive(value: Any, path: str) -> float:
    if not _is_number(value) or not value > 0:
        raise _invalid(path, "a positive number", value)
    return value


def _integer(least: int) -> _Check:
    def check(value: Any, path: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise _invalid(path, f"an integer >= {least}", value)
        return value

    return check


def _text(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise _invalid(path, "a string", value)
    return value


def _flag(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise _invalid(path, "true or false", value)
    return value


def _numbers(value: Any, path: str) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise _invalid(path, "a list of numbers", value)
    return tuple(_number(v, f"{path}[{i}]") for i, v in enumerate(value))


def _object(required: Mapping[str, _Check] | None = None, each: _Check | None = None) -> _Check:
    """A JSON object kept whole: ``required`` keys checked, every value by ``each`` when given."""

    def check(value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _invalid(path, "a JSON object", value)
        for key, item in value.items():
            if each is not None:
                each(item, f"{path}.{key}")
        for key, check_item in (required or {}).items():
            if key not in value:
                raise _Invalid(f"field {f'{path}.{key}'!r} is missing")
            check_item(value[key], f"{path}.{key}")
        return value

    return check


def _nested(cls: type) -> _Check:
    return lambda value, path: _build(cls, value, path)


def _rows(cls: type) -> _Check:
    def check(value: Any, path: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise _invalid(path, "a list of JSON objects", value)
        return tuple(_build(cls, v, f"{path}[{i}]") for i, v in enumerate(value))

    return check


def _field(check: _Check, optional: bool = False) -> Any:
    """A record field read by ``check``; an optional one defaults to None (left out of the JSON)."""
    if optional:
        return dataclasses.field(default=None, metadata={"check": check, "optional": True})
    return dataclasses.field(metadata={"check": check, "optional": False})


def _build(cls: type, data: Any, path: str = "") -> Any:
    """``cls`` from its JSON object: every field checked, none unknown."""
    if not isinstance(data, dict):
        raise _invalid(path or "record", "a JSON object", data)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise _Invalid(f"field {(f'{path}.' if path else '') + key!r} is not one of {', '.join(fields)}")
    values = {}
    for name, f in fields.items():
        where = f"{path}.{name}" if path else name
        if name in data:
            values[name] = f.metadata["check"](data[name], where)
        elif not f.metadata["optional"]:
            raise _Invalid(f"field {where!r} is missing")
    return cls(**values)


def _as_json(value: Any) -> Any:
    """A record (or a part of one) as its JSON value: fields in order, None ones left out."""
    if dataclasses.is_dataclass(value):
        pairs = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
        return {name: _as_json(v) for name, v in pairs if v is not None}
    if isinstance(value, tuple):
        return [_as_json(v) for v in value]
    return value


# ----------------------------------------------------------------------------- the roofline
def roofline(flops: float, bytes_: float, chip: Mapping[str, Any]) -> tuple[float, float]:
    """A program's ``(compute_s, memory_s)`` on one chip (``chip``: ``tpu_topology.Chip`` as a
    dict): its flops against the chip's bf16 peak, its bytes against its HBM bandwidth. The
    program's time is the larger."""
    return flops / chip["peak_bf16_flops"], bytes_ / chip["hbm_bytes_per_s"]


def per_sample_per_chip(batch_s: float, chips: int, batch: int) -> float:
    """The paper's unit: a batch's seconds on every chip at once, x chips / the batch's rows."""
    return batch_s * chips / batch


_MEMORY = _object({k: _integer(0) for k in ("argument", "output", "alias")}, each=_number)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Roofline:
    """One program (the prefill, or one decode step) of a predicted mesh: one chip's cost from the
    TPU compiler's ``cost_analysis`` and its roofline; ``memory`` its ``memory_analysis``
    (``compiled_memory.memory``). A prefill the TPU encodes in row chunks is one chunk's program
    (``memory``) with its cost x ``chunks`` (``rows`` per chunk; ``scaled`` says so)."""

    flops: float = _field(_number)
    bytes_accessed: float = _field(_number)
    compute_s: float = _field(_number)
    memory_s: float = _field(_number)
    s: float = _field(_number)
    bound: str = _field(_text)  # "compute" or "memory"
    memory: Mapping[str, int] = _field(_MEMORY)
    rows: int | None = _field(_integer(1), optional=True)
    chunks: int | None = _field(_integer(1), optional=True)
    scaled: str | None = _field(_text, optional=True)

    @classmethod
    def of(cls, cost: Mapping[str, float], chip: Mapping[str, Any], **rest: Any) -> Roofline:
        """The roofline of ``cost`` (``compiled_memory.cost``: flops, bytes_accessed) on ``chip``."""
        compute, memory_s = roofline(cost["flops"], cost["bytes_accessed"], chip)
        bound = "compute" if compute >= memory_s else "memory"
        return cls(flops=cost["flops"], bytes_accessed=cost["bytes_accessed"], compute_s=compute,
                   memory_s=memory_s, s=max(compute, memory_s), bound=bound, **rest)  # fmt: skip

    def read_once_s(self, chip: Mapping[str, Any]) -> float:
        """The roofline with the bytes the program must read or write once (its arguments, the
        weights and the cache, and its outputs not aliased to them; a chunked prefill's once per
        chunk) instead of XLA's count over every op."""
        mem = self.memory
        once = (mem["argument"] + mem["output"] - mem["alias"]) * (self.chunks or 1)
        return max(roofline(self.flops, once, chip))


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshRow:
    """One ``DATAxMODEL`` mesh of a prediction: its batch and, where the programs compiled, their
    rooflines and the time per sample per chip; else why not (``fits`` false, ``why``)."""

    mesh: str = _field(_text)
    batch: int = _field(_integer(0))  # 0: no batch fits
    how: str | None = _field(_text, optional=True)  # how the batch was found
    loop_total_bytes: int | None = _field(_integer(0), optional=True)  # the decode loop's memory per chip
    cache_specs: Mapping[str, str] | None = _field(_object(each=_text), optional=True)  # the cache's layout
    fits: bool = _field(_flag)
    why: str | None = _field(_text, optional=True)
    prefill: Roofline | None = _field(_nested(Roofline), optional=True)
    step: Roofline | None = _field(_nested(Roofline), optional=True)
    # the paper's decode: where its compiled loop has the per-step cross K/V projection ("in the loop",
    # "hoisted": then prefill and step are the programs the loop runs, the projection once, and
    # step_in_loop the step as written, projecting them: its cost had the compiler kept it in the loop)
    cross_kv_projection: str | None = _field(_text, optional=True)
    step_in_loop: Roofline | None = _field(_nested(Roofline), optional=True)
    batch_s: float | None = _field(_number, optional=True)  # prefill + output_len x step
    time_per_sample_s: float | None = _field(_number, optional=True)
    prefill_per_sample_s: float | None = _field(_number, optional=True)
    compile_s: float | None = _field(_number, optional=True)


_CHIP = _object({"device_kind": _text, "peak_bf16_flops": _positive, "hbm_bytes_per_s": _positive})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prediction:
    """What ``time --predict`` adds: the TPU slice, every mesh tried, the fastest (``mesh``)."""

    topology: str = _field(_text)
    chips: int = _field(_integer(1))
    chip: Mapping[str, Any] = _field(_CHIP)  # tpu_topology.Chip as a dict
    hbm_gib: float = _field(_positive)
    mesh: str = _field(_text)  # the row of ``meshes`` the record's times are
    unit: str = _field(_text)
    meshes: tuple[MeshRow, ...] = _field(_rows(MeshRow))
    wall_s: float = _field(_number)

    @property
    def chosen(self) -> MeshRow | None:
        """The row of ``meshes`` the record's times are (None where there is none)."""
        return next((m for m in self.meshes if m.mesh == self.mesh), None)


# ----------------------------------------------------------------------------- the record
_STEP_BYTES = _object({k: _number for k in ("self_cache", "cross_cache", "total")}, each=_number)
_ROOFLINE = _object({k: _number for k in ("roofline_s", "read_gb_s", "matmul_gflop_s")}, each=_number)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TimingRecord:
    """``DIR/timing.json``: T_infer of one model at one input and output length (module docstring).
    Times are seconds; ``*_times_s`` each repeat's time of the whole batch, ``*_per_sample_s`` their
    median / batch (a prediction: per sample per chip, no repeats)."""

    time_per_sample_s: float = _field(_number)
    times_s: tuple[float, ...] = _field(_numbers)
    prefill_per_sample_s: float | None = _field(_number, optional=True)
    prefill_times_s: tuple[float, ...] | None = _field(_numbers, optional=True)
    steps_per_sample_s: float | None = _field(_number, optional=True)
    batch: int = _field(_integer(1))
    batch_rule: str = _field(_text)
    input_len: int = _field(_integer(1))
    output_len: int = _field(_integer(1))
    preset: str = _field(_text)  # "custom": a checkpoint of no preset's shape
    num_heads: int = _field(_integer(1))
    num_kv_heads: int = _field(_integer(1))
    dtype: str = _field(_text)
    cache_dtype: str | None = _field(_text, optional=True)
    decode: str | None = _field(_text, optional=True)  # the paper's decode (an instrument); None: ours
    beams: int | None = _field(_integer(1), optional=True)  # a beam search's steps predicted; None: greedy
    weights: str = _field(_text)  # "random", a checkpoint's path, or a prediction's "none: ..."
    machine: Mapping[str, Any] = _field(_object())  # measurement.machine_info
    steps_times_s: tuple[float, ...] | None = _field(_numbers, optional=True)  # the step loop's repeats
    step_bytes: Mapping[str, int] | None = _field(_STEP_BYTES, optional=True)  # decode_floor.step_bytes
    # a decoder step's roofline at the rates the machine read and multiplied at in the run
    # (decode_floor.roofline_s), and those rates
    step_roofline: Mapping[str, float] | None = _field(_ROOFLINE, optional=True)
    prediction: Prediction | None = _field(_nested(Prediction), optional=True)  # time --predict's

    @classmethod
    def from_dict(cls, data: Any, source: str | Path = TIMING_FILE) -> TimingRecord:
        """The record of a timing.json's object; ValueError naming ``source`` and the field."""
        try:
            return _build(cls, data)
        except _Invalid as err:
            raise ValueError(f"{source}: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object timing.json holds (module docstring)."""
        return _as_json(self)

    def read_once_floor(self) -> float | None:
        """A predicted T_infer's lower bound, per sample per chip: the roofline of the mesh and batch
        the prediction chose, each program's bytes those it must read or write once
        (:meth:`Roofline.read_once_s`). None for a measured time."""
        p = self.prediction
        row = p.chosen if p is not None else None
        if row is None or row.prefill is None or row.step is None:
            return None
        prefill, step = row.prefill.read_once_s(p.chip), row.step.read_once_s(p.chip)
        return per_sample_per_chip(prefill + self.output_len * step, p.chips, self.batch)


def read(path: str | Path) -> TimingRecord | None:
    """The record at ``path`` (None when there is no such file); ValueError naming the file and
    the field when it is not one."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    return TimingRecord.from_dict(data, path)
