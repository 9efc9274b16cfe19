"""What a report reads from a sweep's run directories, and how the parts pick their cells from it.

:func:`collect`: one :class:`Record` per run of the sweep (ROOT/<run>/run.json, results.json,
timing.json, metrics.jsonl); :func:`gather`: the selected runs grouped into cells, each a
``stats.Stat`` over seeds; :func:`gather_times`: time cells, each a ``stats.Stat`` over the timing
repeats of its runs (median and spread); :func:`select` / :func:`in_part`: which runs a part takes.

A time run's record keeps its timing.json (``gqa_jax.timing.TimingRecord``, checked as it is read)
and reads nothing more from it: the whole decode's repeats, the prefill's, the decoder steps'
(``steps_times_s``, measured on a prefilled state) and the bytes model of one step
(``step_bytes``). A timing.json written before the last two were recorded has none: those cells
are missing, never the whole time less the prefill's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax import timing as timing_lib
from gqa_jax.experiments.stats import Stat, stat
from gqa_jax.experiments.sweep import Run, Sweep
from gqa_jax.metric_writers import read_metrics
from gqa_jax.timing import TIMING_FILE, Prediction, TimingRecord

PROXY_STAGES = ("pretrain", "uptrain")  # a proxy's runs: their dev loss is the span-corruption loss


@dataclasses.dataclass(frozen=True)
class Record:
    """What a run's directory holds: its run.json status and the numbers the report reads."""

    run: Run
    status: str  # "done", "failed", ... from run.json; "not run" without one
    score: float | None = None  # results.json primary
    dev_loss: float | None = None  # results.json loss: teacher-forced NLL per target token
    loss: float | None = None  # last eval/loss of metrics.jsonl (a training run's dev loss)
    start_loss: float | None = None  # eval/loss at step 0 (eval_at_start: the converted model's)
    timing: TimingRecord | None = None  # timing.json (a time run's)

    @property
    def time(self) -> float | None:
        """timing.json's time_per_sample_s."""
        return _finite(self.timing.time_per_sample_s) if self.timing is not None else None

    @property
    def times(self) -> tuple[float, ...]:
        """timing.json's times_s / batch: each repeat's time per sample."""
        return _per_sample(self.timing, "times_s")

    @property
    def prefill_times(self) -> tuple[float, ...]:
        """The prefill alone: timing.json's prefill_times_s / batch (a prediction: its one number)."""
        return self._predicted_or_repeats("prefill_per_sample_s", "prefill_times_s")

    @property
    def steps_times(self) -> tuple[float, ...]:
        """The decoder's steps alone: timing.json's steps_times_s / batch (a prediction: its one
        number)."""
        return self._predicted_or_repeats("steps_per_sample_s", "steps_times_s")

    def _predicted_or_repeats(self, per_sample: str, repeats: str) -> tuple[float, ...]:
        """A prediction's one number (no repeats), else the repeats per sample."""
        if self.predicted is not None:
            value = _finite(getattr(self.timing, per_sample))
            if value is not None:
                return (value,)
        return _per_sample(self.timing, repeats)

    @property
    def step_bytes(self) -> float | None:
        """timing.json's step_bytes total: the bytes one decoder step reads."""
        read = self.timing.step_bytes if self.timing is not None else None
        return _finite(read["total"]) if read is not None else None

    @property
    def roofline_sample(self) -> float | None:
        """timing.json's step roofline over the decoder's steps, per sample: output_len steps of
        ``roofline_s`` over the batch (None where it was not recorded)."""
        roof = self.timing.step_roofline if self.timing is not None else None
        if roof is None:
            return None
        return _finite(roof["roofline_s"] * self.timing.output_len / self.timing.batch)

    @property
    def read_gb_s(self) -> float | None:
        """The machine's read rate for a buffer of the step's size, measured in the time run."""
        roof = self.timing.step_roofline if self.timing is not None else None
        return _finite(roof["read_gb_s"]) if roof is not None else None

    @property
    def floor_times(self) -> tuple[float, ...]:
        """A predicted time's read-once floor (``TimingRecord.read_once_floor``), none when measured."""
        floor = _finite(self.timing.read_once_floor()) if self.timing is not None else None
        return () if floor is None else (floor,)

    @property
    def machine(self) -> Mapping[str, Any]:
        """timing.json's machine."""
        return self.timing.machine if self.timing is not None else {}

    @property
    def sample_bytes(self) -> float | None:
        """The bytes the decoder's steps read per sample by the bytes model: output_len steps of
        ``step_bytes`` each, over the batch (None without a bytes model)."""
        if self.step_bytes is None:
            return None
        return self.step_bytes * self.timing.output_len / self.timing.batch

    @property
    def cache_share(self) -> float | None:
        """The cache's share of ``step_bytes`` (self and cross K/V over weights + cache)."""
        if self.step_bytes is None or not self.step_bytes:
            return None
        read = self.timing.step_bytes
        cache = [_finite(read[k]) for k in ("self_cache", "cross_cache")]
        return None if None in cache else sum(cache) / self.step_bytes  # type: ignore[arg-type]

    @property
    def predicted(self) -> Prediction | None:
        """timing.json's ``prediction`` (``time --predict``: a TPU slice's, from its compiler; not
        measured), None for a measured time."""
        return self.timing.prediction if self.timing is not None else None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def eval_losses(path: Path) -> tuple[float | None, float | None]:
    """``(eval/loss at step 0, the last eval/loss)`` of a metrics.jsonl (None where there is none)."""
    if not path.is_file():
        return None, None
    rows = [r for r in read_metrics(path) if "eval/loss" in r]
    start = [r["eval/loss"] for r in rows if r.get("step") == 0]
    return (_finite(start[0]) if start else None), (_finite(rows[-1]["eval/loss"]) if rows else None)


def _per_sample(timing: TimingRecord | None, field: str) -> tuple[float, ...]:
    """A timing.json list of end-to-end seconds divided by its batch (empty when it has none)."""
    seconds = getattr(timing, field) if timing is not None else None
    values = [_finite(t) for t in seconds or ()]
    return () if None in values else tuple(v / timing.batch for v in values)  # type: ignore[operator, union-attr]


FLOOR_NOTE = (
    "Read-once floor: the same roofline with each program's bytes what it must read or write once (the "
    "weights, the cache), a lower bound where the prediction's byte count (XLA's over every op) is an "
    "upper one."
)  # the captions of the parts that show ``TimingRecord.read_once_floor``


REDO = "rerun the sweep, which redoes that run"


def _results(path: Path) -> dict[str, Any]:
    """A done evaluate run's results.json; a missing or unreadable one is a ValueError naming it
    (``sweep`` redoes such a run)."""
    found = _json(path)
    if not isinstance(found, dict):
        why = "is missing" if not path.exists() else "cannot be read as a JSON object"
        raise ValueError(f"{path} {why}, though its run is done: {REDO}")
    return found


def read_run(root: Path, run: Run) -> Record:
    """A run's record: its status, and a done run's numbers (an evaluate run's results.json and a
    time run's timing.json checked: ValueError naming the file, and the field)."""
    d = root / run.name
    info = _json(d / "run.json")
    if info is None:
        return Record(run, "not run")
    status = str(info.get("status", "unknown"))
    if status != "done":
        return Record(run, status)
    results = _results(d / "results.json") if run.stage == "evaluate" else {}
    timing = timing_lib.read(d / TIMING_FILE)
    if timing is None and run.stage == "time":
        raise ValueError(f"{d / TIMING_FILE} is missing, though its run is done: {REDO}")
    start, last = eval_losses(d / "metrics.jsonl")
    return Record(
        run,
        status,
        score=_finite(results.get("primary")),
        dev_loss=_finite(results.get("loss")),
        loss=last,
        start_loss=start,
        timing=timing,
    )


def collect(sweep: Sweep, root: str | Path) -> list[Record]:
    """One record per run of the sweep; ValueError when none of them has a run directory."""
    root = Path(root)
    if not any((root / r.name / "run.json").is_file() for r in sweep.runs):
        raise ValueError(
            f"--root {root} holds no run directory of sweep {sweep.name} (no {root}/<run name>/run.json "
            f"for any of its {len(sweep.runs)} runs): run the sweep first "
            f"(python -m gqa_jax sweep <sweep file> --root {root})"
        )
    return [read_run(root, r) for r in sweep.runs]


def in_part(run: Run, part: str, exclude: Sequence[str] = ()) -> bool:
    """A run tagged ``figure`` (a part or a list of parts) belongs to those only; else to any
    part whose selection it passes, less runs tagged with a key of ``exclude``."""
    figure = run.tags.get("figure")
    if figure is not None:
        return part in ([figure] if isinstance(figure, str) else list(figure))
    return not any(k in run.tags for k in exclude)


def select(
    stage: str | Sequence[str], *tags: str, part: str = "", exclude: Sequence[str] = ()
) -> Callable[[Run], bool]:
    """Runs of ``stage`` (one or several) that have every tag of ``tags`` and are in ``part``."""
    stages = (stage,) if isinstance(stage, str) else tuple(stage)
    return lambda r: r.stage in stages and all(t in r.tags for t in tags) and in_part(r, part, exclude)


def group(
    records: Sequence[Record], pick: Callable[[Run], bool], key: Callable[[Run], Any]
) -> dict[Any, list[Record]]:
    """The picked runs' records by ``key``, keys and records in the sweep's order."""
    groups: dict[Any, list[Record]] = {}
    for rec in records:
        if pick(rec.run):
            groups.setdefault(key(rec.run), []).append(rec)
    return groups


def gather(
    records: Sequence[Record], pick: Callable[[Run], bool], key: Callable[[Run], Any], value: str
) -> dict[Any, Stat]:
    """Cells: the picked runs grouped by ``key``, each a Stat of their ``value`` attribute over
    seeds (``tags["seed"]``, else the run's place in its cell); keys in the sweep's order."""
    out = {}
    for k, recs in group(records, pick, key).items():
        values = {}
        for i, rec in enumerate(recs):
            v = getattr(rec, value) if rec.status == "done" else None
            if v is not None:
                values[rec.run.tags.get("seed", i)] = v
        out[k] = stat(values, len(recs))
    return out


def gather_times(
    records: Sequence[Record], pick: Callable[[Run], bool], key: Callable[[Run], Any], value: str = "times"
) -> dict[Any, Stat]:
    """Time cells: the picked runs grouped by ``key``, each a ``Stat`` over every timing repeat of
    its done runs (``value``: ``times``, ``prefill_times``, ``steps_times`` or ``floor_times``, seconds
    per sample): ``mean`` the median, ``std`` their sample std, ``n`` the repeats, ``seeds`` (run,
    repeat) -> time. A run whose timing.json has no repeats (an older one) counts its ``time`` as one
    repeat; no other measure is made up where its record has none."""
    out = {}
    for k, recs in group(records, pick, key).items():
        values: dict[Any, float] = {}
        for i, rec in enumerate(recs):
            if rec.status != "done":
                continue
            repeats = getattr(rec, value) or (
                (rec.time,) if value == "times" and rec.time is not None else ()
            )
            values.update({(i, j): t for j, t in enumerate(repeats)})
        done = sum(r.status == "done" for r in recs)
        out[k] = _repeats_stat(values, len(recs), done)
    return out


def _repeats_stat(values: Mapping[Any, float], runs: int, done: int) -> Stat:
    """A time cell (:func:`gather_times`): the median and sample std of ``values``; ``expected``
    scales ``n`` by ``runs / done`` (the repeats its runs not done would add)."""
    xs = list(values.values())
    if not xs:
        return Stat(None, expected=runs)
    std = statistics.stdev(xs) if len(xs) > 1 else None
    expected = round(len(xs) * runs / max(done, 1))
    return Stat(statistics.median(xs), std, len(xs), expected, dict(values))


def unique(items: Any) -> list[Any]:
    """``items`` without repeats, in their order."""
    return list(dict.fromkeys(items))


def task_columns(schema: Mapping[str, Any], found: Sequence[str]) -> list[tuple[str, str]]:
    """(task, column label): the schema's ``tasks``, in its order, then tasks only the runs have."""
    tasks = [(t[0], t[1]) for t in schema.get("tasks", [])]
    return tasks + [(t, t) for t in unique(found) if t not in dict(tasks)]


def predicted_on(records: Sequence[Record]) -> str | None:
    """The TPU slice the done time runs' times were predicted for, in words (``time --predict``),
    None when every one was measured."""
    for rec in records:
        p = rec.predicted if rec.status == "done" else None
        if p is not None:
            return f"TPU {p.topology} ({p.chips} x {p.chip['device_kind']})"
    return None


def decodes(records: Sequence[Record]) -> str:
    """The decodes the done time runs ran other than ours (timing.json's ``decode``: the paper's or
    some of its switches), in words for a caption; empty when every one ran ours."""
    names = unique(r.timing.decode for r in records if r.status == "done" and r.timing and r.timing.decode)
    if not names:
        return ""
    listed = ", ".join(names)
    return f"; UNDER THE PAPER'S DECODE ({listed}: T5X's, an instrument for its timings, docs/decoding.md)"


def time_source(records: Sequence[Record]) -> str:
    """What the report's times are, for a caption: measured repeats on a machine, or predictions,
    and the decode where it is not ours."""
    return _source(records) + decodes(records)


def _source(records: Sequence[Record]) -> str:
    slice_ = predicted_on(records)
    measured = any(r.status == "done" and r.timing is not None and not r.predicted for r in records)
    if slice_ is None:
        return (
            "the median of a time run's timing repeats (timing.json's times_s / batch, compile excluded; "
            f"± their sample std, n=repeats) on {machine(records)}"
        )
    text = (
        f"PREDICTED for {slice_}, not measured (time --predict): seconds per sample per chip, the "
        "roofline max(flops / peak, bytes / bandwidth) of the TPU compiler's cost analysis of the "
        "prefill plus output length x one decode step, on the mesh and batch the prediction chose "
        "(timing.json's prediction; docs/experiments.md says what a roofline leaves out)"
    )
    return text + (f"; some times measured on {machine(records)}: do not compare the two" if measured else "")


def machine(records: Sequence[Record]) -> str:
    """The first measured timing.json's machine, in words."""
    for rec in records:
        m = rec.machine if not rec.predicted else None
        if m:
            devices = m.get("devices") or ["?"]
            return f"{m.get('backend', '?')}, {m.get('device_count', len(devices))} x {devices[0]}"
    return "unknown (no timing.json)"
