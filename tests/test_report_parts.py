"""The report's registry of parts (gqa_jax.experiments.parts): a part added here, for these tests
only, shows up in report.md and report.csv (and its figure) without touching report.py; which
parts a sweep has comes from the shape of its paper dict alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from test_report import TASKS, csv_value, fake_root, mini_sweep, read_csv, table_sweep

from gqa_jax.experiments import report
from gqa_jax.experiments.parts import md, plot, registry
from gqa_jax.experiments.parts.base import Context, CsvRow, Part, csv_row
from gqa_jax.experiments.parts.records import Record, gather, select
from gqa_jax.experiments.parts.table1 import Table1
from gqa_jax.experiments.stats import Stat
from gqa_jax.experiments.sweep import Run, Sweep

# the registry's parts, in order
ALL = ["table1", "fig3", "fig4", "fig5", "fig6", "paper_decode", "sanity", "claims"]


class Widgets(Part[dict[str, Stat]]):
    """A part of evaluate runs tagged ``widget``: a cell per widget, a section, a CSV row each."""

    name = "widgets"
    key = "widgets"
    flat_key = "widget_list"

    def takes(self, context: Context) -> Mapping[str, Sequence[str]]:
        return {"evaluate": ("widget",)}

    def compute(
        self, records: Sequence[Record], schema: Mapping[str, Any], context: Context
    ) -> dict[str, Stat]:
        cells = gather(
            records, select("evaluate", "widget", part=self.name), lambda r: r.tags["widget"], "score"
        )
        return {w: cells.get(w, Stat(None)) for w in [*schema.get("widget_list", []), *cells]}

    def markdown(self, result: dict[str, Stat], files: Mapping[str, str]) -> list[str]:
        return ["## Widgets", "", *md.table(["widget", "score"], [[w, md.fmt(s)] for w, s in result.items()])]

    def csv(self, result: dict[str, Stat]) -> list[CsvRow]:
        return [csv_row(self.name, w, "score", s) for w, s in result.items()]


class Fastest(Part[str]):
    """A part computed from Table 1's result: the model with the lowest T_infer, and a figure."""

    name = "fastest"
    needs = ("table1",)

    def compute(self, records: Sequence[Record], schema: Mapping[str, Any], context: Context) -> str:
        table = context.results["table1"]
        assert isinstance(table, Table1) and "fastest" not in context.results
        return min((r for r in table.rows if not r.time.missing), key=lambda r: r.time.mean).model

    def markdown(self, result: str, files: Mapping[str, str]) -> list[str]:
        return ["## Fastest", "", *md.image(self.name, files, "fastest"), f"The fastest model: {result}."]

    def figure(self, result: str, path: Path) -> Path:
        fig, (ax,) = plot.new()
        ax.set_title(result)
        fig.savefig(path, dpi=plot.DPI)
        return path


def widget_runs() -> tuple[list[Run], dict[str, float]]:
    runs, values = [], {}
    for w, scores in (("cog", (1.0, 3.0)), ("gear", (5.0,))):
        for seed, v in enumerate(scores):
            name = f"eval_{w}_s{seed}"
            runs.append(
                Run(name, "evaluate", {}, (), {"model": "MHA", "task": "docsum", "widget": w, "seed": seed})
            )
            values[name] = v
    return runs, values


def test_a_part_added_to_the_registry_shows_up_in_the_markdown_and_the_csv(tmp_path):
    runs, values = widget_runs()
    sweep = Sweep("widgets", tuple(runs), {"widget_list": ["gear", "cog", "sprocket"]})
    parts = (*registry.PARTS, Widgets())
    written = report.write_report(sweep, fake_root(tmp_path, sweep, values), parts=parts)
    assert set(written) == {"report.md", "report.csv"}  # the widgets alone; no figure
    md_text = written["report.md"].read_text()
    assert "## Widgets" in md_text and "## Table 1" not in md_text
    assert "| cog | 2.00 ± 1.41, n=2 |" in md_text and "| sprocket | — |" in md_text
    rows = read_csv(written["report.csv"])
    assert [r["row"] for r in rows] == ["gear", "cog", "sprocket"] and {r["section"] for r in rows} == {
        "widgets"
    }
    assert float(csv_value(rows, "widgets", "cog", "score")["ours_mean"]) == 2.0
    with pytest.raises(ValueError, match="nothing to report"):  # the registry without it
        report.compute(sweep, tmp_path)


def test_a_derived_part_gets_the_results_before_it_and_draws_its_figure(tmp_path):
    sweep, values = table_sweep()
    parts = (*registry.PARTS, Fastest())
    written = report.write_report(sweep, fake_root(tmp_path, sweep, values), parts=parts)
    assert list(written) == ["report.md", "report.csv", "fig3", "fastest"]
    assert written["fastest"].name == "fastest.png" and written["fastest"].is_file()
    md_text = written["report.md"].read_text()
    assert (
        md_text.index("## Fig. 3") < md_text.index("## Fastest") and "The fastest model: MQA-XXL." in md_text
    )
    assert "![fastest](fastest.png)" in md_text
    with pytest.raises(ValueError, match="fastest needs table1, which must come before it"):
        report.compute(sweep, tmp_path, parts=(Fastest(), *registry.PARTS))


def test_nested_parts_come_from_the_paper_dicts_shape_and_take_their_runs_from_table1(tmp_path):
    sweep, values = mini_sweep()
    runs, more = widget_runs()
    nested = Sweep(
        "not the mini", (*sweep.runs, *runs), {**sweep.paper, "widgets": {"widget_list": ["gear"]}}
    )
    numbers = report.compute(
        nested, fake_root(tmp_path, nested, values | more), parts=(*registry.PARTS, Widgets())
    )
    assert [p.name for p in numbers.parts] == [*ALL, "widgets"]
    assert list(numbers["widgets"]) == ["gear", "cog"] and numbers["widgets"]["gear"].mean == 5.0
    assert [r.model for r in numbers["table1"].rows] == ["MHA", "GQA-2", "MQA"]
    assert numbers["table1"].row("MHA").scores["docsum"].mean == pytest.approx(
        20.2
    )  # the widget runs: not its
    assert report.compute(nested, tmp_path).results.keys() == report.compute(sweep, tmp_path).results.keys()
    one = Sweep(
        "x", sweep.runs, {"fig6": sweep.paper["fig6"]}
    )  # one part nested: all of them, {} for the rest
    assert [p.name for p in report.compute(one, tmp_path).parts] == ALL


def test_a_flat_paper_dict_selects_the_first_part_with_its_key():
    runs = (Run("e", "evaluate", {}, (), {"model": "m", "task": "t"}),)
    found = registry.schemas(Sweep("any name", runs, {"tasks": TASKS, "rows": {}, "methods": ["mean"]}))
    assert list(found) == ["table1", "fig3", "sanity"] and found["table1"]["tasks"] == TASKS
    assert list(registry.schemas(Sweep("table1", runs, {"alphas": [0]}))) == ["fig5"]  # not by its name


@pytest.mark.parametrize("name", ["mini", "table1", "mine"])
def test_a_sweep_whose_paper_dict_selects_nothing_is_a_clear_error(tmp_path, name):
    runs = (Run("e", "evaluate", {}, (), {"model": "m", "task": "t"}),)
    sweep = Sweep(name, runs, {"tasks": TASKS, "fig4": ["not", "a", "dict"]})
    fake_root(tmp_path, sweep, {"e": 1.0})
    message = (
        rf"sweep {name}: nothing to report: its paper dict has none of the keys rows, methods, alphas, "
        r"reference_groups \(one part's schema\) and none of table1, fig4, fig5, fig6, paper_decode "
        r"holding a dict"
    )
    with pytest.raises(ValueError, match=message):
        report.write_report(sweep, tmp_path)
    assert not (tmp_path / "report").exists()


def test_the_registry_is_in_the_reports_order_with_distinct_names():
    registry.check(registry.PARTS)
    assert [p.name for p in registry.PARTS] == ALL
    with pytest.raises(ValueError, match="two report parts named table1"):
        registry.check((*registry.PARTS, registry.PARTS[0]))
