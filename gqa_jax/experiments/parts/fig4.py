"""Figure 4: a bar per conversion method per task (and their mean), error bars the seeds' std, or
of a proxy (``paper["proxy"]["fig4"]``: the dev loss of the uptraining runs, lower is better; the
converted model's at step 0 beside it where the runs evaluated then). Under its table, the methods
ranked per column against mean pooling (``stats.rank_methods``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from gqa_jax.experiments.parts import md, plot
from gqa_jax.experiments.parts.base import Context, CsvRow, Part, csv_row
from gqa_jax.experiments.parts.records import PROXY_STAGES, Record, gather, select, task_columns, unique
from gqa_jax.experiments.stats import Stat, mean_of, rank_methods


@dataclasses.dataclass(frozen=True)
class Fig4:
    title: str
    ylabel: str
    groups: tuple[str, ...]  # the bar groups' labels: the tasks' (and "mean"), or the proxy's steps
    columns: tuple[str, ...]  # the same as report.csv columns: task names (and "mean"), or the proxy's
    bars: Mapping[str, tuple[Stat, ...]]  # method -> a cell per group; with a mean, it comes last
    ranking: Mapping[str, list[tuple[str, Stat, str]]]  # group label -> (method, cell, verdict), best first
    proxy: str | None

    @property
    def lower_is_better(self) -> bool:
        return self.proxy is not None


class Fig4Part(Part[Fig4]):
    name = "fig4"
    key = "fig4"
    flat_key = "methods"

    def takes(self, context: Context) -> Mapping[str, Sequence[str]]:
        return {} if context.proxy(self.name) else {"evaluate": ("method",)}

    def compute(self, records: Sequence[Record], schema: Mapping[str, Any], context: Context) -> Fig4:
        proxy = context.proxy(self.name)
        if proxy:
            pick = select(PROXY_STAGES, "method", part=self.name)
            cells = gather(records, pick, lambda r: (r.tags["method"], proxy), "loss")
            tasks = [(proxy, "dev loss")]
            starts = gather(records, pick, lambda r: (r.tags["method"], "converted"), "start_loss")
            if any(st.n for st in starts.values()):  # evaluated at step 0 too: the converted model, first
                cells |= starts
                tasks = [("converted", "converted (step 0)"), (proxy, "uptrained")]
        else:
            pick = select("evaluate", "method", "task", part=self.name)
            cells = gather(records, pick, lambda r: (r.tags["method"], r.tags["task"]), "score")
            tasks = task_columns(schema, [t for _, t in cells])
        methods = unique([*schema.get("methods", []), *(m for m, _ in cells)])
        bars = {m: [cells.get((m, t), Stat(None)) for t, _ in tasks] for m in methods}
        groups = [label for _, label in tasks]
        columns = [t for t, _ in tasks]
        if len(tasks) > 1 and not proxy:  # a mean over tasks (not over the proxy's two steps)
            groups.append("mean")
            columns.append("mean")
            bars = {m: [*b, mean_of(b)] for m, b in bars.items()}
        title, ylabel = md.proxy_labels(proxy, "score")
        return Fig4(
            title=f"Fig. 4: conversion methods (MQA, {' / '.join(methods)})" + title,
            ylabel=ylabel,
            groups=tuple(groups),
            columns=tuple(columns),
            bars={m: tuple(b) for m, b in bars.items()},
            ranking=rank_methods(bars, groups, lower_is_better=proxy is not None),
            proxy=proxy,
        )

    def markdown(self, result: Fig4, files: Mapping[str, str]) -> list[str]:
        kind = "loss" if result.lower_is_better else "score"
        rows = [[m, *(md.fmt(s, kind) for s in bars)] for m, bars in result.bars.items()]
        return [
            f"## {result.title}",
            "",
            *md.image(self.name, files, result.title),
            *md.proxy_note(result.proxy),
            *md.table(["method", *result.groups], rows),
            *_ranking(result, kind),
        ]

    def csv(self, result: Fig4) -> list[CsvRow]:
        return [csv_row(self.name, method, column, s) for method, bars in result.bars.items()
                for column, s in zip(result.columns, bars, strict=True)]  # fmt: skip

    def figure(self, result: Fig4, path: Path) -> Path:
        fig = draw(result)
        fig.savefig(path, dpi=plot.DPI, bbox_inches="tight")
        return path


def draw(result: Fig4) -> Figure:
    """The figure: a bar group per column, a bar per method, values over the error bars."""
    fig, (ax,) = plot.new()
    groups, bars = result.groups, result.bars
    width = 0.8 / max(len(bars), 1)
    upright = len(bars) > 4  # narrow bars: the values stand on end so that they do not overlap
    missing, handles = [], []
    for j, (method, stats) in enumerate(bars.items()):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(groups))]
        shown = [(x, s) for x, s in zip(xs, stats, strict=True) if plot.present(s)]
        for x, g, s in zip(xs, groups, stats, strict=True):
            if not plot.present(s):
                missing.append(f"{method} / {g}")
                plot.mark_missing(ax, x)
        if shown:
            ax.bar([x for x, _ in shown], [s.mean for _, s in shown], width * 0.95,
                   yerr=[plot.err(s) for _, s in shown], capsize=3, color=f"C{j}")  # fmt: skip
            for x, s in shown:
                ax.annotate(f"{s.mean:.4g}", (x, s.mean + plot.err(s)), textcoords="offset points",
                            xytext=(0, 3), ha="center", va="bottom", fontsize=7,
                            rotation=90 if upright else 0)  # fmt: skip
        handles.append(Patch(color=f"C{j}", label=method if shown else f"{method} (missing)"))
    if not any(plot.present(s) for stats in bars.values() for s in stats):
        plot.no_data(ax)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(result.ylabel)
    ax.set_title(plot.title(result.title), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.15)
    # beside the axes: with every method (``methods=all``) a legend inside covers the bars
    ax.legend(handles=handles, title="conversion", fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1))
    plot.note_missing(fig, missing)
    return fig


def _ranking(result: Fig4, kind: str) -> list[str]:
    """The methods ranked per column, each against mean pooling."""
    ranking = result.ranking
    if len(result.bars) < 2 or "mean" not in result.bars:
        return []
    depth = max(len(r) for r in ranking.values())
    header = ["rank"]
    for label in ranking:
        header += [label, "against mean"]
    rows = []
    for i in range(depth):
        row = [str(i + 1)]
        for ranked in ranking.values():
            m, st, verdict = ranked[i] if i < len(ranked) else ("", None, "")
            row += [f"{m} {md.fmt(st, kind)}" if m else "", verdict]
        rows.append(row)
    order = "lowest" if result.lower_is_better else "highest"
    return [
        "",
        f"Ranked per column, {order} first. Against mean pooling (the paper's): a difference beyond the "
        "spread is larger than the two cells' standard deviations over seeds added; with one seed "
        "(or methods that give the same model on every seed, e.g. step 0 of a deterministic "
        "conversion) there is no spread to judge by.",
        "",
        *md.table(header, rows),
    ]


PART = Fig4Part()
