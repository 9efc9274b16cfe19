"""Markdown shared by the parts: a cell "ours (paper)", a table, a figure's image, and the
report's opening (the runs done and the legend).

Numbers are ``stats.Stat``: ``mean`` (None: missing), ``std``, ``n``, ``expected``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax.experiments.parts.records import Record
from gqa_jax.experiments.stats import Stat

NOT_IN_SWEEP = "—"
MAX_LISTED = 40  # runs named in the "not done" line
LEGEND = (
    'Each cell is "ours (paper)". "± s, n=k": the mean and the sample standard deviation over k seeds; '
    '"n=k of m": k of the cell\'s m runs are done; "missing": none of its runs is done (a missing number '
    "is never a zero, and a mean over tasks with a task missing is missing too); "
    f'"{NOT_IN_SWEEP}": the sweep has no run for it.'
)


def fmt(s: Stat | None, kind: str = "score") -> str:
    """``43.12``, ``43.12 ± 0.20, n=3``, ``..., n=2 of 3`` (runs missing), "missing", or "—" (no run)."""
    if s is None or s.mean is None:
        return "missing" if s is not None and s.expected else NOT_IN_SWEEP
    f = {"time": "{:.3g}", "loss": "{:.3f}"}.get(kind, "{:.2f}")
    text = f.format(s.mean)
    if s.std is not None:
        text += f" ± {f.format(s.std)}, n={s.n}"
    if s.n < s.expected:
        text += (" of " if s.std is not None else f", n={s.n} of ") + str(s.expected)
    return text


def cell(s: Stat | None, paper: Any = None, kind: str = "score") -> str:
    """ "ours (paper)"; the paper's part left out where it has no number."""
    return fmt(s, kind) + ("" if paper is None else f" ({paper})")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def image(name: str, files: Mapping[str, str], title: str) -> list[str]:
    """The figure of part ``name`` (its file in ``files``), or a line saying it was not drawn."""
    return [f"![{title}]({files[name]})", ""] if name in files else ["(figure not drawn)", ""]


def proxy_note(proxy: str | None) -> list[str]:
    if not proxy:
        return []
    return [
        f"Scored on a proxy: {proxy}, the last eval/loss of the pre-/uptraining runs' "
        "metrics.jsonl; lower is better (the paper scores fine-tuned models).",
        "",
    ]


def proxy_labels(proxy: str | None, metric: str) -> tuple[str, str]:
    """(the title's suffix, the y axis's label) of a figure scored on ``metric`` or on a proxy."""
    if proxy is None:
        return "", metric
    return f" (proxy: {proxy}, lower is better)", f"{proxy} (lower is better)"


def opening(sweep: str, root: Path, records: Sequence[Record]) -> list[str]:
    """The report's first section: the sweep, the runs done and not done, the legend."""
    done = [r for r in records if r.status == "done"]
    lines = [
        f"# Report: sweep `{sweep}`",
        "",
        f"Rebuilt from the run directories under `{root}` alone (run.json, results.json, "
        "timing.json, metrics.jsonl).",
        "",
        f"Runs done: {len(done)} of {len(records)}.",
    ]
    rest = [f"{r.run.name} ({r.status})" for r in records if r.status != "done"]
    if rest:
        more = f", and {len(rest) - MAX_LISTED} more" if len(rest) > MAX_LISTED else ""
        lines.append(f"Not done: {', '.join(rest[:MAX_LISTED])}{more}.")
    return [*lines, "", LEGEND]
