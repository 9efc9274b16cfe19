"""The bytes model beside the measured times, and the time claims' sanity gate.

A decoder step of T5 reads its weights and the whole KV cache (timing.json's ``step_bytes``:
``bench decode``'s floor's bytes at the time cell's batch and lengths); where reading them is what
a step costs, a model's decoder-steps time is proportional to those bytes. So, for each time cell
beside its reference (MHA):

- predicted ratio = the model's bytes per sample / the reference's (the decoder's steps:
  output_len steps of ``step_bytes`` over the batch, ``Record.sample_bytes``);
- measured ratio = its time / the reference's, on the decoder steps alone and on the whole decode;
- realised fraction = (1 - measured) / (1 - predicted) on the decoder steps: 1 when the time fell
  as far as the bytes, 0 when it did not fall at all (none where the bytes predict no saving);
- beside it, the same against the step's roofline (timing.json's ``step_roofline``: each op's
  bytes or FLOPs at the machine's measured rates, the slower, summed), which knows that a step
  also computes; and the rate the decoder's steps read at, alone and as a share of what the
  machine reads from a buffer of the step's size.

The gate (:func:`gate`): a time claim "A < B < C" can be tested on a measure (the decoder steps or
the whole decode) only when, for each adjacent pair, the difference the bytes model predicts
exceeds the pair's spread on that measure (the verdict rule's noise, sqrt(std_A^2 + std_B^2) over
the timing repeats). The predicted time of a model is the reference's measured decoder-steps time x
its bytes / the reference's. Without a bytes model or a measured reference (a timing.json from
before they were recorded, a prediction) the gate is missing and gates nothing.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gqa_jax.experiments import claims as rule
from gqa_jax.experiments.claims import MISSING, NOT_IN_SWEEP, REPRODUCED, WITHIN_NOISE, Claim
from gqa_jax.experiments.parts import md
from gqa_jax.experiments.parts.records import Record, gather
from gqa_jax.experiments.stats import Stat
from gqa_jax.experiments.sweep import Run

MEASURES = {"steps": "the decoder's steps alone", "whole": "the whole decode"}
HEADER = [
    "whole decode (s)",
    "decoder steps (s)",
    "a step reads (MB)",
    "cache's share",
    "GB/s (share of the machine's)",
    "bytes model: ratio to {ref}",
    "roofline: ratio to {ref}",
    "measured: steps / {ref}",
    "measured: whole / {ref}",
    "realised: bytes",
    "realised: roofline",
]
NOTE = (
    "The bytes model: a decoder step reads the weights it uses and the whole KV cache at the cell's batch "
    "and lengths (timing.json's step_bytes, the bytes of `bench decode`'s floor); with its time "
    "proportional to them, a model's decoder steps take its bytes / {ref}'s of {ref}'s time. Decoder "
    "steps: the step loop timed alone on a prefilled state (timing.json's steps_times_s), not the whole "
    "time less the prefill's. GB/s: the bytes the steps read over their time, and its share of the rate "
    "this machine reads a buffer of a step's size (measured in the run). The roofline: each op of a step, "
    "its bytes at that rate or its FLOPs at the measured matmul rate, the slower, summed. Realised: "
    "(1 − measured) / (1 − predicted) on the decoder steps, the fraction of the saving the bytes model "
    "(or the roofline) predicts that the run shows."
)


@dataclasses.dataclass(frozen=True)
class Reads:
    """The bytes model of a time cell, means over its runs (None: no bytes model recorded)."""

    step: float | None = None  # bytes one decoder step reads at the cell's batch
    sample: float | None = None  # bytes the decoder's steps read per sample
    cache_share: float | None = None  # the cache's share of ``step``
    roofline: float | None = None  # the decoder's steps' roofline per sample (seconds)
    machine_gb_s: float | None = None  # the machine's read rate for a buffer of a step's size


@dataclasses.dataclass(frozen=True)
class Timed:
    """A time cell: its label, the whole decode's and the decoder steps' times, its bytes."""

    label: str
    whole: Stat
    steps: Stat
    reads: Reads = Reads()


def reads_of(
    records: Sequence[Record], pick: Callable[[Run], bool], key: Callable[[Run], Any]
) -> dict[Any, Reads]:
    """Cells as ``records.gather`` makes them, each the means of its runs' bytes model."""
    names = {"step": "step_bytes", "sample": "sample_bytes", "cache_share": "cache_share"}
    names |= {"roofline": "roofline_sample", "machine_gb_s": "read_gb_s"}
    fields = {f: gather(records, pick, key, attribute) for f, attribute in names.items()}
    return {k: Reads(**{f: cells[k].mean for f, cells in fields.items()}) for k in fields["step"]}


def mean_reads(cells: Sequence[Reads]) -> Reads:
    """The mean of several cells' bytes (a Table 1 row over its cells); None where one has none."""

    def mean(field: str) -> float | None:
        values = [getattr(c, field) for c in cells]
        return None if not values or None in values else statistics.fmean(values)

    return Reads(*(mean(f.name) for f in dataclasses.fields(Reads)))


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b else a / b


@dataclasses.dataclass(frozen=True)
class Versus:
    """A time cell against its reference: the ratios the bytes model predicts and the run measured."""

    predicted: float | None
    steps: float | None
    whole: float | None
    roofline: float | None = None  # the roofline's ratio

    def _realised(self, predicted: float | None) -> float | None:
        if predicted is None or self.steps is None or predicted >= 1:
            return None
        return (1 - self.steps) / (1 - predicted)

    @property
    def realised(self) -> float | None:
        return self._realised(self.predicted)

    @property
    def realised_roofline(self) -> float | None:
        return self._realised(self.roofline)


def versus(cell: Timed, ref: Timed) -> Versus:
    return Versus(
        _ratio(cell.reads.sample, ref.reads.sample),
        _ratio(cell.steps.mean, ref.steps.mean),
        _ratio(cell.whole.mean, ref.whole.mean),
        _ratio(cell.reads.roofline, ref.reads.roofline),
    )


def achieved_gb_s(cell: Timed) -> float | None:
    """The rate the cell's decoder steps read at: the bytes model's bytes per sample over the
    measured steps time per sample."""
    steps = cell.steps.mean
    return None if cell.reads.sample is None or not steps else cell.reads.sample / steps / 1e9


def _num(x: float | None, text: str = "{:.2f}") -> str:
    return "—" if x is None else text.format(x)


def row(cell: Timed, ref: Timed | None) -> list[str]:
    """A table row (after its label) in :data:`HEADER`'s order."""
    v = versus(cell, ref) if ref is not None else Versus(None, None, None)
    reads, gb_s = cell.reads, achieved_gb_s(cell)
    share = None if gb_s is None or not reads.machine_gb_s else gb_s / reads.machine_gb_s
    return [
        md.fmt(cell.whole, "time"),
        md.fmt(cell.steps, "time"),
        _num(None if reads.step is None else reads.step / 1e6, "{:.1f}"),
        _num(reads.cache_share, "{:.0%}"),
        _num(gb_s, "{:.1f}") + ("" if share is None else f" ({share:.0%})"),
        _num(v.predicted),
        _num(v.roofline),
        _num(v.steps),
        _num(v.whole),
        _num(v.realised, "{:.0%}"),
        _num(v.realised_roofline, "{:.0%}"),
    ]


def table(first: str, cells: Sequence[tuple[Timed, Timed | None]], title: str, ref: str = "MHA") -> list[str]:
    """The bytes model's table: a row per (cell, its reference), ``title`` and the note above it."""
    header = [first, *(h.format(ref=ref) for h in HEADER)]
    rows = [[c.label, *row(c, r)] for c, r in cells]
    return [f"{title} {NOTE.format(ref=ref)}", "", *md.table(header, rows)]


def gate(measure: str, labels: Sequence[str | None], cells: Mapping[str, Timed]) -> Claim:
    """Whether the bytes model's predicted differences between ``labels`` (a chain, fastest first,
    its reference last) exceed their timing spread on ``measure`` (module docstring)."""
    name = f"the bytes model predicts differences beyond the timing spread ({MEASURES[measure]})"
    if any(label is None for label in labels):
        return Claim(name, "no run of one of the models in this sweep", NOT_IN_SWEEP)
    timed = [cells.get(str(label)) for label in labels]
    if any(t is None or t.whole.missing for t in timed):
        return Claim(name, "a time run not done", MISSING)
    timed_: list[Timed] = timed  # type: ignore[assignment]
    ref = timed_[-1]
    if any(t.reads.sample is None for t in timed_):
        return Claim(name, "no bytes model in timing.json (timed before it was recorded)", MISSING)
    unmeasured = [t.label for t in (timed_ if measure == "steps" else [ref]) if t.steps.missing]
    if unmeasured:
        why = f"no measured decoder steps of {', '.join(unmeasured)} (timed before they were recorded)"
        return Claim(name, why, MISSING)
    predicted = [ref.steps.mean * t.reads.sample / ref.reads.sample for t in timed_]  # type: ignore[operator]
    holds, noises, pairs = [], [], []
    for i in range(len(timed_) - 1):
        a, b = getattr(timed_[i], measure), getattr(timed_[i + 1], measure)
        d, noise = predicted[i + 1] - predicted[i], rule.resolvable(a, b)
        holds.append(d > (noise or 0.0))
        noises.append(noise)
        spread = "no spread" if noise is None else f"spread {noise:.3g} s"
        pairs.append(f"{timed_[i].label}–{timed_[i + 1].label} {d:.3g} s ({spread})")
    evidence = (
        f"predicted decoder steps ({ref.label}'s measured × bytes / its bytes): "
        + ", ".join(f"{t.label} {p:.3g} s" for t, p in zip(timed_, predicted, strict=True))
        + f"; predicted differences against the spread of {MEASURES[measure]}: "
        + ", ".join(pairs)
    )
    return Claim(name, evidence, REPRODUCED if all(holds) else WITHIN_NOISE, rule.coarsest(noises))
