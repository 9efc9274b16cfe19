"""Table 1: per model, T_infer and the tasks' scores with their plain mean, the paper's beside them.

Scores: evaluate runs tagged ``model`` and ``task`` (their results.json primary, and its ``loss``,
the teacher-forced dev loss, in a table of its own); T_infer: the mean of a model's time runs' cells
(tagged ``model``; one cell per set of lengths, or any other tag but ``seed``), each cell the median
of its timing repeats with their spread, and the prefill's share of it; the decoder's steps timed
alone (timing.json's steps_times_s) the same way, and beside both the bytes model of a decoder step
(``parts.time_model``: each row's ratio to the MHA row of its size, predicted and measured). Runs another
part of the report takes (``Part.takes``: Fig. 4's ``method``, Fig. 5's ``alpha``, Fig. 6's
``groups``) are not the table's; time runs tagged that way are, though, when no other time run
has a ``model`` tag.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from gqa_jax.experiments import claims as rule
from gqa_jax.experiments.parts import md, time_model
from gqa_jax.experiments.parts.base import Context, CsvRow, Part, csv_row
from gqa_jax.experiments.parts.records import (
    FLOOR_NOTE,
    Record,
    gather,
    gather_times,
    predicted_on,
    select,
    task_columns,
    time_source,
    unique,
)
from gqa_jax.experiments.stats import Stat, mean_of


@dataclasses.dataclass(frozen=True)
class PaperRow:
    """The paper's numbers for a model (None where it prints none)."""

    time: float | None = None  # T_infer, s per TPUv4 chip
    average: float | None = None  # its own "Average" column (over its seven tasks)
    scores: Mapping[str, float] = dataclasses.field(default_factory=dict)  # task -> score
    plain_mean: float | None = None  # the mean of ``scores`` over the table's tasks
    name: str | None = None  # the paper's name for the row, where ours stands for another of its models


@dataclasses.dataclass(frozen=True)
class Table1Row:
    model: str
    time: Stat  # T_infer: the mean of its time runs' cells
    scores: Mapping[str, Stat]  # task -> its cell
    plain_mean: Stat  # the mean over the tasks (missing when one is)
    paper: PaperRow
    prefill: Stat = Stat(None)  # the prefill alone, as ``time`` (timing.json prefill_times_s)
    floor: Stat = Stat(None)  # a predicted T_infer's read-once floor (``TimingRecord.read_once_floor``)
    losses: Mapping[str, Stat] = dataclasses.field(default_factory=dict)  # task -> dev loss cell
    mean_loss: Stat = Stat(None)  # the mean dev loss over the tasks (missing when one is)
    steps: Stat = Stat(None)  # the decoder's steps alone, as ``time`` (timing.json steps_times_s)
    reads: time_model.Reads = time_model.Reads()  # the bytes model of its time cells (their mean)

    @property
    def timed(self) -> time_model.Timed:
        return time_model.Timed(self.model, self.time, self.steps, self.reads)

    @property
    def has_losses(self) -> bool:
        return any(not s.missing for s in self.losses.values())


@dataclasses.dataclass(frozen=True)
class Table1:
    tasks: tuple[tuple[str, str], ...]  # (task, column label)
    rows: tuple[Table1Row, ...]  # the paper's models in its order, then those only the runs have
    note: str | None  # the schema's note, printed under the table's caption
    source: str  # what the times are (measured where, or predicted for which TPU slice), in words
    predicted: str | None = None  # the TPU slice the times were predicted for (time --predict)

    def row(self, model: str) -> Table1Row:
        return next(r for r in self.rows if r.model == model)


def _rest(run: Any) -> tuple[tuple[str, str], ...]:
    """A time run's tags but ``model`` and ``seed``: its cell among the model's."""
    return tuple(sorted((k, str(v)) for k, v in run.tags.items() if k not in ("model", "seed")))


class Table1Part(Part[Table1]):
    name = "table1"
    key = "table1"
    flat_key = "rows"

    def compute(self, records: Sequence[Record], schema: Mapping[str, Any], context: Context) -> Table1:
        taken = context.taken_by_others("evaluate", self.name)
        pick = select("evaluate", "model", "task", part=self.name, exclude=taken)
        cell_of = lambda r: (r.tags["model"], r.tags["task"])  # noqa: E731
        scores, losses = gather(records, pick, cell_of, "score"), gather(records, pick, cell_of, "dev_loss")
        others = context.taken_by_others("time", self.name)
        timed = select("time", "model", part=self.name, exclude=others)
        if others and not any(timed(rec.run) for rec in records):
            timed = select("time", "model", part=self.name)
        times = gather_times(records, timed, lambda r: (r.tags["model"], _rest(r)))
        prefills = gather_times(records, timed, lambda r: (r.tags["model"], _rest(r)), "prefill_times")
        floors = gather_times(records, timed, lambda r: (r.tags["model"], _rest(r)), "floor_times")
        steps = gather_times(records, timed, lambda r: (r.tags["model"], _rest(r)), "steps_times")
        reads = time_model.reads_of(records, timed, lambda r: (r.tags["model"], _rest(r)))
        tasks = task_columns(schema, [t for _, t in scores])
        paper_rows = schema.get("rows", {})
        models = unique([*paper_rows, *(m for m, _ in scores), *(m for m, _ in times)])
        rows = []
        for m in models:
            cells = {t: scores.get((m, t), Stat(None)) for t, _ in tasks}
            time_cells = [s for (mm, _), s in times.items() if mm == m]
            prefill_cells = [s for (mm, _), s in prefills.items() if mm == m]
            floor_cells = [s for (mm, _), s in floors.items() if mm == m and not s.missing]
            steps_cells = [s for (mm, _), s in steps.items() if mm == m]
            loss_cells = {t: losses.get((m, t), Stat(None)) for t, _ in tasks}
            paper = paper_rows.get(m, {})
            paper_scores = paper.get("scores", {})
            paper_mean = [paper_scores.get(t) for t, _ in tasks]
            rows.append(Table1Row(
                model=m,
                time=mean_of(time_cells) if time_cells else Stat(None),
                scores=cells,
                plain_mean=mean_of(list(cells.values())),
                paper=PaperRow(
                    time=paper.get("time"),
                    average=paper.get("average"),
                    scores=paper_scores,
                    plain_mean=None if None in paper_mean or not tasks else statistics.fmean(paper_mean),
                    name=paper.get("name"),
                ),
                prefill=mean_of(prefill_cells) if prefill_cells else Stat(None),
                floor=mean_of(floor_cells) if floor_cells else Stat(None),
                losses=loss_cells,
                mean_loss=mean_of(list(loss_cells.values())),
                steps=mean_of(steps_cells) if steps_cells else Stat(None),
                reads=time_model.mean_reads([r for (mm, _), r in reads.items() if mm == m]),
            ))  # fmt: skip
        source = time_source([r for r in records if timed(r.run)])  # its time runs' (the decode they ran)
        return Table1(tuple(tasks), tuple(rows), schema.get("note"), source, predicted_on(records))

    def markdown(self, result: Table1, files: Mapping[str, str]) -> list[str]:
        prefill = any(not r.prefill.missing for r in result.rows)
        timed = any(not r.time.missing for r in result.rows)
        ratio = result.predicted is not None and any(_ratio(r) for r in result.rows)
        floor = any(not r.floor.missing for r in result.rows)
        header = [
            "model",
            "T_infer (s)" + (" PREDICTED" if result.predicted else ""),
            *(["ours / paper"] if ratio else []),
            *(["read-once floor (s)"] if floor else []),
            *(["of which prefill (s)"] if prefill else []),
            *(["decoder steps alone (s)"] if timed else []),
            *(label for _, label in result.tasks),
            "Average (paper)",
            "plain mean",
        ]
        rows = []
        for r in result.rows:
            p = r.paper
            rows.append([
                r.model,
                md.cell(r.time, p.time, "time"),
                *([_ratio(r) or "—"] if ratio else []),
                *([md.fmt(r.floor, "time")] if floor else []),
                *([md.fmt(r.prefill, "time")] if prefill else []),
                *([md.fmt(r.steps, "time")] if timed else []),
                *(md.cell(r.scores[t], p.scores.get(t)) for t, _ in result.tasks),
                md.NOT_IN_SWEEP if p.average is None else str(p.average),
                md.cell(r.plain_mean, None if p.plain_mean is None else round(p.plain_mean, 2)),
            ])  # fmt: skip
        lines = [
            "## Table 1",
            "",
            f"T_infer: time per sample in seconds; ours: {result.source}; the mean of a model's time runs "
            "(one per set of lengths); the paper's: per TPUv4 chip."
            + (f" {FLOOR_NOTE}" if floor else "")
            + (" Of which prefill: the encoder and the cache's set-up alone (timing.json's "
               "prefill_times_s), the rest is the decoder's steps (timed alone: beside it)." if prefill
               else "")
            + (" Decoder steps alone: the step loop timed on a prefilled state, its own repeats "
               "(timing.json's steps_times_s; none in a timing.json written before they were recorded)."
               if timed else "")
            + " Scores: the dev sets' primary metric. "
            '"Average (paper)" is the paper\'s own column (it does not define it); "plain mean" is the mean '
            "over the tasks, ours (the paper's).",
            *([""] + [result.note] if result.note else []),
            "",
            *md.table(header, rows),
            *speedups(result),
            *bytes_model(result),
        ]  # fmt: skip
        if any(r.has_losses for r in result.rows):
            loss_rows = [
                [
                    r.model,
                    *(md.fmt(r.losses[t], "loss") for t, _ in result.tasks),
                    md.fmt(r.mean_loss, "loss"),
                ]
                for r in result.rows
            ]
            lines += [
                "",
                "Dev loss of the same evaluations (results.json loss): the teacher-forced mean negative "
                "log-likelihood per target token of the fine-tuned model on the evaluated dev examples; "
                "lower is better, and much less noisy than a decoded metric.",
                "",
                *md.table(["model", *(t for t, _ in result.tasks), "mean over the tasks"], loss_rows),
            ]
        return lines

    def csv(self, result: Table1) -> list[CsvRow]:
        rows = []
        for r in result.rows:
            p = r.paper
            rows.append(csv_row(self.name, r.model, "T_infer_s", r.time, p.time))
            rows += [csv_row(self.name, r.model, t, r.scores[t], p.scores.get(t)) for t, _ in result.tasks]
            rows.append(csv_row(self.name, r.model, "paper_average", None, p.average))
            rows.append(csv_row(self.name, r.model, "plain_mean", r.plain_mean, p.plain_mean))
            if not r.prefill.missing:
                rows.append(csv_row(self.name, r.model, "prefill_s", r.prefill))
            if not r.floor.missing:
                rows.append(csv_row(self.name, r.model, "T_infer_floor_s", r.floor))
            if not r.steps.missing:
                rows.append(csv_row(self.name, r.model, "steps_s", r.steps))
            if r.reads.step is not None:
                rows.append(csv_row(self.name, r.model, "step_bytes", Stat(r.reads.step, n=1)))
            if r.has_losses:
                rows += [csv_row(self.name, r.model, f"dev_loss[{t}]", r.losses[t]) for t, _ in result.tasks]
                rows.append(csv_row(self.name, r.model, "dev_loss[mean]", r.mean_loss))
        return rows


SPEEDUP_OVER = "MHA-XXL"  # the paper's speed-ups: MQA-XXL and GQA-8-XXL over it (1.51 / 0.24, 1.51 / 0.28)


def _ratio(row: Table1Row) -> str:
    """Our T_infer over the paper's (empty where either is missing)."""
    if row.time.missing or not row.paper.time:
        return ""
    return f"{row.time.mean / row.paper.time:.2f}"


def speedups(result: Table1) -> list[str]:
    """Each XXL model's speed-up over MHA-XXL (its T_infer / theirs), ours beside the paper's; with
    predicted times, the read-once floors' speed-ups too."""
    rows = {r.model: r for r in result.rows}
    base = rows.get(SPEEDUP_OVER)
    if base is None or base.time.missing:
        return []
    parts = []
    for r in result.rows:
        if r.model == SPEEDUP_OVER or not r.model.endswith("-XXL") or r.time.missing or not r.time.mean:
            continue
        paper = base.paper.time / r.paper.time if base.paper.time and r.paper.time else None
        ours = base.time.mean / r.time.mean
        floors = not (base.floor.missing or r.floor.missing)
        floor = f", floor {base.floor.mean / r.floor.mean:.2f}x" if floors else ""
        parts.append(f"{r.model} {ours:.2f}x{floor}" + (f" (paper {paper:.2f}x)" if paper else ""))
    if not parts:
        return []
    return ["", f"Speed-up over {SPEEDUP_OVER} (its T_infer / the model's): " + ", ".join(parts) + "."]


def bytes_model(result: Table1) -> list[str]:
    """The bytes model's table (``parts.time_model``): each timed row against the MHA row of its
    size (``claims.pick``)."""
    timed = [r for r in result.rows if not r.time.missing]
    if not timed:
        return []
    models = [r.model for r in timed]
    cells = []
    for r in timed:
        ref = rule.pick(models, "MHA", like=r.model)
        cells.append((r.timed, result.row(ref).timed if ref else None))
    return [
        "",
        *time_model.table("model", cells, "Decode time against the bytes model, each model against MHA."),
    ]


PART = Table1Part()
