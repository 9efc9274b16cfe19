"""The report of a sweep, rebuilt from its run directories alone: ``report.md`` (Markdown),
``report.csv`` (one row per number) and the figures' PNGs (``figures``), in the paper's layout.

Pipeline: :func:`collect` (ROOT/<run>/run.json, results.json, timing.json, metrics.jsonl) ->
:func:`compute` (the numbers of Table 1 and Figures 3-6, and the mini's claims) ->
:func:`markdown` / :func:`csv_rows` -> ``figures.draw``. :func:`write_report` does all of it.

What counts (``docs/experiments.md`` has the rules in full):

- a run counts when its run.json says ``"status": "done"`` and it has the file its number comes
  from; a run of the sweep that does not is *missing* (shown as "missing", never as zero);
- scores: ``results.json["primary"]`` of ``evaluate`` runs; times:
  ``timing.json["time_per_sample_s"]`` of ``time`` runs; a proxy (``Sweep.paper["proxy"]``):
  the last ``eval/loss`` in the metrics.jsonl of ``pretrain`` / ``uptrain`` runs (lower is better);
- a cell is the mean and sample standard deviation (ddof 1) over its runs (seeds); a mean over
  tasks is missing when a task is, and its spread is that of the per-seed means over tasks.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax.experiments import claims as claims_lib
from gqa_jax.experiments.stats import Stat, mean_of, rank_methods, stat
from gqa_jax.experiments.sweep import Run, Sweep

PARTS = ("table1", "fig4", "fig5", "fig6")  # Sweep.paper keys of the mini (Fig. 3 is Table 1's)
BY_NAME = {"table1": "table1", "fig4_conversion": "fig4", "fig5_alpha": "fig5", "fig6_groups": "fig6"}
BY_KEY = {"rows": "table1", "methods": "fig4", "alphas": "fig5", "reference_groups": "fig6"}
FLOAT_CACHE = "float"  # Fig. 6's line of the time runs without a "cache" tag (the model's dtype)
PROXY_STAGES = ("pretrain", "uptrain")  # their metrics.jsonl holds the dev span-corruption loss
CSV_COLUMNS = ("section", "row", "column", "ours_mean", "ours_std", "n_seeds", "paper")


# ---------------------------------------------------------------------------------- collect
@dataclasses.dataclass(frozen=True)
class Record:
    """What a run's directory holds: its run.json status and the numbers the report reads."""

    run: Run
    status: str  # "done", "failed", ... from run.json; "not run" without one
    score: float | None = None  # results.json primary
    time: float | None = None  # timing.json time_per_sample_s
    loss: float | None = None  # last eval/loss of metrics.jsonl
    start_loss: float | None = None  # eval/loss at step 0 (eval_at_start: the converted model's)
    machine: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def eval_losses(path: Path) -> tuple[float | None, float | None]:
    """``(eval/loss at step 0, the last eval/loss)`` of a metrics.jsonl (None where there is none)."""
    if not path.is_file():
        return None, None
    from gqa_jax.metric_writers import read_metrics

    rows = [r for r in read_metrics(path) if "eval/loss" in r]
    start = [r["eval/loss"] for r in rows if r.get("step") == 0]
    return (_finite(start[0]) if start else None), (_finite(rows[-1]["eval/loss"]) if rows else None)


def read_run(root: Path, run: Run) -> Record:
    d = root / run.name
    info = _json(d / "run.json")
    if info is None:
        return Record(run, "not run")
    status = str(info.get("status", "unknown"))
    if status != "done":
        return Record(run, status)
    results, timing = _json(d / "results.json") or {}, _json(d / "timing.json") or {}
    start, last = eval_losses(d / "metrics.jsonl") if run.stage in PROXY_STAGES else (None, None)
    return Record(
        run,
        status,
        score=_finite(results.get("primary")),
        time=_finite(timing.get("time_per_sample_s")),
        loss=last,
        start_loss=start,
        machine=timing.get("machine") or {},
    )


def collect(sweep: Sweep, root: str | Path) -> list[Record]:
    """One record per run of the sweep; ValueError when none of them has a run directory."""
    root = Path(root)
    if not any((root / r.name / "run.json").is_file() for r in sweep.runs):
        raise ValueError(
            f"--root {root} holds no run directory of sweep {sweep.name} (no {root}/<run name>/run.json "
            f"for any of its {len(sweep.runs)} runs): run the sweep first "
            f"(python -m gqa_jax sweep <sweep file> --root {root})"
        )
    return [read_run(root, r) for r in sweep.runs]


# ---------------------------------------------------------------------------------- parts
def schemas(sweep: Sweep) -> dict[str, Mapping[str, Any]]:
    """Part ("table1", "fig4", "fig5", "fig6") -> its Sweep.paper schema: the mini nests them
    under those keys (all four, {} where it gives none); the others are one part each."""
    paper = sweep.paper
    nested = {k: paper[k] for k in PARTS if isinstance(paper.get(k), Mapping)}
    if nested or sweep.name == "mini":
        return {k: nested.get(k, {}) for k in PARTS}
    if sweep.name in BY_NAME:
        return {BY_NAME[sweep.name]: paper}
    for key, part in BY_KEY.items():
        if key in paper:
            return {part: paper}
    raise ValueError(
        f"sweep {sweep.name}: nothing to report: its name is none of {', '.join([*BY_NAME, 'mini'])} "
        f"and its paper dict has none of the keys {', '.join(BY_KEY)}"
    )


def in_part(run: Run, part: str, exclude: Sequence[str] = ()) -> bool:
    """A run tagged ``figure`` (a part or a list of parts) belongs to those only; else to any
    part whose selection it passes, less runs tagged with a key of ``exclude``."""
    figure = run.tags.get("figure")
    if figure is not None:
        return part in ([figure] if isinstance(figure, str) else list(figure))
    return not any(k in run.tags for k in exclude)


def gather(
    records: Sequence[Record], select: Callable[[Run], bool], key: Callable[[Run], Any], value: str
) -> dict[Any, Stat]:
    """Cells: the selected runs grouped by ``key``, each a Stat of their ``value`` attribute over
    seeds (``tags["seed"]``, else the run's place in its cell); keys in the sweep's order."""
    groups: dict[Any, list[Record]] = {}
    for rec in records:
        if select(rec.run):
            groups.setdefault(key(rec.run), []).append(rec)
    out = {}
    for k, recs in groups.items():
        values = {}
        for i, rec in enumerate(recs):
            v = getattr(rec, value) if rec.status == "done" else None
            if v is not None:
                values[rec.run.tags.get("seed", i)] = v
        out[k] = stat(values, len(recs))
    return out


def _unique(items: Any) -> list[Any]:
    return list(dict.fromkeys(items))


def _tasks(schema: Mapping[str, Any], found: Sequence[str]) -> list[tuple[str, str]]:
    """(task, column label): the schema's, in its order, then tasks only the runs have."""
    tasks = [(t[0], t[1]) for t in schema.get("tasks", [])]
    return tasks + [(t, t) for t in _unique(found) if t not in dict(tasks)]


def _proxy(sweep: Sweep, part: str) -> str | None:
    proxy = sweep.paper.get("proxy") or {}
    return proxy.get(part) if isinstance(proxy, Mapping) else None


def _runs(stage: str | Sequence[str], *tags: str, part: str = "", exclude: Sequence[str] = ()):
    stages = (stage,) if isinstance(stage, str) else tuple(stage)
    return lambda r: r.stage in stages and all(t in r.tags for t in tags) and in_part(r, part, exclude)


def table1(
    records: Sequence[Record], schema: Mapping[str, Any], exclude: Sequence[str] = (), nested: bool = False
) -> dict[str, Any]:
    """Table 1: per model, T_infer (the mean of its time runs' cells: one per set of lengths),
    the tasks' scores and their plain mean; the paper's numbers beside them. ``exclude``: tags
    of evaluate runs that are not the table's; ``nested`` (the mini): time runs tagged
    ``groups`` are Fig. 6's, unless no other time run has a model tag."""
    select = _runs("evaluate", "model", "task", part="table1", exclude=exclude)
    scores = gather(records, select, lambda r: (r.tags["model"], r.tags["task"]), "score")
    timed = _runs("time", "model", part="table1", exclude=["groups"] if nested else [])
    if nested and not any(timed(rec.run) for rec in records):
        timed = _runs("time", "model", part="table1")
    rest = lambda r: tuple(sorted((k, str(v)) for k, v in r.tags.items() if k not in ("model", "seed")))  # noqa: E731
    times = gather(records, timed, lambda r: (r.tags["model"], rest(r)), "time")
    tasks = _tasks(schema, [t for _, t in scores])
    paper_rows = schema.get("rows", {})
    models = _unique([*paper_rows, *(m for m, _ in scores), *(m for m, _ in times)])
    rows = []
    for m in models:
        cells = {t: scores.get((m, t), Stat(None)) for t, _ in tasks}
        time_cells = [s for (mm, _), s in times.items() if mm == m]
        paper = paper_rows.get(m, {})
        paper_scores = paper.get("scores", {})
        paper_mean = [paper_scores.get(t) for t, _ in tasks]
        rows.append({
            "model": m,
            "time": mean_of(time_cells) if time_cells else Stat(None),
            "scores": cells,
            "plain_mean": mean_of(list(cells.values())),
            "paper": {
                "time": paper.get("time"),
                "average": paper.get("average"),
                "scores": paper_scores,
                "plain_mean": None if None in paper_mean or not tasks else statistics.fmean(paper_mean),
            },
        })  # fmt: skip
    return {"tasks": tasks, "rows": rows, "note": schema.get("note")}


def fig3(table: Mapping[str, Any]) -> dict[str, Any]:
    """Figure 3 from Table 1: average score against time per sample, ours and the paper's."""
    ours = [(r["model"], r["time"], r["plain_mean"]) for r in table["rows"]]
    paper = [
        (r["model"], r["paper"]["time"], r["paper"]["average"])
        for r in table["rows"]
        if r["paper"]["time"] is not None and r["paper"]["average"] is not None
    ]
    return {
        "title": "Fig. 3: average score vs time per sample",
        "xlabel": "time per sample (s)",
        "ylabel": "average score (plain mean over the tasks)",
        "ours": [p for p in ours if not p[1].missing and not p[2].missing],
        "missing": [p[0] for p in ours if p[1].missing or p[2].missing],
        "paper": paper,
    }


def _proxy_labels(proxy: str | None, metric: str) -> tuple[str, str]:
    if proxy is None:
        return "", metric
    return f" (proxy: {proxy}, lower is better)", f"{proxy} (lower is better)"


def fig4(records: Sequence[Record], schema: Mapping[str, Any], proxy: str | None) -> dict[str, Any]:
    """Figure 4: a bar per conversion method per task (and their mean), or of the proxy."""
    if proxy:
        select = _runs(PROXY_STAGES, "method", part="fig4")
        cells = gather(records, select, lambda r: (r.tags["method"], proxy), "loss")
        tasks = [(proxy, "dev loss")]
        starts = gather(records, select, lambda r: (r.tags["method"], "converted"), "start_loss")
        if any(st.n for st in starts.values()):  # evaluated at step 0 too: the converted model, first
            cells |= starts
            tasks = [("converted", "converted (step 0)"), (proxy, "uptrained")]
    else:
        select = _runs("evaluate", "method", "task", part="fig4")
        cells = gather(records, select, lambda r: (r.tags["method"], r.tags["task"]), "score")
        tasks = _tasks(schema, [t for _, t in cells])
    methods = _unique([*schema.get("methods", []), *(m for m, _ in cells)])
    bars = {m: [cells.get((m, t), Stat(None)) for t, _ in tasks] for m in methods}
    groups = [label for _, label in tasks]
    if len(tasks) > 1 and not proxy:  # a mean over tasks (not over the proxy's two steps)
        groups.append("mean")
        bars = {m: [*b, mean_of(b)] for m, b in bars.items()}
    title, ylabel = _proxy_labels(proxy, "score")
    return {
        "title": f"Fig. 4: conversion methods (MQA, {' / '.join(methods)})" + title,
        "ylabel": ylabel,
        "groups": groups,
        "columns": [t for t, _ in tasks] + (["mean"] if len(tasks) > 1 and not proxy else []),
        "bars": bars,
        "ranking": rank_methods(bars, groups, lower_is_better=proxy is not None),
        "proxy": proxy,
        "lower_is_better": proxy is not None,
    }


def fig5(records: Sequence[Record], schema: Mapping[str, Any], proxy: str | None) -> dict[str, Any]:
    """Figure 5: score (the mean over tasks, or the proxy) against alpha per model, and the
    reference model's (no alpha) as a horizontal line."""
    ref = schema.get("reference")
    is_ref = lambda r: r.tags.get("model") == ref and "alpha" not in r.tags  # noqa: E731
    if proxy:
        stages, tags, value = PROXY_STAGES, ("model",), "loss"
        task_of = lambda r: proxy  # noqa: E731
    else:
        stages, tags, value = "evaluate", ("model", "task"), "score"
        task_of = lambda r: r.tags["task"]  # noqa: E731
    cells = gather(records, _runs(stages, *tags, "alpha", part="fig5"),
                   lambda r: (r.tags["model"], r.tags["alpha"], task_of(r)), value)  # fmt: skip
    pick = _runs(stages, *tags, part="fig5")
    ref_cells = gather(records, lambda r: pick(r) and is_ref(r), task_of, value)
    tasks = [proxy] if proxy else [t for t, _ in _tasks(schema, [t for *_, t in cells])]
    alphas = _unique([*schema.get("alphas", []), *sorted({a for _, a, _ in cells})])
    models = _unique([*schema.get("models", []), *(m for m, _, _ in cells)])
    lines = {m: [mean_of([cells.get((m, a, t), Stat(None)) for t in tasks]) for a in alphas] for m in models}
    reference = mean_of([ref_cells.get(t, Stat(None)) for t in tasks]) if ref else Stat(None)
    title, ylabel = _proxy_labels(proxy, "average score (plain mean over the tasks)")
    return {
        "title": "Fig. 5: uptraining fraction alpha" + title,
        "xlabel": "uptraining proportion alpha",
        "ylabel": ylabel,
        "alphas": alphas,
        "lines": lines,
        "reference": (ref, reference),
        "proxy": proxy,
        "lower_is_better": proxy is not None,
    }


def fig6(records: Sequence[Record], schema: Mapping[str, Any]) -> dict[str, Any]:
    """Figure 6: time per sample against the number of groups; groups == reference_groups is MHA.
    One line per KV cache: time runs tagged ``cache`` (a quantized dtype, e.g. int8) draw that
    cache's line, the others the float cache's (the model's dtype, the paper's); ``times`` and
    ``reference`` are the float line's."""
    key = lambda r: (r.tags.get("cache", FLOAT_CACHE), r.tags["groups"])  # noqa: E731
    cells = gather(records, _runs("time", "groups", part="fig6"), key, "time")
    groups = _unique([*schema.get("groups", []), *sorted(g for _, g in cells)])
    caches = _unique([*schema.get("caches", [FLOAT_CACHE]), *(c for c, _ in cells)])
    ref = schema.get("reference_groups", max(groups, default=None))
    lengths = (
        f" (input {schema['input_len']}, output {schema['output_len']})" if "input_len" in schema else ""
    )
    lines = {c: [cells.get((c, g), Stat(None)) for g in groups] for c in caches}
    return {
        "title": "Fig. 6: time per sample vs number of groups" + lengths,
        "xlabel": "number of groups (K/V heads; log scale)",
        "ylabel": "time per sample (s)",
        "groups": groups,
        "times": lines.get(FLOAT_CACHE, [Stat(None)] * len(groups)),
        "lines": lines,
        "reference_groups": ref,
        "reference": (f"MHA ({ref} groups)", cells.get((FLOAT_CACHE, ref), Stat(None))),
    }


@dataclasses.dataclass
class Numbers:
    """Everything the report shows: the runs' records, Table 1, the figures' data, the claims."""

    sweep: Sweep
    root: Path
    records: list[Record]
    table: dict[str, Any] | None = None
    figures: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    claims: list[claims_lib.Claim] | None = None


def compute(sweep: Sweep, root: str | Path, records: Sequence[Record] | None = None) -> Numbers:
    """The report's numbers: the parts the sweep has data kinds for (mini: all, and its claims)."""
    root = Path(root)
    records = list(collect(sweep, root) if records is None else records)
    parts = schemas(sweep)
    nested = set(parts) == set(PARTS)
    numbers = Numbers(sweep, root, records)
    if "table1" in parts:
        # In the mini, evaluate runs tagged method / alpha belong to Fig. 4 / 5 (unless proxied).
        exclude = [k for k, p in (("method", "fig4"), ("alpha", "fig5")) if nested and not _proxy(sweep, p)]
        numbers.table = table1(records, parts["table1"], exclude, nested)
        numbers.figures["fig3"] = fig3(numbers.table)
    if "fig4" in parts:
        numbers.figures["fig4"] = fig4(records, parts["fig4"], _proxy(sweep, "fig4"))
    if "fig5" in parts:
        numbers.figures["fig5"] = fig5(records, parts["fig5"], _proxy(sweep, "fig5"))
    if "fig6" in parts:
        numbers.figures["fig6"] = fig6(records, parts["fig6"])
    if nested:
        numbers.claims = claims_lib.claims(numbers.table, numbers.figures)
    return numbers


# ---------------------------------------------------------------------------------- output
def csv_rows(numbers: Numbers) -> list[tuple[Any, ...]]:
    """(section, row, column, ours_mean, ours_std, n_seeds, paper): every number of the tables
    and of every figure; ours_mean empty and n_seeds 0 where missing."""
    rows: list[tuple[Any, ...]] = []

    def add(section: str, row: Any, column: Any, s: Stat | None, paper: Any = None) -> None:
        s = s or Stat(None)
        rows.append((section, row, column, s.mean, s.std, s.n, paper))

    if numbers.table:
        for r in numbers.table["rows"]:
            p = r["paper"]
            add("table1", r["model"], "T_infer_s", r["time"], p["time"])
            for t, _ in numbers.table["tasks"]:
                add("table1", r["model"], t, r["scores"][t], p["scores"].get(t))
            add("table1", r["model"], "paper_average", None, p["average"])
            add("table1", r["model"], "plain_mean", r["plain_mean"], p["plain_mean"])
    figs = numbers.figures
    if "fig3" in figs:
        paper = {m: (t, a) for m, t, a in figs["fig3"]["paper"]}
        for r in numbers.table["rows"]:
            pt, pa = paper.get(r["model"], (None, None))
            add("fig3", r["model"], "time_per_sample_s", r["time"], pt)
            add("fig3", r["model"], "average_score", r["plain_mean"], pa)
    if "fig4" in figs:
        for method, bars in figs["fig4"]["bars"].items():
            for column, s in zip(figs["fig4"]["columns"], bars, strict=True):
                add("fig4", method, column, s)
    if "fig5" in figs:
        for model, line in figs["fig5"]["lines"].items():
            for alpha, s in zip(figs["fig5"]["alphas"], line, strict=True):
                add("fig5", model, f"alpha={alpha:g}", s)
        ref, s = figs["fig5"]["reference"]
        add("fig5", ref, "reference", s)
    if "fig6" in figs:
        for cache, line in figs["fig6"]["lines"].items():
            column = "time_per_sample_s" + ("" if cache == FLOAT_CACHE else f"[{cache} cache]")
            for g, s in zip(figs["fig6"]["groups"], line, strict=True):
                add("fig6", f"groups={g}", column, s)
    return rows


def write_csv(rows: Sequence[tuple[Any, ...]], path: Path) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow(["" if v is None else repr(v) if isinstance(v, float) else v for v in row])
    path.write_text(buf.getvalue())


def markdown(numbers: Numbers, figure_files: Mapping[str, str] | None = None) -> str:
    """The Markdown report: runs, Table 1, each figure (image + numbers), the claims."""
    from gqa_jax.experiments import report_md

    return report_md.render(numbers, figure_files or {})


def write_report(sweep: Sweep, root: str | Path, out: str | Path | None = None) -> dict[str, Path]:
    """Write report.md, report.csv and the figures' PNGs into ``out`` (default ROOT/report);
    returns what was written (name -> path)."""
    from gqa_jax.experiments import figures

    numbers = compute(sweep, root)
    out = Path(out) if out is not None else Path(root) / "report"
    out.mkdir(parents=True, exist_ok=True)
    written = {name: path for name, path in figures.draw(numbers.figures, out).items()}
    write_csv(csv_rows(numbers), out / "report.csv")
    (out / "report.md").write_text(markdown(numbers, {k: p.name for k, p in written.items()}))
    return {"report.md": out / "report.md", "report.csv": out / "report.csv", **written}
