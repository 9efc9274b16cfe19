"""How a claim of the report is judged on our numbers: its verdict, from the difference between
two cells and the seeds' spread (``parts.paper_claims`` states the paper's claims with it).

Rule (:data:`RULE`): for "A better than B" the difference d (positive when the claim holds) is
compared with the seeds' spread, noise = sqrt(std_A^2 + std_B^2) (the sample std over seeds of
each side; 0 with one seed): d > noise is "reproduced", |d| <= noise "within noise", d < -noise
"not reproduced". For "A at least as good as B" (>=), d >= 0 is already "reproduced". A chain
(A < B < C) takes the worst of its pairs; any missing number makes the verdict "missing".
Stability compares the mean over tasks of each model's per-task std over seeds, with the noise
of a std estimate, sqrt((s_A^2 + s_B^2) / (2 (n - 1))), n the fewest seeds of a cell.

A claim about quality never takes a noise below the spread of the same number across machines
(:data:`MACHINE`: the runs are deterministic on one machine, but XLA:CPU's code generation follows
the CPU, and a loss or a decoded score moves a little from one to another:
docs/results/determinism.md): d must exceed it too, one seed or many. Time claims have no floor
(their repeats' spread is measured on the machine that timed them).

Each claim also states the smallest difference its numbers could resolve (:func:`resolvable`: the
noise above; none where a side has one seed or one timing repeat and no floor applies). A claim
that can not be tested at a setting (its sanity claims failed, ``parts.sanity_claims``) is
:data:`NOT_TESTABLE`.

Numbers are duck-typed: anything with ``mean`` (None: missing), ``std`` and ``n`` attributes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

REPRODUCED, NOT_REPRODUCED, WITHIN_NOISE, MISSING = "reproduced", "not reproduced", "within noise", "missing"
NOT_TESTABLE = "not testable at this setting"
NOT_IN_SWEEP = "not in this sweep"  # a claim the sweep has no runs for (missing: runs not done)
RULE = (
    'Verdict rule: for "A better than B", d is the difference in the claim\'s direction and noise = '
    "sqrt(std_A² + std_B²) over seeds (0 with one seed), for a score or a loss never below its spread "
    "across machines (0.5 points for a decoded score, 1e-4 for a loss; time: none): d > noise → "
    'reproduced, |d| ≤ noise → within noise, d < −noise → not reproduced; for "A ≥ B" any d ≥ 0 is '
    "reproduced. A chain takes the worst of its pairs; any missing number → missing. Stability: the mean "
    "over tasks of each model's std over seeds, noise = sqrt((s_A² + s_B²) / (2 (n − 1)))."
)
# The most one number moves between machines, with margin over the measured spread of a loss (nats)
# and of a decoded score (points) (docs/results/determinism.md). A time has its own spread.
MACHINE = {"score": 0.5, "loss": 1e-4}
KINDS = ("MHA", "GQA", "MQA")


@dataclasses.dataclass(frozen=True)
class Claim:
    claim: str
    evidence: str
    verdict: str
    resolves: float | None = None  # the smallest difference its numbers resolve; None: no spread

    def resolution(self) -> str:
        """The report's words for ``resolves``."""
        if self.verdict in (MISSING, NOT_IN_SWEEP):
            return "—"
        return "no spread (one seed or repeat)" if self.resolves is None else f"{self.resolves:.3g}"


def resolvable(a: Any, b: Any, floor: float = 0.0) -> float | None:
    """The smallest difference between ``a`` and ``b`` that the verdict rule resolves (their noise,
    at least ``floor``: :data:`MACHINE`'s), None when either is missing, or has no spread (one seed,
    one repeat) and there is no floor."""
    if missing(a) or missing(b):
        return None
    if a.std is None or b.std is None:
        return floor or None
    return max(math.hypot(a.std, b.std), floor)


def coarsest(values: Sequence[float | None]) -> float | None:
    """The largest of several pairs' resolvable differences (None when any pair has none)."""
    return None if not values or None in values else max(values)  # type: ignore[type-var]


def verdict(d: float, noise: float, *, strict: bool = True) -> str:
    """``d`` > 0 when the claim holds; see the module docstring."""
    if d > noise or (not strict and d >= 0):
        return REPRODUCED
    return WITHIN_NOISE if d >= -noise else NOT_REPRODUCED


def missing(s: Any) -> bool:
    return s is None or s.mean is None


def compare(a: Any, b: Any, *, higher: bool, strict: bool = True, floor: float = 0.0) -> str:
    """ "``a`` better than ``b``" (strict) or "at least as good" (higher or lower is better), the
    noise at least ``floor``."""
    if missing(a) or missing(b):
        return MISSING
    d = a.mean - b.mean if higher else b.mean - a.mean
    return verdict(d, max(math.hypot(a.std or 0.0, b.std or 0.0), floor), strict=strict)


def worst(verdicts: Sequence[str]) -> str:
    for v in (MISSING, NOT_REPRODUCED, WITHIN_NOISE):
        if v in verdicts:
            return v
    return REPRODUCED


def kind(model: str | None) -> str:
    """ "MHA" / "GQA" / "MQA" from a model name ("GQA-8-XXL" -> "GQA"), else ""."""
    head = str(model or "").split("-")[0].upper()
    return head if head in KINDS else ""


def _size(model: str) -> str:
    rest = [p for p in model.split("-")[1:] if not p.isdigit()]
    return rest[-1].lower() if rest else ""


def pick(models: Sequence[str], want: str, like: str | None = None) -> str | None:
    """The first model of kind ``want``; among several, the one of ``like``'s size (MHA-XXL for
    GQA-8-XXL, not MHA-Large)."""
    found = [m for m in models if kind(m) == want]
    if like is not None and len(found) > 1:
        found = [m for m in found if _size(m) == _size(like)] or found
    return found[0] if found else None


def three(models: Sequence[str]) -> tuple[str | None, str | None, str | None]:
    """(MQA, GQA, MHA) among ``models``, the MHA of the GQA model's size: the paper's chain."""
    gqa = pick(models, "GQA")
    return pick(models, "MQA"), gqa, pick(models, "MHA", like=gqa)


def show(name: Any, s: Any, unit: str = "") -> str:
    if missing(s):
        return f"{name} missing"
    spread = f" ± {s.std:.2g}" if s.std is not None else ""
    return f"{name} {s.mean:.4g}{spread}{unit}" + (f" (n={s.n})" if s.std is not None else "")


def chain(name: str, labels: Sequence[Any], stats: Sequence[Any], unit: str, **how: Any) -> Claim:
    """ "stats[0] better than stats[1] better than ..." (``compare``'s ``how``, its ``floor`` too)
    with the pairs' worst verdict; a label None: that model has no run in the sweep."""
    if any(label is None for label in labels):
        return Claim(name, "no run of one of the models in this sweep", MISSING)
    pairs = [compare(a, b, **how) for a, b in zip(stats, stats[1:], strict=False)]
    floor = how.get("floor", 0.0)
    resolves = coarsest([resolvable(a, b, floor) for a, b in zip(stats, stats[1:], strict=False)])
    evidence = ", ".join(show(n, s, unit) for n, s in zip(labels, stats, strict=True))
    return Claim(name, evidence, worst(pairs), resolves)
