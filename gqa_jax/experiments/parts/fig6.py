"""Figure 6: time per sample against the number of groups (time runs tagged ``groups``) on a log
x axis, a line per KV cache; ``groups == reference_groups`` is MHA, a dotted horizontal line.

Time runs tagged ``cache`` (a quantized dtype, e.g. int8) draw that cache's line (dashed), the
others the float cache's (the model's dtype, the paper's). Each point is the median of its run's
timing repeats, its error bar their sample std; the table beside it gives the prefill's share of
each time (timing.json prefill_times_s), what a flat line is made of. The decoder's steps timed
alone (timing.json steps_times_s) are a second point per group (hollow), and a second table sets
every cell beside the bytes model of a decoder step (``parts.time_model``), against MHA with the
same cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax.experiments.parts import md, plot, time_model
from gqa_jax.experiments.parts.base import Context, CsvRow, Part, csv_row
from gqa_jax.experiments.parts.records import FLOOR_NOTE, Record, gather_times, select, time_source, unique
from gqa_jax.experiments.stats import Stat

FLOAT_CACHE = "float"  # the line of the time runs without a "cache" tag (the model's dtype)
CACHE_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")  # the quantized caches' lines


@dataclasses.dataclass(frozen=True)
class Fig6:
    title: str
    xlabel: str
    ylabel: str
    groups: tuple[int, ...]
    lines: Mapping[str, tuple[Stat, ...]]  # KV cache -> a time per group; the float cache's first
    prefills: Mapping[str, tuple[Stat, ...]]  # KV cache -> the prefill's time per group (as lines)
    floors: Mapping[str, tuple[Stat, ...]]  # KV cache -> a predicted time's read-once floor per group
    reference_groups: int | None  # MHA's number of groups
    reference_label: str
    reference: Stat  # MHA's time, the float cache's
    source: str  # what the times are (measured where, or predicted for which TPU slice), in words
    steps: Mapping[str, tuple[Stat, ...]] = dataclasses.field(default_factory=dict)  # decoder steps alone
    reads: Mapping[str, tuple[time_model.Reads, ...]] = dataclasses.field(default_factory=dict)  # bytes model

    @property
    def times(self) -> tuple[Stat, ...]:
        """The float cache's line."""
        return self.lines.get(FLOAT_CACHE, (Stat(None),) * len(self.groups))


class Fig6Part(Part[Fig6]):
    name = "fig6"
    key = "fig6"
    flat_key = "reference_groups"

    def takes(self, context: Context) -> Mapping[str, Sequence[str]]:
        return {"time": ("groups",)}

    def compute(self, records: Sequence[Record], schema: Mapping[str, Any], context: Context) -> Fig6:
        key = lambda r: (r.tags.get("cache", FLOAT_CACHE), r.tags["groups"])  # noqa: E731
        pick = select("time", "groups", part=self.name)
        cells = gather_times(records, pick, key)
        prefill_cells = gather_times(records, pick, key, "prefill_times")
        floor_cells = gather_times(records, pick, key, "floor_times")
        steps_cells = gather_times(records, pick, key, "steps_times")
        reads = time_model.reads_of(records, pick, key)
        groups = unique([*schema.get("groups", []), *sorted(g for _, g in cells)])
        caches = unique([*schema.get("caches", [FLOAT_CACHE]), *(c for c, _ in cells)])
        ref = schema.get("reference_groups", max(groups, default=None))
        lengths = (
            f" (input {schema['input_len']}, output {schema['output_len']})" if "input_len" in schema else ""
        )
        return Fig6(
            title="Fig. 6: time per sample vs number of groups" + lengths,
            xlabel="number of groups (K/V heads; log scale)",
            ylabel="time per sample (s)",
            groups=tuple(groups),
            lines={c: tuple(cells.get((c, g), Stat(None)) for g in groups) for c in caches},
            prefills={c: tuple(prefill_cells.get((c, g), Stat(None)) for g in groups) for c in caches},
            floors={c: tuple(floor_cells.get((c, g), Stat(None)) for g in groups) for c in caches},
            reference_groups=ref,
            reference_label=f"MHA ({ref} groups)",
            reference=cells.get((FLOAT_CACHE, ref), Stat(None)),
            source=time_source([r for r in records if pick(r.run)]),
            steps={c: tuple(steps_cells.get((c, g), Stat(None)) for g in groups) for c in caches},
            reads={c: tuple(reads.get((c, g), time_model.Reads()) for g in groups) for c in caches},
        )

    def markdown(self, result: Fig6, files: Mapping[str, str]) -> list[str]:
        lines = result.lines
        quantized = [c for c in lines if c != FLOAT_CACHE]
        header = ["groups", *(f"{c} cache: time per sample (s)" for c in lines)]
        header += [f"{c} / {FLOAT_CACHE}" for c in quantized if FLOAT_CACHE in lines]
        floors = [c for c in lines if any(not f.missing for f in result.floors[c])]
        header += [f"{c} cache: read-once floor (s)" for c in floors]
        shares = [c for c in lines if any(not p.missing for p in result.prefills[c])]
        header += [f"{c} cache: prefill's share" for c in shares]
        rows = []
        for i, g in enumerate(result.groups):
            row = [f"{g}" + (" (MHA)" if g == result.reference_groups else "")]
            row += [md.fmt(line[i], "time") for line in lines.values()]
            for c in quantized if FLOAT_CACHE in lines else ():
                q, f = lines[c][i], lines[FLOAT_CACHE][i]
                row.append("missing" if q.missing or f.missing else f"{q.mean / f.mean:.3f}")
            row += [md.fmt(result.floors[c][i], "time") for c in floors]
            for c in shares:
                t, p = lines[c][i], result.prefills[c][i]
                row.append("missing" if t.missing or p.missing else f"{p.mean / t.mean:.0%}")
            rows.append(row)
        cache_note = (
            " The float cache holds K/V in the model's dtype (the paper's); "
            + ", ".join(quantized)
            + " stores one byte per element and a float32 scale per token and K/V head."
            if quantized
            else ""
        )
        return [
            f"## {result.title}",
            "",
            *md.image(self.name, files, result.title),
            f"Time: {result.source}.{cache_note}"
            + (f" {FLOOR_NOTE}" if floors else "")
            + (
                " The prefill's share: the median time of the prefill alone (encoder, cross K/V, the "
                "empty cache; timing.json's prefill_times_s) over the whole time; the rest is the "
                "decoder's steps, the part the number of groups changes."
                if shares
                else ""
            ),
            "",
            *md.table(header, rows),
            *bytes_model(result),
        ]

    def csv(self, result: Fig6) -> list[CsvRow]:
        rows = []
        for cache, line in result.lines.items():
            suffix = "" if cache == FLOAT_CACHE else f"[{cache} cache]"
            columns = {
                "time_per_sample_s": line,  # always, missing or not; the others where present
                "prefill_s": result.prefills.get(cache, ()),
                "steps_s": result.steps.get(cache, ()),
                "floor_s": result.floors.get(cache, ()),
            }
            for column, stats in columns.items():
                if column == "time_per_sample_s" or any(not s.missing for s in stats):
                    pairs = zip(result.groups, stats, strict=True)
                    rows += [csv_row(self.name, f"groups={g}", column + suffix, s) for g, s in pairs]
        return rows

    def figure(self, result: Fig6, path: Path) -> Path:
        fig, (ax,) = plot.new()
        groups, lines = result.groups, result.lines
        drawn = 0
        for i, (cache, line) in enumerate(lines.items()):
            label = "ours (1 group = MQA)" if len(lines) == 1 else f"ours, {cache} KV cache"
            color = plot.OURS if cache == FLOAT_CACHE else CACHE_COLORS[i % len(CACHE_COLORS)]
            drawn += _line(
                ax, groups, line, color=color, ls="-" if cache == FLOAT_CACHE else "--", label=label
            )
            steps_label = "decoder steps alone" + ("" if len(lines) == 1 else f", {cache} KV cache")
            steps = result.steps.get(cache, (Stat(None),) * len(groups))
            _line(ax, groups, steps, color=color, ls=":", label=steps_label, mfc="white", lw=1, capsize=2)
        if plot.present(result.reference):
            ax.axhline(result.reference.mean, color="black", ls=":", lw=1.5, label=result.reference_label)
        if not drawn:
            plot.no_data(ax)
        else:
            ax.legend(fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xticks(groups, [str(g) for g in groups])
        ax.minorticks_off()
        ax.set_xlabel(result.xlabel)
        ax.set_ylabel(result.ylabel)
        ax.set_title(plot.title(result.title), fontsize=10)
        ax.grid(alpha=0.3)
        ax.margins(y=0.15)
        gone = [
            (c, g)
            for c, line in lines.items()
            for g, s in zip(groups, line, strict=True)
            if not plot.present(s)
        ]
        for g in dict.fromkeys(g for _, g in gone):
            plot.mark_missing(ax, g)
        plot.note_missing(
            fig, [f"{g} groups" + ("" if len(lines) == 1 else f" ({c} cache)") for c, g in gone]
        )
        fig.savefig(path, dpi=plot.DPI)
        return path


def bytes_model(result: Fig6) -> list[str]:
    """Every measured cell beside the bytes model, against MHA's (``reference_groups``) with the
    same cache; none where no cell has a time."""
    cells = []
    for cache, line in result.lines.items():
        steps = result.steps.get(cache, (Stat(None),) * len(line))
        reads = result.reads.get(cache, (time_model.Reads(),) * len(line))
        timed = [
            time_model.Timed(f"{cache}, {g}" + (" (MHA)" if g == result.reference_groups else ""), t, st, r)
            for g, t, st, r in zip(result.groups, line, steps, reads, strict=True)
        ]
        ref = next(
            (c for g, c in zip(result.groups, timed, strict=True) if g == result.reference_groups), None
        )
        cells += [(c, ref) for c, t in zip(timed, line, strict=True) if not t.missing]
    if not cells:
        return []
    title = "Each time against the bytes model, against MHA with the same cache."
    return ["", *time_model.table("cache, groups", cells, title)]


def _line(ax: Any, groups: Sequence[int], line: Sequence[Stat], **style: Any) -> int:
    """The present points of ``line`` with their error bars; how many were drawn."""
    pts = [(g, s) for g, s in zip(groups, line, strict=True) if plot.present(s)]
    if pts:
        ax.errorbar([g for g, _ in pts], [s.mean for _, s in pts], yerr=[plot.err(s) for _, s in pts],
                    **{"marker": "o", "capsize": 3, **style})  # fmt: skip
    return len(pts)


PART = Fig6Part()
