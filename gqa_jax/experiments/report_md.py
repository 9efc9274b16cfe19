"""The Markdown of a sweep's report (``report.markdown``): the runs, Table 1, each figure (its
image and its numbers) and, for the mini, the paper's claims with their verdicts.

Numbers are duck-typed (``report.Stat``: ``mean`` (None: missing), ``std``, ``n``, ``expected``),
so this module imports nothing of the report's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

NOT_IN_SWEEP = "—"
MAX_LISTED = 40  # runs named in the "not done" line
LEGEND = (
    'Each cell is "ours (paper)". "± s, n=k": the mean and the sample standard deviation over k seeds; '
    '"n=k of m": k of the cell\'s m runs are done; "missing": none of its runs is done (a missing number '
    "is never a zero, and a mean over tasks with a task missing is missing too); "
    f'"{NOT_IN_SWEEP}": the sweep has no run for it.'
)


def fmt(s: Any, kind: str = "score") -> str:
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


def cell(s: Any, paper: Any = None, kind: str = "score") -> str:
    """ "ours (paper)"; the paper's part left out where it has no number."""
    return fmt(s, kind) + ("" if paper is None else f" ({paper})")


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def machine(records: Sequence[Any]) -> str:
    """The first timing.json's machine, in words."""
    for rec in records:
        m = rec.machine
        if m:
            devices = m.get("devices") or ["?"]
            return f"{m.get('backend', '?')}, {m.get('device_count', len(devices))} x {devices[0]}"
    return "unknown (no timing.json)"


def runs_section(numbers: Any) -> list[str]:
    records = numbers.records
    done = [r for r in records if r.status == "done"]
    lines = [
        f"# Report: sweep `{numbers.sweep.name}`",
        "",
        f"Rebuilt from the run directories under `{numbers.root}` alone (run.json, results.json, "
        "timing.json, metrics.jsonl).",
        "",
        f"Runs done: {len(done)} of {len(records)}.",
    ]
    rest = [f"{r.run.name} ({r.status})" for r in records if r.status != "done"]
    if rest:
        more = f", and {len(rest) - MAX_LISTED} more" if len(rest) > MAX_LISTED else ""
        lines.append(f"Not done: {', '.join(rest[:MAX_LISTED])}{more}.")
    return [*lines, "", LEGEND]


def table_section(numbers: Any) -> list[str]:
    table = numbers.table
    tasks = table["tasks"]
    header = ["model", "T_infer (s)", *(label for _, label in tasks), "Average (paper)", "plain mean"]
    rows = []
    for r in table["rows"]:
        p = r["paper"]
        rows.append([
            r["model"],
            cell(r["time"], p["time"], "time"),
            *(cell(r["scores"][t], p["scores"].get(t)) for t, _ in tasks),
            NOT_IN_SWEEP if p["average"] is None else str(p["average"]),
            cell(r["plain_mean"], None if p["plain_mean"] is None else round(p["plain_mean"], 2)),
        ])  # fmt: skip
    return [
        "## Table 1",
        "",
        f"T_infer: time per sample in seconds; ours: timing.json's time_per_sample_s (median over runs, "
        f"compile excluded) on {machine(numbers.records)}, the mean of a model's time runs (one per set of "
        "lengths); the paper's: per TPUv4 chip. Scores: the dev sets' primary metric. \"Average (paper)\" "
        'is the paper\'s own column (it does not define it); "plain mean" is the mean over the tasks, ours '
        "(the paper's).",
        *([""] + [table["note"]] if table.get("note") else []),
        "",
        *md_table(header, rows),
    ]


def _image(key: str, files: Mapping[str, str], title: str) -> list[str]:
    return [f"![{title}]({files[key]})", ""] if key in files else ["(figure not drawn)", ""]


def _proxy_note(data: Mapping[str, Any]) -> list[str]:
    if not data.get("proxy"):
        return []
    return [
        f"Scored on a proxy: {data['proxy']}, the last eval/loss of the pre-/uptraining runs' "
        "metrics.jsonl; lower is better (the paper scores fine-tuned models).",
        "",
    ]


def fig3_section(data: Mapping[str, Any], files: Mapping[str, str], numbers: Any) -> list[str]:
    rows = []
    paper = {m: (t, a) for m, t, a in data["paper"]}
    for r in numbers.table["rows"]:
        pt, pa = paper.get(r["model"], (None, None))
        rows.append([r["model"], cell(r["time"], pt, "time"), cell(r["plain_mean"], pa)])
    return [
        f"## {data['title']}",
        "",
        *_image("fig3", files, data["title"]),
        "Ours: the plain mean over the tasks; the paper's points: its Average and T_infer (hollow markers).",
        "",
        *md_table(["model", "time per sample (s)", "average score"], rows),
    ]


def fig4_section(data: Mapping[str, Any], files: Mapping[str, str]) -> list[str]:
    kind = "loss" if data.get("lower_is_better") else "score"
    rows = [[m, *(fmt(s, kind) for s in bars)] for m, bars in data["bars"].items()]
    return [
        f"## {data['title']}",
        "",
        *_image("fig4", files, data["title"]),
        *_proxy_note(data),
        *md_table(["method", *data["groups"]], rows),
        *_ranking(data, kind),
    ]


def _ranking(data: Mapping[str, Any], kind: str) -> list[str]:
    """Fig. 4's methods ranked per column, each against mean pooling (``stats.rank_methods``)."""
    ranking = data.get("ranking") or {}
    if len(data["bars"]) < 2 or "mean" not in data["bars"]:
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
            row += [f"{m} {fmt(st, kind)}" if m else "", verdict]
        rows.append(row)
    order = "lowest" if data.get("lower_is_better") else "highest"
    return [
        "",
        f"Ranked per column, {order} first. Against mean pooling (the paper's): a difference beyond the "
        "spread is larger than the two cells' standard deviations over seeds added; with one seed "
        "(or methods that give the same model on every seed, e.g. step 0 of a deterministic "
        "conversion) there is no spread to judge by.",
        "",
        *md_table(header, rows),
    ]


def fig5_section(data: Mapping[str, Any], files: Mapping[str, str]) -> list[str]:
    kind = "loss" if data.get("lower_is_better") else "score"
    rows = [[m, *(fmt(s, kind) for s in line)] for m, line in data["lines"].items()]
    ref_name, ref = data["reference"]
    if ref_name is not None:
        rows.append([f"{ref_name} (reference)", *(fmt(ref, kind) for _ in data["alphas"])])
    return [
        f"## {data['title']}",
        "",
        *_image("fig5", files, data["title"]),
        *_proxy_note(data),
        *md_table(["model", *(f"alpha {a:g}" for a in data["alphas"])], rows),
    ]


def fig6_section(data: Mapping[str, Any], files: Mapping[str, str], numbers: Any) -> list[str]:
    lines = data["lines"]
    quantized = [c for c in lines if c != "float"]
    header = ["groups", *(f"{c} cache: time per sample (s)" for c in lines)]
    header += [f"{c} / float" for c in quantized if "float" in lines]
    rows = []
    for i, g in enumerate(data["groups"]):
        row = [f"{g}" + (" (MHA)" if g == data["reference_groups"] else "")]
        row += [fmt(line[i], "time") for line in lines.values()]
        for c in quantized if "float" in lines else ():
            q, f = lines[c][i], lines["float"][i]
            row.append("missing" if q.missing or f.missing else f"{q.mean / f.mean:.3f}")
        rows.append(row)
    cache_note = (
        " The float cache holds K/V in the model's dtype (the paper's); "
        + ", ".join(quantized)
        + " stores one byte per element and a float32 scale per token and K/V head."
        if quantized
        else ""
    )
    return [
        f"## {data['title']}",
        "",
        *_image("fig6", files, data["title"]),
        f"Time: timing.json's time_per_sample_s on {machine(numbers.records)}.{cache_note}",
        "",
        *md_table(header, rows),
    ]


def claims_section(claims: Sequence[Any]) -> list[str]:
    from gqa_jax.experiments.claims import RULE

    rows = [[c.claim, c.evidence, f"**{c.verdict}**"] for c in claims]
    return ["## The paper's claims", "", RULE, "", *md_table(["claim", "numbers", "verdict"], rows)]


def render(numbers: Any, files: Mapping[str, str]) -> str:
    """The whole report; ``files``: figure key ("fig3", ...) -> its PNG's path relative to the report."""
    parts = [runs_section(numbers)]
    figs = numbers.figures
    if numbers.table is not None:
        parts.append(table_section(numbers))
    if "fig3" in figs:
        parts.append(fig3_section(figs["fig3"], files, numbers))
    if "fig4" in figs:
        parts.append(fig4_section(figs["fig4"], files))
    if "fig5" in figs:
        parts.append(fig5_section(figs["fig5"], files))
    if "fig6" in figs:
        parts.append(fig6_section(figs["fig6"], files, numbers))
    if numbers.claims is not None:
        parts.append(claims_section(numbers.claims))
    return "\n\n".join("\n".join(p) for p in parts) + "\n"
