"""The sanity claims: orderings any setting that can test the paper must show, each with a verdict
by the paper's claims' rule (``experiments.claims``), checked before them. When one fails (not
reproduced, or within noise), ``parts.paper_claims`` marks the paper's quality claims "not testable
at this setting"; one missing (its runs not done) or not in this sweep (it has no runs for it)
gates nothing.

- the larger role beats the smaller after fine-tuning: the largest MHA model of Table 1 against the
  smallest (sizes by name: small < base < large < xl < xxl), on the plain mean of the task scores
  and on the mean dev loss;
- uptrained beats converted at step 0: each Fig. 5 line at every alpha > 0 against its alpha 0
  point (the converted model before a step);
- fine-tuned beats its step-0 score on every task: each Table 1 cell against the score of the same
  model before fine-tuning, its ``evaluate`` runs tagged ``start`` (this part takes them, so
  Table 1 does not).

And one gate per measure of the time claims (:attr:`Sanity.time_gates`, ``parts.time_model.gate``):
the bytes model predicts differences between MQA, GQA and MHA beyond the timing spread, on the
decoder's steps alone and on the whole decode. One that fails makes that measure's time claim "not
testable at this setting"; it gates nothing else, and no quality gate gates the time claims.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gqa_jax.experiments import claims as rule
from gqa_jax.experiments.claims import MISSING, NOT_IN_SWEEP, REPRODUCED, Claim
from gqa_jax.experiments.parts import md, time_model
from gqa_jax.experiments.parts.base import Context, Part
from gqa_jax.experiments.parts.fig5 import Fig5
from gqa_jax.experiments.parts.records import Record, gather, select
from gqa_jax.experiments.parts.table1 import Table1
from gqa_jax.experiments.stats import Stat

SIZES = ("small", "base", "large", "xl", "xxl")  # T5.1.1's, smallest first
START_TAG = "start"  # evaluate runs of a model before fine-tuning


def fails(claim: Claim) -> bool:
    """Every verdict but reproduced, missing and not in this sweep."""
    return claim.verdict not in (REPRODUCED, MISSING, NOT_IN_SWEEP)


@dataclasses.dataclass(frozen=True)
class Sanity:
    claims: tuple[Claim, ...]
    time_gates: Mapping[str, Claim] = dataclasses.field(default_factory=dict)  # measure -> its gate

    @property
    def failed(self) -> tuple[Claim, ...]:
        """The claims that fail (:func:`fails`): they gate the quality claims."""
        return tuple(c for c in self.claims if fails(c))

    def time_gate_failed(self, measure: str) -> Claim | None:
        """``measure``'s time gate when it fails, else None."""
        gate = self.time_gates.get(measure)
        return gate if gate is not None and fails(gate) else None


def time_gates(table: Table1) -> dict[str, Claim]:
    """The bytes model's gate of the time claim on each measure (``parts.time_model.gate``)."""
    cells = {r.model: r.timed for r in table.rows}
    labels = rule.three(list(cells))
    return {m: time_model.gate(m, labels, cells) for m in time_model.MEASURES}


def size_rank(model: str) -> int | None:
    """The place of a model name's size in :data:`SIZES` ("MHA-XXL" -> 4), None without one."""
    parts = [p.lower() for p in model.split("-")[1:]]
    found = [SIZES.index(p) for p in parts if p in SIZES]
    return found[-1] if found else None


def larger_beats_smaller(table: Table1) -> tuple[Claim, Claim]:
    """The largest MHA row against the smallest, on the plain mean and on the mean dev loss."""
    mha = [(size_rank(r.model), r) for r in table.rows if rule.kind(r.model) == "MHA"]
    sized = sorted(((rank, r) for rank, r in mha if rank is not None), key=lambda x: x[0])
    names = ("the larger role beats the smaller after fine-tuning (Table 1, plain mean)",
             "the larger role beats the smaller after fine-tuning (Table 1, dev loss)")  # fmt: skip
    if len({rank for rank, _ in sized}) < 2:
        why = "fewer than two MHA sizes in this sweep"
        return Claim(names[0], why, NOT_IN_SWEEP), Claim(names[1], why, NOT_IN_SWEEP)
    small, large = sized[0][1], sized[-1][1]
    labels = (large.model, small.model)
    floors = rule.MACHINE
    score = rule.chain(
        names[0], labels, (large.plain_mean, small.plain_mean), "", higher=True, floor=floors["score"]
    )
    if not (large.has_losses and small.has_losses):
        return score, Claim(
            names[1], "no dev loss in results.json (evaluated before it was recorded)", MISSING
        )
    losses = (large.mean_loss, small.mean_loss)
    return score, rule.chain(names[1], labels, losses, "", higher=False, floor=floors["loss"])


def uptrained_beats_converted(fig5: Fig5 | None) -> Claim:
    """Each Fig. 5 line: every alpha > 0 better than alpha 0 (lower is better on the proxy)."""
    name = "uptrained beats converted at step 0 (Fig. 5 data, every alpha > 0 against alpha 0)"
    if fig5 is None or 0 not in fig5.alphas:
        return Claim(name, "no Fig. 5 runs at alpha 0 in this sweep", NOT_IN_SWEEP)
    i0 = list(fig5.alphas).index(0)
    floor = rule.MACHINE["loss" if fig5.lower_is_better else "score"]
    verdicts, resolves, evidence = [], [], []
    for model, line in fig5.lines.items():
        start = line[i0]
        shown = [rule.show("α 0", start)]
        for a, point in zip(fig5.alphas, line, strict=True):
            if a == 0:
                continue
            verdicts.append(rule.compare(point, start, higher=not fig5.lower_is_better, floor=floor))
            resolves.append(rule.resolvable(point, start, floor))
            shown.append(rule.show(f"α {a:g}", point))
        evidence.append(f"{model}: " + ", ".join(shown))
    if not verdicts:
        return Claim(name, "no Fig. 5 line with an alpha > 0", NOT_IN_SWEEP)
    return Claim(name, "; ".join(evidence), rule.worst(verdicts), rule.coarsest(resolves))


def finetuned_beats_start(table: Table1, starts: Mapping[tuple[str, str], Stat]) -> Claim:
    """Every Table 1 cell with a step-0 score better than it; the evidence names, per task, the
    model with the smallest gain."""
    name = "fine-tuned beats its step-0 score on every task (Table 1 against evaluate runs tagged start)"
    if not starts:
        return Claim(
            name,
            f"no evaluate runs tagged {START_TAG} (the models before fine-tuning) in this sweep",
            NOT_IN_SWEEP,
        )
    verdicts, resolves, evidence = [], [], []
    for task, label in table.tasks:
        gains = []
        for r in table.rows:
            start = starts.get((r.model, task))
            if start is None:
                continue
            verdicts.append(rule.compare(r.scores[task], start, higher=True, floor=rule.MACHINE["score"]))
            resolves.append(rule.resolvable(r.scores[task], start, rule.MACHINE["score"]))
            if not (rule.missing(start) or rule.missing(r.scores[task])):
                gains.append((r.scores[task].mean - start.mean, r.model, start, r.scores[task]))
        if gains:
            gain, model, start, end = min(gains, key=lambda g: g[0])
            evidence.append(
                f"{label}: smallest gain {model}, {start.mean:.4g} → {end.mean:.4g} ({gain:+.3g})"
            )
    if not verdicts:
        return Claim(name, "no Table 1 model has a step-0 score", NOT_IN_SWEEP)
    return Claim(name, "; ".join(evidence) or "missing scores", rule.worst(verdicts), rule.coarsest(resolves))


class SanityClaimsPart(Part[Sanity]):
    name = "sanity"
    needs = ("table1",)  # and Fig. 5's result where the sweep has it

    def takes(self, context: Context) -> Mapping[str, Sequence[str]]:
        return {"evaluate": (START_TAG,)}

    def compute(self, records: Sequence[Record], schema: Mapping[str, Any], context: Context) -> Sanity:
        table = context.results["table1"]
        pick = select("evaluate", "model", "task", START_TAG, part=self.name)
        starts = gather(records, pick, lambda r: (r.tags["model"], r.tags["task"]), "score")
        return Sanity(
            (
                *larger_beats_smaller(table),
                uptrained_beats_converted(context.results.get("fig5")),
                finetuned_beats_start(table, starts),
            ),
            time_gates(table),
        )

    def markdown(self, result: Sanity, files: Mapping[str, str]) -> list[str]:
        failed = result.failed
        after = (
            f"Failed: {len(failed)} of {len(result.claims)}; the paper's quality claims below are therefore "
            "not testable at this setting."
            if failed
            else "None failed: the paper's claims below are tested."
        )
        return [
            "## Sanity claims",
            "",
            "Orderings any setting that can test the paper must show, by the same verdict rule as the "
            "paper's claims (below); \"resolves\" is the smallest difference the seeds' spread resolves, "
            "never below the number's spread across machines.",
            "",
            *md.table(["claim", "numbers", "resolves", "verdict"], _rows(result.claims)),
            "",
            after,
            *_time_gates(result),
        ]


def _rows(claims: Sequence[Claim]) -> list[list[str]]:
    return [[c.claim, c.evidence, c.resolution(), f"**{c.verdict}**"] for c in claims]


def _time_gates(result: Sanity) -> list[str]:
    """The time gates' table, none where the sweep has no time run of the three models."""
    if all(g.verdict == NOT_IN_SWEEP for g in result.time_gates.values()):
        return []
    failed = [time_model.MEASURES[m] for m in result.time_gates if result.time_gate_failed(m)]
    after = (
        f"Failed: the time claim on {' and on '.join(failed)} is therefore not testable at this setting."
        if failed
        else "None failed: the time claims below are judged."
    )
    return [
        "",
        "Can these time runs test the time claims: does the bytes model (a decoder step reads its weights "
        "and the whole cache) predict differences between the models beyond the timing spread? "
        '("resolves": the largest of the pairs\' spreads over the timing repeats.)',
        "",
        *md.table(["gate", "numbers", "resolves", "verdict"], _rows(list(result.time_gates.values()))),
        "",
        after,
    ]


PART = SanityClaimsPart()
