"""Figure 3, from Table 1's result: average score (the plain mean over the tasks) against time per
sample, a labelled point per model, ours filled with their spread as error bars, the paper's
hollow (on a panel of their own when the scales differ)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from gqa_jax.experiments.parts import md, plot
from gqa_jax.experiments.parts.base import Context, CsvRow, Part, csv_row
from gqa_jax.experiments.parts.records import Record
from gqa_jax.experiments.parts.table1 import Table1
from gqa_jax.experiments.stats import Stat


@dataclasses.dataclass(frozen=True)
class Fig3Point:
    model: str
    time: Stat  # Table 1's T_infer
    average: Stat  # Table 1's plain mean
    paper_time: float | None  # the paper's T_infer and Average, where it prints both
    paper_average: float | None
    paper_name: str | None = None  # the paper's model, where it is not ``model`` (the mini's roles)


@dataclasses.dataclass(frozen=True)
class Fig3:
    title: str
    xlabel: str
    ylabel: str
    points: tuple[Fig3Point, ...]  # Table 1's rows, in its order

    @property
    def ours(self) -> list[Fig3Point]:
        """The points drawn: time and average both there."""
        return [p for p in self.points if not p.time.missing and not p.average.missing]

    @property
    def missing(self) -> list[str]:
        return [p.model for p in self.points if p.time.missing or p.average.missing]

    @property
    def paper(self) -> list[tuple[str, str, float, float]]:
        """(model, the paper's name for it, T_infer, Average): the paper's points."""
        return [(p.model, p.paper_name or p.model, p.paper_time, p.paper_average)
                for p in self.points if p.paper_time is not None]  # fmt: skip


class Fig3Part(Part[Fig3]):
    name = "fig3"
    needs = ("table1",)

    def compute(self, records: Sequence[Record], schema: Mapping[str, Any], context: Context) -> Fig3:
        table: Table1 = context.results["table1"]
        points = []
        for r in table.rows:
            both = r.paper.time is not None and r.paper.average is not None
            points.append(Fig3Point(r.model, r.time, r.plain_mean, r.paper.time if both else None,
                                    r.paper.average if both else None, r.paper.name))  # fmt: skip
        return Fig3(
            title="Fig. 3: average score vs time per sample",
            xlabel="time per sample (s)",
            ylabel="average score (plain mean over the tasks)",
            points=tuple(points),
        )

    def markdown(self, result: Fig3, files: Mapping[str, str]) -> list[str]:
        rows = [[p.model, md.cell(p.time, p.paper_time, "time"), md.cell(p.average, p.paper_average)]
                for p in result.points]  # fmt: skip
        return [
            f"## {result.title}",
            "",
            *md.image(self.name, files, result.title),
            "Ours: the plain mean over the tasks; the paper's points: its Average and T_infer "
            "(hollow markers).",
            "",
            *md.table(["model", "time per sample (s)", "average score"], rows),
        ]

    def csv(self, result: Fig3) -> list[CsvRow]:
        rows = []
        for p in result.points:
            rows.append(csv_row(self.name, p.model, "time_per_sample_s", p.time, p.paper_time))
            rows.append(csv_row(self.name, p.model, "average_score", p.average, p.paper_average))
        return rows

    def figure(self, result: Fig3, path: Path) -> Path:
        draw(result).savefig(path, dpi=plot.DPI)
        return path


def draw(result: Fig3) -> Figure:
    """The figure: one plot when ours and the paper's share a scale, else a panel each."""
    ours, paper = result.ours, result.paper
    if paper and _comparable([(p.time.mean, p.average.mean) for p in ours], [(t, a) for _, _, t, a in paper]):
        fig, (ax,) = plot.new()
        _shared(ax, ours, paper)
        axes = [ax]
    else:
        fig, axes = plot.new(2 if paper else 1)
        _points(axes[0], axes[-1], ours, paper)
    for ax in axes:
        ax.set_xlabel(result.xlabel)
        ax.set_ylabel(result.ylabel)
        ax.grid(alpha=0.3)
        ax.margins(0.2)
    if not ours:
        plot.no_data(axes[0])
    fig.suptitle(plot.title(result.title), fontsize=11)
    plot.note_missing(fig, result.missing)
    return fig


def _comparable(ours: Sequence[tuple[float, float]], paper: Sequence[tuple[float, float]]) -> bool:
    """One shared pair of axes only when ours fall near the paper's ranges (times within a factor
    3, scores within 10 points); else each on its own panel."""
    if not ours or not paper:
        return True
    times, scores = [t for t, _ in paper], [a for _, a in paper]
    return all(min(times) / 3 <= t <= max(times) * 3 and min(scores) - 10 <= a <= max(scores) + 10
               for t, a in ours)  # fmt: skip


def _label(ax: Any, text: str, x: float, y: float, xs: Sequence[float], dy: int, **style: Any) -> None:
    """A point's label to its right, or to its left in the right half (it stays inside the plot)."""
    right = len(xs) > 1 and x > (min(xs) + max(xs)) / 2
    ax.annotate(text, (x, y), textcoords="offset points", xytext=(-7 if right else 7, dy),
                ha="right" if right else "left", **style)  # fmt: skip


def _points(ax_ours: Any, ax_paper: Any, ours: Sequence[Fig3Point], paper: Sequence[Any]) -> None:
    """Labelled points; the paper's on a panel of their own (``ax_paper``) when it is not ``ax_ours``."""
    xs = [p.time.mean for p in ours]
    for i, p in enumerate(ours):
        t, a = p.time, p.average
        ax_ours.errorbar(t.mean, a.mean, xerr=plot.err(t), yerr=plot.err(a), fmt="o", color=plot.OURS, ms=7,
                         capsize=3, label="ours" if i == 0 else None)  # fmt: skip
        _label(ax_ours, p.model, t.mean, a.mean, xs, 5, fontsize=9, color=plot.OURS)
    for i, (_, name, t, a) in enumerate(paper):
        ax_paper.plot(t, a, "s", mfc="none", mec=plot.PAPER, mew=1.5, ms=8, label="paper" if i == 0 else None)
        _label(
            ax_paper, f"{name} (paper)", t, a, [t for *_, t, _ in paper], -12, fontsize=8, color=plot.PAPER
        )
    for ax in {id(ax_ours): ax_ours, id(ax_paper): ax_paper}.values():
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=9)
    if ax_paper is not ax_ours:
        ax_ours.set_title("ours", fontsize=10)
        ax_paper.set_title("the paper's (T_infer per TPUv4 chip)", fontsize=10)


def _shared(ax: Any, ours: Sequence[Fig3Point], paper: Sequence[Any]) -> None:
    """One plot: a colour per model, ours filled circles, the paper's hollow squares, a dotted
    line from each of ours to the paper's point of the same model; the legend names them."""
    models = list(dict.fromkeys([p.model for p in ours] + [m for m, *_ in paper]))
    color = {m: f"C{i}" for i, m in enumerate(models)}
    theirs = {m: (t, a) for m, _, t, a in paper}
    for p in ours:
        m, t, a = p.model, p.time, p.average
        ax.errorbar(t.mean, a.mean, xerr=plot.err(t), yerr=plot.err(a), fmt="o", color=color[m], ms=7,
                    capsize=3, label=f"{m} (ours)")  # fmt: skip
        if m in theirs:
            ax.plot([t.mean, theirs[m][0]], [a.mean, theirs[m][1]], ":", color=color[m], lw=1)
    for m, name, t, a in paper:
        ax.plot(t, a, "s", mfc="none", mec=color[m], mew=1.5, ms=9, label=f"{name} (paper)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8,
              title="filled: ours\nhollow: the paper's", title_fontsize=8)  # fmt: skip


PART = Fig3Part()
