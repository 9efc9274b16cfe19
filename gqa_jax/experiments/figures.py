"""The report's figures as PNGs (matplotlib, Agg backend: no display needed), drawn from the
numbers ``report.compute`` puts in ``Numbers.figures``; this module computes nothing.

- Fig. 3: average score against time per sample, a labelled point per model, ours filled with
  their spread as error bars, the paper's hollow (on their own panel when the scales differ);
- Fig. 4: a bar per conversion method per task (and their mean), error bars the seeds' std;
- Fig. 5: score against alpha, a line per model, the reference model a dashed horizontal line;
- Fig. 6: time per sample against the number of groups on a log x axis, MHA a dotted line.

Numbers are duck-typed (``mean``: None when missing, ``std``); a missing one is left out of the
plot and named on it, never drawn as zero.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

SIZE = (7.5, 4.8)
DPI = 120
OURS = "tab:blue"
PAPER = "dimgray"
MISSING = "firebrick"
CACHE_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")  # Fig. 6's quantized caches


def _new(ncols: int = 1) -> tuple[Figure, Any]:
    fig = Figure(figsize=(SIZE[0] * (1.5 if ncols > 1 else 1), SIZE[1]), layout="constrained")
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def _present(s: Any) -> bool:
    return s is not None and s.mean is not None


def _err(s: Any) -> float:
    return s.std if s.std is not None else 0.0


def _title(text: str) -> str:
    """The title, a proxy's note on a line of its own, wrapped at 80 characters."""
    lines = text.replace(" (proxy: ", "\n(proxy: ").splitlines()
    return "\n".join(textwrap.fill(line, 80, break_on_hyphens=False) for line in lines)


def _note_missing(fig: Figure, names: Sequence[str]) -> None:
    """A line under the plot naming what is missing (laid out with it, so it overlaps nothing)."""
    if names:
        fig.supxlabel(textwrap.fill("missing: " + ", ".join(map(str, names)), 120), fontsize=8, color=MISSING)


def _mark_missing(ax: Any, x: float, text: str = "missing") -> None:
    """ "missing" written upright at ``x`` along the bottom of the axes (never a zero)."""
    ax.text(x, 0.02, text, transform=ax.get_xaxis_transform(), rotation=90, ha="center", va="bottom",
            fontsize=8, color=MISSING)  # fmt: skip


def _no_data(ax: Any) -> None:
    ax.text(0.5, 0.5, "no data yet (every run missing)", transform=ax.transAxes, ha="center", va="center",
            color=MISSING)  # fmt: skip


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


def fig3(data: Mapping[str, Any], path: Path) -> Path:
    ours = [(m, t, a) for m, t, a in data["ours"]]
    paper = list(data["paper"])
    if paper and _comparable([(t.mean, a.mean) for _, t, a in ours], [(t, a) for _, t, a in paper]):
        fig, (ax,) = _new()
        _fig3_shared(ax, ours, paper)
        axes = [ax]
    else:
        fig, axes = _new(2 if paper else 1)
        _fig3_points(axes[0], axes[-1], ours, paper)
    for ax in axes:
        ax.set_xlabel(data["xlabel"])
        ax.set_ylabel(data["ylabel"])
        ax.grid(alpha=0.3)
        ax.margins(0.2)
    if not ours:
        _no_data(axes[0])
    fig.suptitle(_title(data["title"]), fontsize=11)
    _note_missing(fig, data.get("missing", []))
    fig.savefig(path, dpi=DPI)
    return path


def _fig3_points(ax_ours: Any, ax_paper: Any, ours: Sequence[Any], paper: Sequence[Any]) -> None:
    """Labelled points; the paper's on a panel of their own (``ax_paper``) when it is not ``ax_ours``."""
    xs = [t.mean for _, t, _ in ours]
    for i, (m, t, a) in enumerate(ours):
        ax_ours.errorbar(t.mean, a.mean, xerr=_err(t), yerr=_err(a), fmt="o", color=OURS, ms=7, capsize=3,
                         label="ours" if i == 0 else None)  # fmt: skip
        _label(ax_ours, m, t.mean, a.mean, xs, 5, fontsize=9, color=OURS)
    for i, (m, t, a) in enumerate(paper):
        ax_paper.plot(t, a, "s", mfc="none", mec=PAPER, mew=1.5, ms=8, label="paper" if i == 0 else None)
        _label(ax_paper, f"{m} (paper)", t, a, [t for _, t, _ in paper], -12, fontsize=8, color=PAPER)
    for ax in {id(ax_ours): ax_ours, id(ax_paper): ax_paper}.values():
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=9)
    if ax_paper is not ax_ours:
        ax_ours.set_title("ours", fontsize=10)
        ax_paper.set_title("the paper's (T_infer per TPUv4 chip)", fontsize=10)


def _fig3_shared(ax: Any, ours: Sequence[Any], paper: Sequence[Any]) -> None:
    """One plot: a colour per model, ours filled circles, the paper's hollow squares, a dotted
    line from each of ours to the paper's point of the same model; the legend names them."""
    models = list(dict.fromkeys([m for m, *_ in ours] + [m for m, *_ in paper]))
    color = {m: f"C{i}" for i, m in enumerate(models)}
    theirs = {m: (t, a) for m, t, a in paper}
    for m, t, a in ours:
        ax.errorbar(t.mean, a.mean, xerr=_err(t), yerr=_err(a), fmt="o", color=color[m], ms=7, capsize=3,
                    label=f"{m} (ours)")  # fmt: skip
        if m in theirs:
            ax.plot([t.mean, theirs[m][0]], [a.mean, theirs[m][1]], ":", color=color[m], lw=1)
    for m, t, a in paper:
        ax.plot(t, a, "s", mfc="none", mec=color[m], mew=1.5, ms=9, label=f"{m} (paper)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8,
              title="filled: ours\nhollow: the paper's", title_fontsize=8)  # fmt: skip


def fig4(data: Mapping[str, Any], path: Path) -> Path:
    fig, (ax,) = _new()
    groups, bars = data["groups"], data["bars"]
    width = 0.8 / max(len(bars), 1)
    missing, handles = [], []
    for j, (method, stats) in enumerate(bars.items()):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(groups))]
        shown = [(x, s) for x, s in zip(xs, stats, strict=True) if _present(s)]
        for x, g, s in zip(xs, groups, stats, strict=True):
            if not _present(s):
                missing.append(f"{method} / {g}")
                _mark_missing(ax, x)
        if shown:
            ax.bar([x for x, _ in shown], [s.mean for _, s in shown], width * 0.95,
                   yerr=[_err(s) for _, s in shown], capsize=3, color=f"C{j}")  # fmt: skip
            for x, s in shown:
                ax.annotate(f"{s.mean:.4g}", (x, s.mean), textcoords="offset points", xytext=(0, 3),
                            ha="center", fontsize=7)  # fmt: skip
        handles.append(Patch(color=f"C{j}", label=method if shown else f"{method} (missing)"))
    if not any(_present(s) for stats in bars.values() for s in stats):
        _no_data(ax)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(data["ylabel"])
    ax.set_title(_title(data["title"]), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.15)
    ax.legend(handles=handles, title="conversion", fontsize=9)
    _note_missing(fig, missing)
    fig.savefig(path, dpi=DPI)
    return path


def fig5(data: Mapping[str, Any], path: Path) -> Path:
    fig, (ax,) = _new()
    alphas = data["alphas"]
    missing = []
    for j, (model, line) in enumerate(data["lines"].items()):
        pts = [(a, s) for a, s in zip(alphas, line, strict=True) if _present(s)]
        missing += [f"{model} alpha {a:g}" for a, s in zip(alphas, line, strict=True) if not _present(s)]
        if pts:
            ax.errorbar([a for a, _ in pts], [s.mean for _, s in pts], yerr=[_err(s) for _, s in pts],
                        fmt="-o", color=f"C{j}", capsize=3, label=model)  # fmt: skip
    ref_name, ref = data["reference"]
    if _present(ref):
        ax.axhline(ref.mean, color="black", ls="--", lw=1.2, label=f"{ref_name} (reference)")
        if ref.std:
            ax.axhspan(ref.mean - ref.std, ref.mean + ref.std, color="black", alpha=0.08)
    elif ref_name is not None:
        missing.append(f"{ref_name} (reference)")
    if not ax.get_legend_handles_labels()[0]:
        _no_data(ax)
    else:
        ax.legend(fontsize=9)
    ax.set_xticks(alphas, [f"{a:g}" for a in alphas])
    ax.set_xlabel(data["xlabel"])
    ax.set_ylabel(data["ylabel"])
    ax.set_title(_title(data["title"]), fontsize=10)
    ax.grid(alpha=0.3)
    ax.margins(x=0.08, y=0.15)
    _note_missing(fig, missing)
    fig.savefig(path, dpi=DPI)
    return path


def fig6(data: Mapping[str, Any], path: Path) -> Path:
    fig, (ax,) = _new()
    groups = data["groups"]
    lines = data["lines"]  # one line per KV cache (report.fig6)
    drawn = 0
    for i, (cache, line) in enumerate(lines.items()):
        pts = [(g, s) for g, s in zip(groups, line, strict=True) if _present(s)]
        drawn += len(pts)
        if not pts:
            continue
        label = "ours (1 group = MQA)" if len(lines) == 1 else f"ours, {cache} KV cache"
        ax.errorbar([g for g, _ in pts], [s.mean for _, s in pts], yerr=[_err(s) for _, s in pts], marker="o",
                    color=OURS if cache == "float" else CACHE_COLORS[i % len(CACHE_COLORS)],
                    ls="-" if cache == "float" else "--", capsize=3, label=label)  # fmt: skip
    label, ref = data["reference"]
    if _present(ref):
        ax.axhline(ref.mean, color="black", ls=":", lw=1.5, label=label)
    if not drawn:
        _no_data(ax)
    else:
        ax.legend(fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xticks(groups, [str(g) for g in groups])
    ax.minorticks_off()
    ax.set_xlabel(data["xlabel"])
    ax.set_ylabel(data["ylabel"])
    ax.set_title(_title(data["title"]), fontsize=10)
    ax.grid(alpha=0.3)
    ax.margins(y=0.15)
    gone = [(c, g) for c, line in lines.items() for g, s in zip(groups, line, strict=True) if not _present(s)]
    for g in dict.fromkeys(g for _, g in gone):
        _mark_missing(ax, g)
    _note_missing(fig, [f"{g} groups" + ("" if len(lines) == 1 else f" ({c} cache)") for c, g in gone])
    fig.savefig(path, dpi=DPI)
    return path


DRAW = {"fig3": fig3, "fig4": fig4, "fig5": fig5, "fig6": fig6}


def draw(figures: Mapping[str, Mapping[str, Any]], out: str | Path) -> dict[str, Path]:
    """Each figure of ``figures`` (key -> its data) as ``out/<key>.png``; returns key -> path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {key: DRAW[key](data, out / f"{key}.png") for key, data in figures.items() if key in DRAW}
