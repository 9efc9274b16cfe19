"""The memory plan's report: ``plan.plan``'s result as markdown (the per-device table, the
largest batches, the K/V-head layout, the checks, the compile times)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gqa_jax.tools.info import attention_name, human_bytes
from gqa_jax.tools.measurement import md_table


def _unit(largest: float) -> tuple[str, int]:
    """One binary unit for a whole table: the largest that keeps its biggest number >= 1."""
    for name, power in (("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if largest >= 1024**power:
            return name, 1024**power
    return "bytes", 1


def _label(program: str) -> str:
    return "train step" if program == "train" else "decode (greedy)"


def _fits(row: dict[str, Any]) -> str:
    return "yes" if row["fits"] else ("NO (refused)" if "refused" in row else "NO")


def _slice(res: dict[str, Any]) -> str:
    """The report's words for a plan of a TPU topology (", TPU slice v4:2x4x4: libtpu's compiler,
    no TPU attached"); empty for this host's devices."""
    topology = res.get("topology")
    return f", TPU slice {topology['name']}: libtpu's compiler, no TPU attached" if topology else ""


def report(res: dict[str, Any]) -> str:
    """Markdown: the per-device table, the largest batches, the K/V-head layout, the checks."""
    unit, scale = _unit(max(r["memory"]["total"] for r in res["programs"].values()))
    sections = [_header(res, unit), _per_device(res, scale), _largest_batches(res), _layout(res)]
    sections += [_checks(res), _compiled(res)]
    return "\n\n".join("\n".join(lines) for lines in sections if lines)


def _header(res: dict[str, Any], unit: str) -> list[str]:
    """The title and what the per-device table holds: the dtypes, the options, the backend."""
    s, cfg = res["settings"], res["config"]
    N, K = cfg["num_heads"], cfg["num_kv_heads"]
    micro = f", {s['num_microbatches']} micro-batches" if s["num_microbatches"] > 1 else ""
    micro += f", remat {s['remat']}" if s.get("remat", "none") != "none" else ""
    micro += ", FSDP (also split over data)" if s.get("fsdp") else ""
    micro += ", layers scanned" if s.get("scan_layers") else ""
    decode = s.get("decode", "ours")
    micro += f"; decode {decode} (the paper's decode: an instrument)" if decode != "ours" else ""
    return [
        f"# Memory plan: {s['preset']} {attention_name(K, N)} (K = {K}, N = {N}), mesh {s['mesh']} "
        f"(data {res['mesh']['data']} x model {res['mesh']['model']}), batch {s['batch']}, "
        f"input {s['input_len']}, output {s['output_len']}",
        "",
        f"Per device, {unit}. Activations {s['dtype']}; train params and Adafactor state {s['param_dtype']}"
        f"{micro}; decode params "
        f"and KV cache {s['dtype']}"
        + (
            f" (KV cache {s['cache_dtype']}: 1-byte elements + float32 scales)"
            if s.get("cache_dtype")
            else ""
        )
        + f". Compiled ahead of time for the {res['backend']} backend "
        f"({res['device_kind']}{_slice(res)}); fits = total <= {res['hbm_gib']:g} GiB.",
    ]


def _per_device(res: dict[str, Any], scale: int) -> list[str]:
    """Per program: the bytes of each part, the total, whether it fits (or the compiler's refusal)."""
    progs = res["programs"]

    def u(n: float) -> str:
        return f"{n / scale:.2f}"

    def cache(kind: str) -> Callable[[str], str]:
        return lambda p: u(progs[p][kind]["total"]) if p == "decode" else "-"

    lines = md_table(
        [
            ("program", _label),
            ("batch", lambda p: str(progs[p]["batch"])),
            ("params", lambda p: u(progs[p]["params_bytes"])),
            ("optimizer state", lambda p: "-" if p == "decode" else u(progs[p]["optimizer_bytes"])),
            ("KV cache (formula)", cache("cache_formula")),
            ("KV cache (compiled)", cache("cache_compiled")),
            ("inputs", lambda p: u(progs[p]["inputs_bytes"])),
            ("temporaries", lambda p: u(progs[p]["memory"]["temp"])),
            ("outputs - aliased", lambda p: u(progs[p]["memory"]["output"] - progs[p]["memory"]["alias"])),
            ("total", lambda p: u(progs[p]["memory"]["total"])),
            ("fits?", lambda p: _fits(progs[p])),
        ],
        list(progs),
    )
    for p in (p for p in progs if "refused" in progs[p]):
        lines += [
            "",
            f'The TPU compiler refused the {_label(p)} at batch {progs[p]["batch"]}: "{progs[p]["refused"]}" '
            "Its temporaries are the ones it names, its total the arguments plus those (a lower bound).",
        ]
    return lines + [
        "",
        "total = argument (params + optimizer state + inputs) + output - aliased (the donated train state) "
        "+ temporaries + generated code, from `compiled.memory_analysis()` of one device. The KV cache "
        "is part of the decode loop's outputs (its final state), so the columns do not add up to the total.",
    ]


def _largest_batches(res: dict[str, Any]) -> list[str]:
    """Per program searched: the largest batch that fits, the totals either side, the line fitted
    (empty when no program was searched)."""
    searched = {p: r["largest_batch"] for p, r in res["programs"].items() if "largest_batch" in r}
    if not searched:
        return []

    def totals(p: str) -> dict[int, int]:
        return {int(k): v for k, v in searched[p]["compiled_totals"].items()}

    def its_total(p: str) -> str:
        b = searched[p]["largest_batch"]
        return human_bytes(totals(p)[b]) if b in totals(p) else "-"

    def next_total(p: str) -> str:
        b, step = searched[p]["largest_batch"], searched[p]["step"]
        nxt = b + step if b else step
        return f"{nxt}: {human_bytes(totals(p)[nxt])}" if nxt in totals(p) else "-"

    def line(p: str) -> str:
        sr = searched[p]
        return f"{human_bytes(max(0, round(sr['fixed_bytes'])))} + {human_bytes(round(sr['per_row_bytes']))}"

    lines = [f"## Largest batch that fits {res['hbm_gib']:g} GiB per device", ""]
    lines += md_table(
        [
            ("program", _label),
            ("largest batch", lambda p: str(searched[p]["largest_batch"] or "none")),
            ("its total", its_total),
            ("next batch: total", next_total),
            ("line: fixed + per row", line),
            ("how", lambda p: searched[p]["how"]),
        ],
        list(searched),
    )
    if "train" in searched and searched["train"]["largest_batch"] < res["settings"]["batch"]:
        lines += [
            "",
            "The train step does not fit at the requested batch: `--num-microbatches M` accumulates "
            "gradients over M slices of the batch (the same update), so only one slice's activations "
            "are live; params, optimizer state and gradients stay.",
        ]
    return lines


def _layout(res: dict[str, Any]) -> list[str]:
    """How the parameters and the KV cache lie on the mesh (replicated or split)."""
    lines = ["## K/V heads on the mesh", ""]
    lines.append(f"- parameters: {res['replication']['params_report']}".replace("\n", "\n- parameters: "))
    if "decode" not in res["programs"]:
        return lines
    d = res["programs"]["decode"]
    for kind in ("self", "cross"):
        lay = d["cache_layout"][kind]
        lines.append(
            f"- KV cache {kind}: {human_bytes(lay['total_bytes'])} in all, spec {lay['spec']}, "
            f"{lay['shards']} shard(s): {human_bytes(d['cache_formula'][kind])} per device by the "
            "formula; "
            f"compiled: spec {d['cache_compiled_specs'][kind]}, {human_bytes(d['cache_compiled'][kind])}"
        )
    lines.append(f"- KV cache: {d['cache_report'] or 'no replication (the decode layout, docs/sharding.md)'}")
    if "cross_kv_projection" in d:  # the paper's decode: no cross cache, its projection per step
        where = d["cross_kv_projection"]
        lines.append(
            f"- cross K/V projected per step (the paper's decode): {where['placement']} "
            f"({sum(p['in_loop'] for p in where['products'])} of {len(where['products'])} products in the "
            f"compiled decode loop's computations; the loop carries {where.get('carried')} values of their "
            "dtype and size)"
        )
    if "one_hot_write" in d:  # the paper's decode: the whole cache read and written per layer and step
        fusions = d["one_hot_write"]["products"]
        lines.append(
            f"- one-hot cache write (the paper's decode): {d['one_hot_write']['placement']}, "
            f"{sum(f['in_loop'] for f in fusions)} fusions in the loop's computations"
        )
    if d.get("prefill_rows"):
        lines.append(
            f"- prefill: the encoder takes {d['prefill_rows']} rows at a time, "
            f"{d['batch'] // d['prefill_rows']} chunks (the TPU compiler's limit on its attention "
            "logits, decode_inputs.MAX_ENCODER_LOGITS)"
        )
    return lines


def _checks(res: dict[str, Any]) -> list[str]:
    """Each check of compiled bytes against the expected (the shardings, the cache formula)."""
    return [
        "## Checks (bytes per device)",
        "",
        *md_table(
            [
                ("program", lambda c: c["program"]),
                ("check", lambda c: c["what"]),
                ("expected", lambda c: f"{c['expected']:,}"),
                ("compiled", lambda c: f"{c['compiled']:,}"),
                ("ok", lambda c: "yes" if c["ok"] else "NO"),
            ],
            res["checks"],
        ),
    ]


def _compiled(res: dict[str, Any]) -> list[str]:
    """Each compile's program, batch and time, and the plan's wall time."""
    compiles = [(p, c) for p, r in res["programs"].items() for c in r["compiles"]]
    listed = ", ".join(f"{p} at batch {c['batch']} ({c['compile_s']:.0f} s)" for p, c in compiles)
    return [f"Compiled: {listed}; wall {res['wall_s']:.0f} s."]
