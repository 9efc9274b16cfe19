"""A report's cells: a number over seeds (:class:`Stat`: mean, sample standard deviation, the
value of each seed), a plain mean of several cells, and Fig. 4's ranking of methods against mean
pooling with the seeds' spread."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Stat:
    """Ours for one cell: mean and sample std over ``n`` of the ``expected`` runs (seeds), and the
    value of each seed (what a mean over tasks combines); ``mean is None``: missing."""

    mean: float | None
    std: float | None = None
    n: int = 0
    expected: int = 0
    seeds: Mapping[Any, float] = dataclasses.field(default_factory=dict)

    @property
    def missing(self) -> bool:
        return self.mean is None


# Two means this close are the same number (float32 rounding; docs/experiments.md, Fig. 4).
EQUAL_RTOL = 1e-6


def stat(values: Mapping[Any, float], expected: int) -> Stat:
    """Mean and sample std (None under two values) of ``values`` (seed -> value)."""
    xs = list(values.values())
    if not xs:
        return Stat(None, expected=expected)
    std = statistics.stdev(xs) if len(xs) > 1 else None
    return Stat(statistics.fmean(xs), std, len(xs), expected, dict(values))


def mean_of(stats: Sequence[Stat]) -> Stat:
    """The plain mean of several cells (tasks): missing when any is; its spread is the std of the
    per-seed means over the seeds every cell has."""
    expected = max((s.expected for s in stats), default=0)
    if not stats or any(s.missing for s in stats):
        return Stat(None, expected=expected)
    common = set.intersection(*(set(s.seeds) for s in stats))
    per_seed = {k: statistics.fmean(s.seeds[k] for s in stats) for k in sorted(common, key=str)}
    std = statistics.stdev(per_seed.values()) if len(per_seed) > 1 else None
    n = len(common) if common else min(s.n for s in stats)
    return Stat(statistics.fmean(s.mean for s in stats), std, n, expected, per_seed)


def rank_methods(
    bars: Mapping[str, Sequence[Stat]],
    groups: Sequence[str],
    *,
    lower_is_better: bool,
    baseline: str = "mean",
) -> dict[str, list[tuple[str, Stat, str]]]:
    """Per column of Fig. 4 (``groups``' labels): the methods best first, each with its cell and its
    verdict against ``baseline`` (the paper's mean pooling): ``better`` / ``worse`` ``beyond the
    spread`` when the two means differ by more than the sum of their standard deviations over
    seeds, ``within the spread`` otherwise; ``no spread (n=1)`` qualifies a difference either side
    of which has one seed. Missing cells come last, as "missing"."""
    out = {}
    for i, label in enumerate(groups):
        cells = [(m, b[i]) for m, b in bars.items()]
        present = sorted(
            (c for c in cells if not c[1].missing), key=lambda c: c[1].mean * (1 if lower_is_better else -1)
        )
        base = bars.get(baseline, [Stat(None)] * len(groups))[i]
        ranked = []
        for m, st in present:
            ranked.append(
                (m, st, _versus(st, base, lower_is_better, baseline) if m != baseline else "baseline")
            )
        ranked += [(m, st, "missing") for m, st in cells if st.missing]
        out[label] = ranked
    return out


def _versus(st: Stat, base: Stat, lower_is_better: bool, baseline: str) -> str:
    if base.missing:
        return f"no {baseline} to compare with"
    diff = st.mean - base.mean
    if abs(diff) <= EQUAL_RTOL * max(abs(st.mean), abs(base.mean)):
        return "equal"
    side = "better" if (diff < 0) == lower_is_better else "worse"
    if st.n < 2 or base.n < 2:
        return f"{side} (one seed: no spread)"
    spread = (st.std or 0.0) + (base.std or 0.0)
    if spread == 0:
        return f"{side} (every seed the same: no spread)"
    return f"{side}, beyond the spread" if abs(diff) > spread else f"{side}, within the spread"
