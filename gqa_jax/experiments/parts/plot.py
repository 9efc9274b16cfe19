"""matplotlib shared by the parts' figures (Agg backend: no display needed): a new figure, its
title, and how a missing number shows (left out of the plot and named on it, never a zero).

Numbers are ``stats.Stat`` (``mean``: None when missing, ``std``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

SIZE = (7.5, 4.8)
DPI = 120
OURS = "tab:blue"
PAPER = "dimgray"
MISSING = "firebrick"


def new(ncols: int = 1) -> tuple[Figure, Any]:
    """A figure and its ``ncols`` axes side by side (wider with two)."""
    fig = Figure(figsize=(SIZE[0] * (1.5 if ncols > 1 else 1), SIZE[1]), layout="constrained")
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def present(s: Any) -> bool:
    return s is not None and s.mean is not None


def err(s: Any) -> float:
    """Its error bar: the std over seeds, 0 with one seed."""
    return s.std if s.std is not None else 0.0


def title(text: str) -> str:
    """The title, a proxy's note on a line of its own, wrapped at 80 characters."""
    lines = text.replace(" (proxy: ", "\n(proxy: ").splitlines()
    return "\n".join(textwrap.fill(line, 80, break_on_hyphens=False) for line in lines)


def note_missing(fig: Figure, names: Sequence[str]) -> None:
    """A line under the plot naming what is missing (laid out with it, so it overlaps nothing)."""
    if names:
        fig.supxlabel(textwrap.fill("missing: " + ", ".join(map(str, names)), 120), fontsize=8, color=MISSING)


def mark_missing(ax: Any, x: float, text: str = "missing") -> None:
    """ "missing" written upright at ``x`` along the bottom of the axes (never a zero)."""
    ax.text(x, 0.02, text, transform=ax.get_xaxis_transform(), rotation=90, ha="center", va="bottom",
            fontsize=8, color=MISSING)  # fmt: skip


def no_data(ax: Any) -> None:
    ax.text(0.5, 0.5, "no data yet (every run missing)", transform=ax.transAxes, ha="center", va="center",
            color=MISSING)  # fmt: skip
