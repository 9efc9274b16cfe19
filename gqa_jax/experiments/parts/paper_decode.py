"""Table 1's T_infer under the paper's decode, beside ours: the time runs tagged ``model`` and
``decode`` (the paper's decode or some of its switches: T5X's, an instrument for its timings,
docs/decoding.md), each model's T_infer the mean of its runs' cells as in Table 1 (one cell per set
of lengths), the decoder's steps alone likewise; beside them Table 1's times under ours and the
paper's T_infer. Table 1 leaves these runs out (:meth:`PaperDecodePart.takes`); the paper's claims
judge the decode-time claim under each decode too (``parts.paper_claims``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gqa_jax.experiments.parts import md
from gqa_jax.experiments.parts.base import Context, CsvRow, Part, csv_row
from gqa_jax.experiments.parts.records import Record, gather_times, select, time_source, unique
from gqa_jax.experiments.parts.table1 import Table1
from gqa_jax.experiments.stats import Stat, mean_of


@dataclasses.dataclass(frozen=True)
class DecodeRow:
    """One model under one decode: its T_infer and decoder steps, ours (Table 1's), the paper's."""

    model: str
    time: Stat
    steps: Stat
    ours: Stat = Stat(None)
    ours_steps: Stat = Stat(None)
    paper: float | None = None


@dataclasses.dataclass(frozen=True)
class PaperDecode:
    decodes: Mapping[str, tuple[DecodeRow, ...]]  # decode name -> its rows, Table 1's models first
    source: str  # what the times are, in words (time_source of these runs)


def _rest(run: Any) -> tuple[tuple[str, str], ...]:
    """A time run's tags but ``model``, ``decode`` and ``seed``: its cell among the model's."""
    return tuple(sorted((k, str(v)) for k, v in run.tags.items() if k not in ("model", "decode", "seed")))


class PaperDecodePart(Part[PaperDecode]):
    name = "paper_decode"
    key = "paper_decode"
    needs = ("table1",)

    def takes(self, context: Context) -> Mapping[str, Sequence[str]]:
        return {"time": ("decode",)}

    def compute(self, records: Sequence[Record], schema: Mapping[str, Any], context: Context) -> PaperDecode:
        pick = select("time", "model", "decode", part=self.name)
        key = lambda r: (r.tags["decode"], r.tags["model"], _rest(r))  # noqa: E731
        times, steps = gather_times(records, pick, key), gather_times(records, pick, key, "steps_times")
        table: Table1 = context.results["table1"]
        ours = {r.model: r for r in table.rows}
        decodes: dict[str, tuple[DecodeRow, ...]] = {}
        for decode in unique(d for d, _, _ in times):
            models = unique([*(r.model for r in table.rows), *(m for d, m, _ in times if d == decode)])
            rows = []
            for m in models:
                cells = [s for (d, mm, _), s in times.items() if (d, mm) == (decode, m)]
                if not cells:
                    continue
                step_cells = [s for (d, mm, _), s in steps.items() if (d, mm) == (decode, m)]
                row = ours.get(m)
                rows.append(DecodeRow(
                    model=m, time=mean_of(cells), steps=mean_of(step_cells),
                    ours=row.time if row else Stat(None), ours_steps=row.steps if row else Stat(None),
                    paper=row.paper.time if row else None,
                ))  # fmt: skip
            decodes[decode] = tuple(rows)
        return PaperDecode(decodes, time_source([r for r in records if pick(r.run)]))

    def markdown(self, result: PaperDecode, files: Mapping[str, str]) -> list[str]:
        if not result.decodes:
            return []
        header = ["model", "decode", "T_infer (s)", "ours (Table 1)", "ratio", "decoder steps (s)",
                  "ours", "ratio", "paper's T_infer (s)"]  # fmt: skip
        rows = [
            [r.model, f"`{decode}`", md.fmt(r.time, "time"), md.fmt(r.ours, "time"), _ratio(r.time, r.ours),
             md.fmt(r.steps, "time"), md.fmt(r.ours_steps, "time"), _ratio(r.steps, r.ours_steps),
             md.NOT_IN_SWEEP if r.paper is None else str(r.paper)]
            for decode, decode_rows in result.decodes.items()
            for r in decode_rows
        ]  # fmt: skip
        return [
            "## Table 1's T_infer under the paper's decode",
            "",
            "The same time runs under the decode the paper's code ran (T5X with Flaxformer: the "
            "cross-attention K/V projected from the encoder output at every step, the self-attention "
            "cache written by a one-hot update in T5X's layout; `paper` is all of it, other names some "
            "of its switches), an instrument for the paper's timings, not a way to decode: the tokens "
            "are ours (docs/decoding.md). Beside them Table 1's times under ours; ratio: this decode's "
            f"time over ours. Times: {result.source}.",
            "",
            *md.table(header, rows),
        ]

    def csv(self, result: PaperDecode) -> list[CsvRow]:
        out = []
        for decode, rows in result.decodes.items():
            for r in rows:
                out.append(csv_row(self.name, r.model, f"T_infer_s[{decode}]", r.time, r.paper))
                out.append(csv_row(self.name, r.model, f"steps_s[{decode}]", r.steps))
        return out


def _ratio(a: Stat, b: Stat) -> str:
    return "—" if a.missing or b.missing or not b.mean else f"{a.mean / b.mean:.2f}"


PART = PaperDecodePart()
