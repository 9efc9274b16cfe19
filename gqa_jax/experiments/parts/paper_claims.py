"""The paper's claims, each tested on Table 1's, Fig. 4's and Fig. 5's results with a verdict
(the rule: ``experiments.claims``) and the smallest difference its numbers resolve. Models are
matched by name ("MHA...", "GQA...", "MQA..."). When a sanity claim failed (``parts.sanity_claims``,
computed before this part), every claim about quality is "not testable at this setting", the verdict
the rule alone would give kept in its numbers; the decode-time claim does not depend on training.
It is judged twice, on the decoder's steps alone (where the number of K/V heads acts) and on the
whole decode (Table 1's T_infer); each is "not testable at this setting" when its own time gate
failed (the bytes model predicts differences within the timing spread)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from gqa_jax.experiments import claims as rule
from gqa_jax.experiments.claims import MISSING, NOT_TESTABLE, Claim
from gqa_jax.experiments.parts import md, time_model
from gqa_jax.experiments.parts.base import Context, Part
from gqa_jax.experiments.parts.fig4 import Fig4
from gqa_jax.experiments.parts.fig5 import Fig5
from gqa_jax.experiments.parts.paper_decode import PaperDecode
from gqa_jax.experiments.parts.records import Record
from gqa_jax.experiments.parts.sanity_claims import Sanity
from gqa_jax.experiments.parts.table1 import Table1


@dataclasses.dataclass(frozen=True)
class PaperClaims:
    claims: tuple[Claim, ...]  # in the paper's order of argument
    gated_by: tuple[str, ...] = ()  # the failed sanity claims that made the quality claims untestable
    time_gated: tuple[str, ...] = ()  # the measures whose time gate failed (time_model.MEASURES' keys)


def _on_proxy(proxy: str | None) -> str:
    return f"; on the proxy, {proxy} (lower is better)" if proxy else ""


TIME_CLAIM = "decode time MQA < GQA < MHA (the time runs: {})"


def decode_time(table: Table1 | PaperDecode, measure: str = "whole", decode: str | None = None) -> Claim:
    """The claim on ``measure`` (``time_model.MEASURES``): the decoder steps alone or the whole decode;
    with ``decode``, on the runs under that decode of the paper's (``parts.paper_decode``)."""
    name = TIME_CLAIM.format(time_model.MEASURES[measure])
    if decode is not None:
        name += f", UNDER THE PAPER'S DECODE `{decode}` (an instrument)"
    rows = {r.model: r for r in (table.rows if decode is None else table.decodes[decode])}
    labels = rule.three(list(rows))
    stats = [getattr(rows[m], "steps" if measure == "steps" else "time") if m else None for m in labels]
    return rule.chain(name, labels, stats, " s", higher=False)


def conversion(fig4: Fig4) -> Claim:
    name = "conversion Mean > First > Random (Fig. 4 data)" + _on_proxy(fig4.proxy)
    methods = ("mean", "first", "random")
    stats = [fig4.bars[m][-1] if m in fig4.bars else None for m in methods]  # [-1]: over the tasks
    labels = [m if m in fig4.bars else None for m in methods]
    floor = rule.MACHINE["loss" if fig4.lower_is_better else "score"]
    return rule.chain(name, labels, stats, "", higher=not fig4.lower_is_better, floor=floor)


def alpha_zero(fig5: Fig5) -> Claim:
    name = "at alpha 0, GQA is closer to MHA than MQA is (Fig. 5 data)" + _on_proxy(fig5.proxy)
    if not any(a == 0 for a in fig5.alphas):
        return Claim(name, "no alpha 0 data in this sweep", MISSING)
    i = [a == 0 for a in fig5.alphas].index(True)
    ref_name, ref = fig5.reference, fig5.reference_value
    mqa, gqa = rule.pick(list(fig5.lines), "MQA"), rule.pick(list(fig5.lines), "GQA")
    g, m = (fig5.lines[x][i] if x else None for x in (gqa, mqa))
    evidence = ", ".join(rule.show(n, s) for n, s in ((gqa, g), (mqa, m), (ref_name, ref)))
    if rule.missing(ref) or rule.missing(g) or rule.missing(m) or None in (gqa, mqa):
        return Claim(name, evidence, MISSING)
    gap_g, gap_m = abs(g.mean - ref.mean), abs(m.mean - ref.mean)
    evidence += f"; gap to {ref_name}: {gqa} {gap_g:.4g}, {mqa} {gap_m:.4g}"
    floor = rule.MACHINE["loss" if fig5.lower_is_better else "score"]
    verdict = rule.verdict(gap_m - gap_g, max(math.hypot(g.std or 0.0, m.std or 0.0), floor))
    return Claim(name, evidence, verdict, rule.resolvable(g, m, floor))


def quality(table: Table1) -> Claim:
    name = "quality MHA ≥ GQA ≥ MQA after uptraining (Table 1, plain mean)"
    rows = {r.model: r for r in table.rows}
    mqa, gqa, mha = rule.three(list(rows))
    labels = (mha, gqa, mqa)
    stats = [rows[m].plain_mean if m else None for m in labels]
    return rule.chain(name, labels, stats, "", higher=True, strict=False, floor=rule.MACHINE["score"])


def quality_loss(table: Table1) -> Claim:
    name = "quality MHA ≥ GQA ≥ MQA after uptraining (Table 1, dev loss: lower is better)"
    rows = {r.model: r for r in table.rows}
    mqa, gqa, mha = rule.three(list(rows))
    labels = (mha, gqa, mqa)
    if any(m is not None and not rows[m].has_losses for m in labels):
        return Claim(name, "no dev loss in results.json (evaluated before it was recorded)", MISSING)
    stats = [rows[m].mean_loss if m else None for m in labels]
    return rule.chain(name, labels, stats, "", higher=False, strict=False, floor=rule.MACHINE["loss"])


def stability(table: Table1) -> Claim:
    name = "MQA less stable than GQA: more spread over seeds (Table 1 data)"
    rows = {r.model: r for r in table.rows}
    mqa, gqa, _ = rule.three(list(rows))
    if mqa is None or gqa is None:
        return Claim(name, "no MQA or GQA row in this sweep", MISSING)
    spreads, fewest = {}, []
    for m in (mqa, gqa):
        cells = list(rows[m].scores.values())
        if not cells or any(rule.missing(c) or c.std is None for c in cells):
            return Claim(name, f"{m}: needs every task scored with at least 2 seeds", MISSING)
        spreads[m] = sum(c.std for c in cells) / len(cells)
        fewest.append(min(c.n for c in cells))
    noise = math.sqrt((spreads[mqa] ** 2 + spreads[gqa] ** 2) / (2 * (min(fewest) - 1)))
    evidence = (
        f"mean over tasks of the std over seeds: {mqa} {spreads[mqa]:.3g}, {gqa} {spreads[gqa]:.3g} "
        f"(noise {noise:.2g}, n ≥ {min(fewest)})"
    )
    return Claim(name, evidence, rule.verdict(spreads[mqa] - spreads[gqa], noise), noise)


def untestable(claim: Claim) -> Claim:
    """``claim`` marked not testable, the rule's verdict kept in its numbers."""
    if claim.verdict == MISSING:
        return claim
    evidence = f"{claim.evidence}; by the rule alone: {claim.verdict}"
    return dataclasses.replace(claim, evidence=evidence, verdict=NOT_TESTABLE)


class PaperClaimsPart(Part[PaperClaims]):
    name = "claims"
    needs = ("table1", "fig4", "fig5")

    def compute(self, records: Sequence[Record], schema: Mapping[str, Any], context: Context) -> PaperClaims:
        table, fig4, fig5 = (context.results[n] for n in self.needs)
        sanity: Sanity | None = context.results.get("sanity")
        failed = tuple(c.claim for c in sanity.failed) if sanity is not None else ()
        gate = untestable if failed else (lambda c: c)
        timed, time_gated = [], []
        decoded: PaperDecode | None = context.results.get("paper_decode")  # Table 1 under the paper's decode
        for source, decode in [(table, None), *((decoded, d) for d in (decoded.decodes if decoded else ()))]:
            for measure in ("steps", "whole"):
                claim = decode_time(source, measure, decode)
                if sanity is not None and sanity.time_gate_failed(measure):
                    time_gated.append(measure)
                    claim = untestable(claim)
                timed.append(claim)
        quality_claims = (
            conversion(fig4),
            alpha_zero(fig5),
            quality(table),
            quality_loss(table),
            stability(table),
        )
        gated = tuple(dict.fromkeys(time_gated))
        return PaperClaims((*timed, *(gate(c) for c in quality_claims)), failed, gated)

    def markdown(self, result: PaperClaims, files: Mapping[str, str]) -> list[str]:
        rows = [[c.claim, c.evidence, c.resolution(), f"**{c.verdict}**"] for c in result.claims]
        gated = (
            [f"Not testable at this setting: the sanity claims that failed ({'; '.join(result.gated_by)}) "
             "say these runs cannot rank models, so no quality claim is judged; decode time is.", ""]
            if result.gated_by
            else []
        )  # fmt: skip
        if result.time_gated:
            measures = " and on ".join(time_model.MEASURES[m] for m in result.time_gated)
            gated += [
                f"Not testable at this setting: decode time on {measures}, where the bytes model predicts "
                "differences between the models within the timing spread (the time gates, above).",
                "",
            ]
        return [
            "## The paper's claims",
            "",
            rule.RULE,
            "",
            *gated,
            *md.table(["claim", "numbers", "resolves", "verdict"], rows),
        ]


PART = PaperClaimsPart()
