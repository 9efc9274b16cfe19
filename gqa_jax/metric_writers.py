"""The run's metric files: ``metrics.jsonl``, TensorBoard events and decoded examples.

``MetricWriter`` appends one JSON line per ``write`` to ``workdir/metrics.jsonl`` (and mirrors the
scalars to TensorBoard under ``workdir/tensorboard/``); ``read_metrics`` reads them back;
``write_decodes`` stores decoded examples as JSONL, atomically. Non-finite values are written as
the JSON strings ``"nan"``, ``"inf"`` and ``"-inf"`` (strict JSON has no NaN, and null would lose
inf vs nan); ``read_metrics`` turns them back into floats.

A workdir may be ``gs://...`` (see ``gqa_jax.paths``): an object is written whole, so there each
write rewrites ``metrics.jsonl`` and the event file with everything so far (both stay small: one
line per logged step), which is as crash-safe as the local append.

In a multi-host run, create writers on process 0 only.
"""

from __future__ import annotations

import io
import json
import math
import operator
import os
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np
from etils import epath

from gqa_jax import paths
from gqa_jax.metrics import import_without

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"

_JSON_TO_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _to_number(key: str, value: Any) -> int | float:
    """A Python int or float from a Python, numpy or jax scalar (0-d array); bool counts as int."""
    array = np.asarray(value)
    if array.ndim != 0:
        raise ValueError(f"metric {key!r} must be a scalar, got shape {array.shape}")
    kind, name = array.dtype.kind, array.dtype.name
    if kind in "biu":
        return int(array)
    if kind == "f" or name.startswith(("bfloat", "float")):  # ml_dtypes (bfloat16, float8_*) are kind "V"
        return float(array)
    raise ValueError(f"metric {key!r} must be a real number, got {value!r} of dtype {array.dtype}")


def _encode(value: int | float) -> int | float | str:
    """JSON-safe value: non-finite floats become the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "nan", "inf" or "-inf"
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value in _JSON_TO_NONFINITE:
        return _JSON_TO_NONFINITE[value]
    return value


def _without_torn_tail(data: bytes, path: epath.Path) -> bytes:
    """``data`` ending in a newline, as appends need after a crash: a complete JSON record that only
    misses its newline is kept, a half-written one is cut off (with a warning; it holds no
    recoverable data). Nothing before the last newline is ever touched."""
    if not data or data.endswith(b"\n"):
        return data
    start = data.rfind(b"\n") + 1
    tail = data[start:]
    try:
        json.loads(tail)
    except ValueError:
        warnings.warn(
            f"{path}: dropping a half-written last line ({len(tail)} bytes): {tail[:80]!r}", stacklevel=4
        )
        return data[:start]
    return data + b"\n"


def _repair_tail(path: epath.Path) -> None:
    """Make a local file that a crash left without its final newline end in one (see above)."""
    if not path.exists() or os.path.getsize(path) == 0:
        return
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
    data = path.read_bytes()  # Only after a crash: read it all to find the last newline.
    fixed = _without_torn_tail(data, path)
    with open(path, "r+b") as f:
        f.truncate(min(len(fixed), len(data)))
    if len(fixed) > len(data):
        with open(path, "ab") as f:
            f.write(b"\n")


class _EventObject:
    """A TensorBoard event file on an object store: the records so far, written whole on flush."""

    def __init__(self, path: str):
        self._file, self._buffer = epath.Path(path), io.BytesIO()

    def write(self, data: bytes) -> None:
        self._buffer.write(data)

    def flush(self) -> None:
        self._file.write_bytes(self._buffer.getvalue())

    def close(self) -> None:
        self.flush()


class _EventObjects:
    """tensorboardX's writer factory for gs:// logdirs (its own needs google-cloud-storage's
    client and credentials; this writes through epath like every other file of the run)."""

    def open(self, path: str) -> _EventObject:
        return _EventObject(path)

    def directory_check(self, path: str) -> None:
        pass  # an object store has no directories to create


def load_tensorboardx() -> ModuleType:
    """tensorboardX, imported without torch (``import_without``: scalars never need it)."""
    return import_without("tensorboardX", ("torch",))


class MetricWriter:
    """Appends scalar metrics to ``workdir/metrics.jsonl`` and TensorBoard (``workdir/tensorboard``).

    Each ``write(step, scalars)`` adds one line ``{"step": step, **scalars}``, flushed at once, so a
    resumed run keeps appending to the same file (an existing file is never truncated; only a
    half-written last line left by a crash is dropped). Values may be Python, numpy or jax
    scalars; non-finite ones are stored as "nan" / "inf" / "-inf" (see the module docstring).
    ``workdir`` may be local or gs://. Usable as a context manager.
    """

    def __init__(self, workdir: str | os.PathLike, *, tensorboard: bool = True):
        self.workdir = paths.resolve(workdir, "metrics directory")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path = self.workdir / METRICS_FILE
        self._remote = paths.is_remote(self.path)
        self._closed = False
        self._text = b""  # on an object store: the whole file, rewritten on each write
        if self._remote:
            if self.path.exists():
                self._text = _without_torn_tail(self.path.read_bytes(), self.path)
            self._file = None
        else:
            _repair_tail(self.path)
            self._file = open(self.path, "a", encoding="utf-8")
        self._tensorboard = None
        if tensorboard:
            tensorboardx = load_tensorboardx()
            if self._remote:
                from tensorboardX import record_writer

                for scheme in paths.SCHEMES:
                    record_writer.register_writer_factory(scheme, _EventObjects())
            self._tensorboard = tensorboardx.SummaryWriter(logdir=os.fspath(self.workdir / TENSORBOARD_DIR))

    def write(self, step: int, scalars: Mapping[str, Any]) -> None:
        """Appends ``{"step": step, **scalars}`` as one JSON line and to TensorBoard."""
        if self._closed:
            raise ValueError(f"MetricWriter for {self.path} is closed")
        try:
            step = operator.index(step)
        except TypeError:
            raise ValueError(f"step must be an integer, got {step!r}") from None
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if "step" in scalars:
            raise ValueError("scalars must not contain the key 'step' (it is the write's step argument)")
        values = {}
        for key, value in scalars.items():
            if not isinstance(key, str):
                raise ValueError(f"metric names must be strings, got {key!r}")
            values[key] = _to_number(key, value)
        record = {"step": step, **{key: _encode(value) for key, value in values.items()}}
        line = json.dumps(record, allow_nan=False) + "\n"
        if self._remote:
            self._text += line.encode()
            self.path.write_bytes(self._text)
        else:
            self._file.write(line)
            self._file.flush()
        if self._tensorboard is not None:
            for key, value in values.items():
                self._tensorboard.add_scalar(key, value, global_step=step)
            self._tensorboard.flush()

    def close(self) -> None:
        """Closes the files; closing twice is fine."""
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    def __enter__(self) -> MetricWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_metrics(path_or_workdir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (or of ``workdir/metrics.jsonl``), in file order.

    "nan" / "inf" / "-inf" strings come back as floats. A malformed last line (a crash mid-write)
    is skipped with a warning; a malformed line before it raises ``ValueError``.
    """
    path = paths.resolve(path_or_workdir, "metrics file")
    if path.is_dir():
        path = path / METRICS_FILE
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            if number == len(lines):
                warnings.warn(
                    f"{path}: skipping a malformed last line {number} (half-written?): {e}", stacklevel=2
                )
                break
            raise ValueError(f"{path}: line {number} is not valid JSON: {e}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}: line {number} is not a JSON object: {line[:80]!r}")
        records.append({key: _decode(value) for key, value in record.items()})
    return records


def write_decodes(
    path: str | os.PathLike,
    inputs: Sequence[str],
    predictions: Sequence[str],
    references: Sequence[Any],
) -> epath.Path:
    """Writes decoded examples as JSONL ``{"input", "prediction", "reference"}``, atomically.

    ``references[i]`` may be a string or a list of strings (TriviaQA aliases). The file is written
    to a temporary file next to ``path`` and renamed over it, so readers never see a partial file.
    Returns the path.
    """
    if not len(inputs) == len(predictions) == len(references):
        raise ValueError(
            f"inputs, predictions and references differ in length: "
            f"{len(inputs)}, {len(predictions)}, {len(references)}"
        )
    path = paths.resolve(path, "decodes file")
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for input_, prediction, reference in zip(inputs, predictions, references, strict=True):
        if not isinstance(reference, str):
            reference = list(reference)
        record = {"input": input_, "prediction": prediction, "reference": reference}
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    paths.write_text_atomic(path, "".join(lines))
    return path
