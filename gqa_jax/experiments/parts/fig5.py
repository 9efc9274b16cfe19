"""Figure 5: score (the mean over tasks, or a proxy: ``paper["proxy"]["fig5"]``, lower is better)
against the uptraining proportion alpha, a line per model; the reference model's (its runs
without ``alpha``) a dashed horizontal line."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax.experiments.parts import md, plot
from gqa_jax.experiments.parts.base import Context, CsvRow, Part, csv_row
from gqa_jax.experiments.parts.records import PROXY_STAGES, Record, gather, select, task_columns, unique
from gqa_jax.experiments.stats import Stat, mean_of


@dataclasses.dataclass(frozen=True)
class Fig5:
    title: str
    xlabel: str
    ylabel: str
    alphas: tuple[float, ...]
    lines: Mapping[str, tuple[Stat, ...]]  # model -> a point per alpha
    reference: str | None  # the reference model (schema["reference"]), None without one
    reference_value: Stat  # its score (or proxy) without uptraining
    proxy: str | None

    @property
    def lower_is_better(self) -> bool:
        return self.proxy is not None


class Fig5Part(Part[Fig5]):
    name = "fig5"
    key = "fig5"
    flat_key = "alphas"

    def takes(self, context: Context) -> Mapping[str, Sequence[str]]:
        return {} if context.proxy(self.name) else {"evaluate": ("alpha",)}

    def compute(self, records: Sequence[Record], schema: Mapping[str, Any], context: Context) -> Fig5:
        proxy = context.proxy(self.name)
        ref = schema.get("reference")
        is_ref = lambda r: r.tags.get("model") == ref and "alpha" not in r.tags  # noqa: E731
        if proxy:
            stages, tags, value = PROXY_STAGES, ("model",), "loss"
            task_of = lambda r: proxy  # noqa: E731
        else:
            stages, tags, value = "evaluate", ("model", "task"), "score"
            task_of = lambda r: r.tags["task"]  # noqa: E731
        cells = gather(records, select(stages, *tags, "alpha", part=self.name),
                       lambda r: (r.tags["model"], r.tags["alpha"], task_of(r)), value)  # fmt: skip
        pick = select(stages, *tags, part=self.name)
        ref_cells = gather(records, lambda r: pick(r) and is_ref(r), task_of, value)
        tasks = [proxy] if proxy else [t for t, _ in task_columns(schema, [t for *_, t in cells])]
        alphas = unique([*schema.get("alphas", []), *sorted({a for _, a, _ in cells})])
        models = unique([*schema.get("models", []), *(m for m, _, _ in cells)])
        lines = {m: tuple(mean_of([cells.get((m, a, t), Stat(None)) for t in tasks]) for a in alphas)
                 for m in models}  # fmt: skip
        reference = mean_of([ref_cells.get(t, Stat(None)) for t in tasks]) if ref else Stat(None)
        title, ylabel = md.proxy_labels(proxy, "average score (plain mean over the tasks)")
        return Fig5(
            title="Fig. 5: uptraining fraction alpha" + title,
            xlabel="uptraining proportion alpha",
            ylabel=ylabel,
            alphas=tuple(alphas),
            lines=lines,
            reference=ref,
            reference_value=reference,
            proxy=proxy,
        )

    def markdown(self, result: Fig5, files: Mapping[str, str]) -> list[str]:
        kind = "loss" if result.lower_is_better else "score"
        rows = [[m, *(md.fmt(s, kind) for s in line)] for m, line in result.lines.items()]
        if result.reference is not None:
            rows.append([f"{result.reference} (reference)", *(md.fmt(result.reference_value, kind)
                                                               for _ in result.alphas)])  # fmt: skip
        return [
            f"## {result.title}",
            "",
            *md.image(self.name, files, result.title),
            *md.proxy_note(result.proxy),
            *md.table(["model", *(f"alpha {a:g}" for a in result.alphas)], rows),
        ]

    def csv(self, result: Fig5) -> list[CsvRow]:
        rows = [csv_row(self.name, model, f"alpha={alpha:g}", s) for model, line in result.lines.items()
                for alpha, s in zip(result.alphas, line, strict=True)]  # fmt: skip
        return [*rows, csv_row(self.name, result.reference, "reference", result.reference_value)]

    def figure(self, result: Fig5, path: Path) -> Path:
        fig, (ax,) = plot.new()
        alphas = result.alphas
        missing = []
        for j, (model, line) in enumerate(result.lines.items()):
            pts = [(a, s) for a, s in zip(alphas, line, strict=True) if plot.present(s)]
            missing += [
                f"{model} alpha {a:g}" for a, s in zip(alphas, line, strict=True) if not plot.present(s)
            ]
            if pts:
                ax.errorbar([a for a, _ in pts], [s.mean for _, s in pts], yerr=[plot.err(s) for _, s in pts],
                            fmt="-o", color=f"C{j}", capsize=3, label=model)  # fmt: skip
        ref_name, ref = result.reference, result.reference_value
        if plot.present(ref):
            ax.axhline(ref.mean, color="black", ls="--", lw=1.2, label=f"{ref_name} (reference)")
            if ref.std:
                ax.axhspan(ref.mean - ref.std, ref.mean + ref.std, color="black", alpha=0.08)
        elif ref_name is not None:
            missing.append(f"{ref_name} (reference)")
        if not ax.get_legend_handles_labels()[0]:
            plot.no_data(ax)
        else:
            ax.legend(fontsize=9)
        ax.set_xticks(alphas, [f"{a:g}" for a in alphas])
        ax.set_xlabel(result.xlabel)
        ax.set_ylabel(result.ylabel)
        ax.set_title(plot.title(result.title), fontsize=10)
        ax.grid(alpha=0.3)
        ax.margins(x=0.08, y=0.15)
        plot.note_missing(fig, missing)
        fig.savefig(path, dpi=plot.DPI)
        return path


PART = Fig5Part()
