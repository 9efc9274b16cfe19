"""The report of a sweep, rebuilt from its run directories alone: ``report.md`` (Markdown),
``report.csv`` (one row per number) and the figures' PNGs, in the paper's layout.

Pipeline: :func:`collect` (ROOT/<run>/run.json, results.json, timing.json, metrics.jsonl) ->
:func:`compute` (each part of ``parts.registry.PARTS`` the sweep's ``paper`` dict selects, in
that order, each given the results of the parts before it) -> :func:`markdown` /
:func:`csv_rows` / :func:`draw`, each a loop over those parts. :func:`write_report` does all of
it. ``docs/experiments.md`` has the rules (which runs count, the cells, the parts).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax.experiments import outputs, runner, scheduler
from gqa_jax.experiments.parts import md
from gqa_jax.experiments.parts.base import CSV_COLUMNS, Context, CsvRow, Part
from gqa_jax.experiments.parts.records import Record, collect, eval_losses, read_run
from gqa_jax.experiments.parts.registry import PARTS, schemas
from gqa_jax.experiments.sweep import Sweep

__all__ = [
    "CSV_COLUMNS", "PARTS", "Numbers", "Record", "collect", "compute", "csv_rows", "draw", "eval_losses",
    "markdown", "read_run", "schemas", "write_csv", "write_report",
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Numbers:
    """Everything the report shows: the runs' records and each of its parts' result."""

    sweep: Sweep
    root: Path
    records: list[Record]
    parts: tuple[Part[Any], ...]  # the parts the sweep has, in the registry's order
    results: dict[str, Any]  # part name -> its result (parts.table1.Table1, parts.fig4.Fig4, ...)

    def __getitem__(self, name: str) -> Any:
        return self.results[name]


def compute(
    sweep: Sweep,
    root: str | Path,
    records: Sequence[Record] | None = None,
    parts: Sequence[Part[Any]] = PARTS,
) -> Numbers:
    """The report's numbers: the result of each part the sweep has (``registry.schemas``)."""
    root = Path(root)
    records = list(collect(sweep, root) if records is None else records)
    found = schemas(sweep, parts)
    present = tuple(p for p in parts if p.name in found)
    results: dict[str, Any] = {}
    for part in present:
        context = Context(sweep.paper, present, dict(results))
        results[part.name] = part.compute(records, found[part.name], context)
    return Numbers(sweep, root, records, present, results)


def csv_rows(numbers: Numbers) -> list[CsvRow]:
    """(section, row, column, ours_mean, ours_std, n_seeds, paper): every number of each part,
    the part's name its section; ours_mean empty and n_seeds 0 where missing."""
    return [row for p in numbers.parts for row in p.csv(numbers.results[p.name])]


def write_csv(rows: Sequence[CsvRow], path: Path) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow(["" if v is None else repr(v) if isinstance(v, float) else v for v in row])
    path.write_text(buf.getvalue())


def markdown(numbers: Numbers, figure_files: Mapping[str, str] | None = None) -> str:
    """The Markdown report: the runs, then each part's section; ``figure_files``: part name -> its
    PNG's path relative to the report."""
    files = figure_files or {}
    sections = [md.opening(numbers.sweep.name, numbers.root, numbers.records)]
    sections += [p.markdown(numbers.results[p.name], files) for p in numbers.parts]
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def draw(numbers: Numbers, out: str | Path) -> dict[str, Path]:
    """Each part's figure (those that have one) as ``out/<part name>.png``; returns name -> path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    drawn = {p.name: p.figure(numbers.results[p.name], out / f"{p.name}.png") for p in numbers.parts}
    return {name: path for name, path in drawn.items() if path is not None}


def check_runs(sweep: Sweep, root: str | Path) -> None:
    """What ``sweep`` checks before it runs, before a report is written: a run under ``root`` made
    by another command than ``sweep`` gives now (another ``--set``, sweep file or scale, a partial
    redo), or a root whose runs are all another sweep's, is one ValueError naming them; a report
    never mixes settings, nor replaces one with another setting's empty cells."""
    root = Path(root)
    changed = runner.changed_runs(sweep.runs, root)
    if changed:
        raise ValueError(
            f"{len(changed)} run(s) under {root} were made by another command than sweep {sweep.name} "
            f"gives with these --set ({runner.listed(changed)}): give the --set they were made with, or "
            "rerun them with `sweep ... --redo-changed`; no report was written"
        )
    begun = [r.name for r in sweep.runs if scheduler.status(root, r.name) is not None]
    names = {r.name for r in sweep.runs}
    made = [d.name for d in root.glob("*/") if (d / outputs.RUN_FILE).is_file()]
    others = sorted(n for n in made if n not in names)
    if not begun and others:
        listed = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise ValueError(
            f"none of the {len(names)} runs of sweep {sweep.name} with these --set is under {root}, which "
            f"holds {len(others)} other run(s) ({listed}): give the sweep file and --set they were made "
            "with; no report was written"
        )


def write_report(
    sweep: Sweep, root: str | Path, out: str | Path | None = None, parts: Sequence[Part[Any]] = PARTS
) -> dict[str, Path]:
    """Write report.md, report.csv and the figures' PNGs into ``out`` (default ROOT/report);
    returns what was written (name -> path)."""
    out = Path(out) if out is not None else Path(root) / "report"
    if out.is_file():
        raise ValueError(f"the report's directory {out} is a file: give a directory (--out)")
    numbers = compute(sweep, root, parts=parts)
    written = draw(numbers, out)
    write_csv(csv_rows(numbers), out / "report.csv")
    (out / "report.md").write_text(markdown(numbers, {k: p.name for k, p in written.items()}))
    return {"report.md": out / "report.md", "report.csv": out / "report.csv", **written}
