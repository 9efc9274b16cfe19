"""The paper's claims, each tested on the mini's numbers (``report.compute``) with a verdict.

Rule (:data:`RULE`): for "A better than B" the difference d (positive when the claim holds) is
compared with the seeds' spread, noise = sqrt(std_A^2 + std_B^2) (the sample std over seeds of
each side; 0 with one seed): d > noise is "reproduced", |d| <= noise "within noise", d < -noise
"not reproduced". For "A at least as good as B" (>=), d >= 0 is already "reproduced". A chain
(A < B < C) takes the worst of its pairs; any missing number makes the verdict "missing".
Stability compares the mean over tasks of each model's per-task std over seeds, with the noise
of a std estimate, sqrt((s_A^2 + s_B^2) / (2 (n - 1))), n the fewest seeds of a cell.

Numbers are duck-typed: anything with ``mean`` (None: missing), ``std`` and ``n`` attributes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

REPRODUCED, NOT_REPRODUCED, WITHIN_NOISE, MISSING = "reproduced", "not reproduced", "within noise", "missing"
RULE = (
    'Verdict rule: for "A better than B", d is the difference in the claim\'s direction and noise = '
    "sqrt(std_A² + std_B²) over seeds (0 with one seed): d > noise → reproduced, |d| ≤ noise → within "
    'noise, d < −noise → not reproduced; for "A ≥ B" any d ≥ 0 is reproduced. A chain takes the worst '
    "of its pairs; any missing number → missing. Stability: the mean over tasks of each model's std over "
    "seeds, noise = sqrt((s_A² + s_B²) / (2 (n − 1)))."
)
KINDS = ("MHA", "GQA", "MQA")


@dataclasses.dataclass(frozen=True)
class Claim:
    claim: str
    evidence: str
    verdict: str


def verdict(d: float, noise: float, *, strict: bool = True) -> str:
    """``d`` > 0 when the claim holds; see the module docstring."""
    if d > noise or (not strict and d >= 0):
        return REPRODUCED
    return WITHIN_NOISE if d >= -noise else NOT_REPRODUCED


def _missing(s: Any) -> bool:
    return s is None or s.mean is None


def compare(a: Any, b: Any, *, higher: bool, strict: bool = True) -> str:
    """ "``a`` better than ``b``" (strict) or "at least as good" (higher or lower is better)."""
    if _missing(a) or _missing(b):
        return MISSING
    d = a.mean - b.mean if higher else b.mean - a.mean
    return verdict(d, math.hypot(a.std or 0.0, b.std or 0.0), strict=strict)


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


def show(name: Any, s: Any, unit: str = "") -> str:
    if _missing(s):
        return f"{name} missing"
    spread = f" ± {s.std:.2g}" if s.std is not None else ""
    return f"{name} {s.mean:.4g}{spread}{unit}" + (f" (n={s.n})" if s.std is not None else "")


def _three(models: Sequence[str]) -> tuple[str | None, str | None, str | None]:
    gqa = pick(models, "GQA")
    return pick(models, "MQA"), gqa, pick(models, "MHA", like=gqa)


def _chain(name: str, labels: Sequence[Any], stats: Sequence[Any], unit: str, **how: Any) -> Claim:
    """ "stats[0] better than stats[1] better than ..." with the pairs' worst verdict."""
    if any(label is None for label in labels):
        return Claim(name, "no run of one of the models in this sweep", MISSING)
    pairs = [compare(a, b, **how) for a, b in zip(stats, stats[1:], strict=False)]
    return Claim(name, ", ".join(show(n, s, unit) for n, s in zip(labels, stats, strict=True)), worst(pairs))


def _on_proxy(data: Mapping[str, Any] | None) -> str:
    return f"; on the proxy, {data['proxy']} (lower is better)" if data and data.get("proxy") else ""


def decode_time(table: Mapping[str, Any] | None) -> Claim:
    name = "decode time MQA < GQA < MHA (the time runs)"
    rows = {r["model"]: r for r in (table or {}).get("rows", [])}
    labels = _three(list(rows))
    stats = [rows[m]["time"] if m else None for m in labels]
    return _chain(name, labels, stats, " s", higher=False)


def conversion(fig4: Mapping[str, Any] | None) -> Claim:
    name = "conversion Mean > First > Random (Fig. 4 data)" + _on_proxy(fig4)
    if not fig4:
        return Claim(name, "no Fig. 4 data in this sweep", MISSING)
    methods = ("mean", "first", "random")
    stats = [fig4["bars"][m][-1] if m in fig4["bars"] else None for m in methods]  # [-1]: over the tasks
    labels = [m if m in fig4["bars"] else None for m in methods]
    return _chain(name, labels, stats, "", higher=not fig4.get("lower_is_better"))


def alpha_zero(fig5: Mapping[str, Any] | None) -> Claim:
    name = "at alpha 0, GQA is closer to MHA than MQA is (Fig. 5 data)" + _on_proxy(fig5)
    if not fig5 or not any(a == 0 for a in fig5["alphas"]):
        return Claim(name, "no alpha 0 data in this sweep", MISSING)
    i = [a == 0 for a in fig5["alphas"]].index(True)
    ref_name, ref = fig5["reference"]
    mqa, gqa = pick(list(fig5["lines"]), "MQA"), pick(list(fig5["lines"]), "GQA")
    g, m = (fig5["lines"][x][i] if x else None for x in (gqa, mqa))
    evidence = ", ".join(show(n, s) for n, s in ((gqa, g), (mqa, m), (ref_name, ref)))
    if _missing(ref) or _missing(g) or _missing(m) or None in (gqa, mqa):
        return Claim(name, evidence, MISSING)
    gap_g, gap_m = abs(g.mean - ref.mean), abs(m.mean - ref.mean)
    evidence += f"; gap to {ref_name}: {gqa} {gap_g:.4g}, {mqa} {gap_m:.4g}"
    return Claim(name, evidence, verdict(gap_m - gap_g, math.hypot(g.std or 0.0, m.std or 0.0)))


def quality(table: Mapping[str, Any] | None) -> Claim:
    name = "quality MHA ≥ GQA ≥ MQA after uptraining (Table 1, plain mean)"
    rows = {r["model"]: r for r in (table or {}).get("rows", [])}
    mqa, gqa, mha = _three(list(rows))
    labels = (mha, gqa, mqa)
    stats = [rows[m]["plain_mean"] if m else None for m in labels]
    return _chain(name, labels, stats, "", higher=True, strict=False)


def stability(table: Mapping[str, Any] | None) -> Claim:
    name = "MQA less stable than GQA: more spread over seeds (Table 1 data)"
    rows = {r["model"]: r for r in (table or {}).get("rows", [])}
    mqa, gqa, _ = _three(list(rows))
    if mqa is None or gqa is None:
        return Claim(name, "no MQA or GQA row in this sweep", MISSING)
    spreads, fewest = {}, []
    for m in (mqa, gqa):
        cells = list(rows[m]["scores"].values())
        if not cells or any(_missing(c) or c.std is None for c in cells):
            return Claim(name, f"{m}: needs every task scored with at least 2 seeds", MISSING)
        spreads[m] = sum(c.std for c in cells) / len(cells)
        fewest.append(min(c.n for c in cells))
    noise = math.sqrt((spreads[mqa] ** 2 + spreads[gqa] ** 2) / (2 * (min(fewest) - 1)))
    evidence = (
        f"mean over tasks of the std over seeds: {mqa} {spreads[mqa]:.3g}, {gqa} {spreads[gqa]:.3g} "
        f"(noise {noise:.2g}, n ≥ {min(fewest)})"
    )
    return Claim(name, evidence, verdict(spreads[mqa] - spreads[gqa], noise))


def claims(table: Mapping[str, Any] | None, figures: Mapping[str, Any]) -> list[Claim]:
    """The five claims the mini tests, in the paper's order of argument."""
    return [
        decode_time(table),
        conversion(figures.get("fig4")),
        alpha_zero(figures.get("fig5")),
        quality(table),
        stability(table),
    ]
