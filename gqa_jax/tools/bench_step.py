"""``python -m gqa_jax bench step``: where a decode step's time goes, op by op.

For each model (the random MHA model of a preset and its ``mean`` conversions, as in ``bench
decode``), the fused greedy loop (the jitted ``while_loop`` that ``greedy_decode`` runs) is
compiled once, run once to warm up and once under ``jax.profiler``. The trace's op events are
matched by name to the compiled HLO; the ops of the decode loop's body (the ``while`` body whose
ops ran once per step) are grouped by source line, op, output shape and largest input, with ms,
MB and GB/s per step (``tools.hlo_profile``).

The loop's wall time per step is the span from its first op's start to its last op's end over
the steps; the difference to the summed op times is time outside any op (the runtime between
ops, or ops overlapping when it is negative).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gqa_jax import cache as kvcache
from gqa_jax import decoding
from gqa_jax.config import preset
from gqa_jax.tools.bench_models import NEVER_EOS, Split, build_models, parse_kv_heads, random_ids
from gqa_jax.tools.decode_floor import roofline_s, step_bytes, step_ops
from gqa_jax.tools.hlo_profile import breakdown, op_events, parse_hlo
from gqa_jax.tools.info import attention_name
from gqa_jax.tools.measurement import (
    BEYOND_CACHES,
    machine_info,
    matmul_rate,
    md_table,
    measure,
    probe_sizes,
    read_rate,
)


def profile_loop(
    split: Split,
    ids: np.ndarray,
    steps: int,
    runs: int = 3,
    keep_trace: str | os.PathLike | None = None,
    cache_dtype: str | None = None,
) -> dict[str, Any]:
    """Compile the greedy loop, time it (median of ``runs``), trace one more run, break it down.
    The trace is kept in ``keep_trace`` (``profiling.trace_files`` finds it), else deleted."""
    graphdef, params = split
    ids = jnp.asarray(ids, jnp.int32)
    key, temperature = jax.random.key(0), jnp.float32(0.0)
    # greedy, on the path greedy_decode takes here (the CPU fast path on one CPU device)
    config = decoding.decode_config(steps, eos_id=NEVER_EOS, cache_dtype=cache_dtype)
    start = time.perf_counter()
    lowered = decoding.prefill_and_decode.lower(graphdef, params, ids, key, temperature, config=config)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start

    def run():
        return jax.block_until_ready(compiled(params, ids, key, temperature))

    state = run()
    if int(state.step) != steps:
        raise RuntimeError(f"the loop ran {int(state.step)} steps, expected {steps}")
    timing, _ = measure(run, runs)
    with tempfile.TemporaryDirectory(prefix="gqa_jax_trace_") as temporary:
        trace_dir = str(keep_trace) if keep_trace is not None else temporary
        jax.profiler.start_trace(trace_dir)
        try:
            run()
        finally:
            jax.profiler.stop_trace()
        events = op_events(trace_dir)
    ops, frames = parse_hlo(compiled.as_text())
    return {"compile_s": compile_s, "loop_s": timing["median_s"]} | breakdown(ops, frames, events, steps)


def run_step_bench(
    *,
    preset_name: str = "small",
    shape: dict[str, int] | None = None,
    batch: int = 8,
    input_len: int = 512,
    new_tokens: int = 64,
    kv_heads: str | None = None,
    dtype: str = "float32",
    cache_dtype: str | None = None,
    seed: int = 0,
    keep_trace: str | os.PathLike | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Build the models (``preset_name`` with the ModelConfig fields of ``shape`` replaced), measure
    the machine's read and matmul rates, profile each model's loop (its trace kept in
    ``keep_trace/kv<K>`` when given) and put each step beside its roofline (:func:`step_model`)."""
    config = preset(preset_name, dtype=dtype, param_dtype=dtype, **(shape or {}))
    ks = parse_kv_heads(kv_heads, config.num_heads)
    models = build_models(config, ks, seed, log)
    ids = random_ids(config.vocab_size, batch, input_len, seed)  # bench decode's inputs
    lengths = (input_len, new_tokens)
    mha_bytes = _step_bytes(models[config.num_heads], batch, lengths, cache_dtype or dtype)["total"]
    log("measuring the machine's read and matmul rates ...")
    rates = {
        "read_step": read_rate(mha_bytes, 10),  # a buffer of the MHA step's size
        "read_big": read_rate(BEYOND_CACHES, 10),
        "matmul": matmul_rate(jnp.dtype(dtype), [probe_sizes(config.d_model, config.vocab_size)["n"]], 5),
    }
    res: dict[str, Any] = {
        "settings": {"preset": preset_name, "shape": shape or {}, "batch": batch, "input_len": input_len}
        | {"new_tokens": new_tokens, "dtype": dtype, "cache_dtype": cache_dtype or dtype, "seed": seed},
        "machine": machine_info(),
        "rates": rates,
        "models": {},
    }
    for k in sorted(models, reverse=True):
        log(f"K = {k}: compile, time and trace the greedy loop ...")
        kept = Path(keep_trace) / f"kv{k}" if keep_trace is not None else None
        profile = profile_loop(
            nnx.split(models[k][1]), ids, new_tokens, keep_trace=kept, cache_dtype=cache_dtype
        )
        profile["model"] = step_model(models[k], batch, lengths, cache_dtype or dtype, rates)
        res["models"][k] = profile
        log(f"K = {k}: {profile['wall_step_s'] * 1e3:.1f} ms per step")
    return res


def _step_bytes(
    model: tuple[Any, Any], batch: int, lengths: tuple[int, int], cache_dtype: str
) -> dict[str, int]:
    config, t5 = model
    return step_bytes(t5, config, batch, kvcache.expected_cache_bytes(config, batch, *lengths, cache_dtype))


def step_model(
    model: tuple[Any, Any], batch: int, lengths: tuple[int, int], cache_dtype: str, rates: dict[str, Any]
) -> dict[str, Any]:
    """A step's bytes and FLOPs (``decode_floor.step_ops``), and its roofline at the machine's rate
    for a buffer of the step's size and its matmul rate."""
    config, t5 = model
    cache = kvcache.expected_cache_bytes(config, batch, *lengths, cache_dtype)
    ops = step_ops(t5, config, batch, lengths, cache)
    gb_s, gflop_s = rates["read_step"]["gb_s"], rates["matmul"]["gflop_s"]
    return {
        "bytes": sum(op["bytes"] for op in ops),
        "flops": sum(op["flops"] for op in ops),
        "cache_bytes": cache["total"],
        "roofline_s": roofline_s(ops, gb_s, gflop_s),
        "attention_roofline_s": roofline_s(
            [op for op in ops if op["op"].startswith("attention.")], gb_s, gflop_s
        ),
    }


def attention_s(rows: list[dict[str, Any]]) -> float:
    """Seconds per step of the attention over the cache: the ops of ``attention.py`` and
    ``kv_quant.py`` (scores, mask, softmax, values, a quantized cache's scales), the CPU attention
    kernel's calls (``cpu_kernels.attend``) and the products with a 4-D cache-shaped input that
    carry no source line."""

    def attends(r: dict[str, Any]) -> bool:
        src = r["source"]  # "file.py:line function"
        return (
            src.startswith(("attention.py", "kv_quant.py"))
            or (src.startswith("cpu_kernels.py") and src.endswith(" attend"))
            or (src == "?" and r["op"] == "dot" and r["largest_input"].count(",") == 3)
        )

    return sum(r["step_s"] for r in rows if attends(r))


def report(res: dict[str, Any], top: int = 16) -> str:
    """Markdown: each step beside its roofline (:func:`summary`), then per model the ``top`` groups
    of ops by time, the rest lumped, and the totals."""
    st, rates = res["settings"], res["rates"]
    shape = ", ".join(f"{k}={v}" for k, v in st["shape"].items())
    lines = [
        f"# Where a decode step's time goes: {st['preset']}{f' ({shape})' if shape else ''}, random "
        f"weights, batch {st['batch']}, input {st['input_len']}, {st['new_tokens']} steps, {st['dtype']}, "
        f"KV cache {st['cache_dtype']}",
        "",
        f"Machine: {res['machine']['processor']}, {res['machine']['backend']}. It reads "
        f"{rates['read_step']['gb_s']:.1f} GB/s from a buffer of the MHA step's size "
        f"({rates['read_step']['bytes'] / 1e6:.1f} MB) and {rates['read_big']['gb_s']:.1f} GB/s from one "
        f"of {rates['read_big']['bytes'] / 2**20:.0f} MiB (a jitted sum); matmul "
        f"{rates['matmul']['gflop_s']:.1f} GFLOP/s ({'x'.join(map(str, rates['matmul']['shape']))}).",
        "",
        *summary(res),
    ]
    n = max(res["models"])
    for k, m in res["models"].items():
        outside = m["wall_step_s"] - m["ops_step_s"]
        lines += [
            "",
            f"## {attention_name(k, n)} (K = {k}): loop {m['wall_step_s'] * 1e3:.2f} ms per step, ops "
            f"{m['ops_step_s'] * 1e3:.2f} ms summed, {outside * 1e3:+.2f} ms outside ops; inputs "
            f"{m['bytes_per_step'] / 1e6:.1f} MB per step "
            f"({m['bytes_per_step'] / m['wall_step_s'] / 1e9:.1f} GB/s over the loop)",
            "",
        ]
        rows = m["rows"][:top]
        rest = m["rows"][top:]
        if rest:
            rows = rows + [
                {
                    "source": f"({len(rest)} more groups)",
                    "op": "",
                    "output": "",
                    "largest_input": "",
                    "ops_per_step": sum(r["ops_per_step"] for r in rest),
                    "step_s": sum(r["step_s"] for r in rest),
                    "bytes_per_step": sum(r["bytes_per_step"] for r in rest),
                }
            ]

        def rate(r: dict[str, Any]) -> float:
            return r["bytes_per_step"] / r["step_s"] / 1e9 if r["step_s"] else float("nan")

        lines += md_table(
            [
                ("source", lambda r: r["source"]),
                ("op", lambda r: r["op"]),
                ("output", lambda r: r["output"]),
                ("largest input", lambda r: r["largest_input"]),
                ("ops / step", lambda r: f"{r['ops_per_step']:.0f}"),
                ("ms / step", lambda r: f"{r['step_s'] * 1e3:.3f}"),
                ("share", lambda r, m=m: f"{r['step_s'] / m['ops_step_s']:.1%}"),
                ("MB / step", lambda r: f"{r['bytes_per_step'] / 1e6:.2f}"),
                ("GB/s", lambda r: f"{rate(r):.1f}"),
            ],
            rows,
        )
    return "\n".join(lines)


def summary(res: dict[str, Any]) -> list[str]:
    """Each step beside its roofline: ms, the bytes and FLOPs it must read and do, GB/s and its
    share of the machine's (a buffer of the MHA step's size), the attention over the cache alone,
    the roofline (``decode_floor.roofline_s``) and the step over it; against MHA, the share of the
    saving the roofline predicts, and the bytes alone predict, that the step realised."""
    machine = res["rates"]["read_step"]["gb_s"]
    n = max(res["models"])
    rows = [summary_row(k, m, res["models"][n]) for k, m in res["models"].items()]

    def pct(x: float | None) -> str:
        return "" if x is None else f"{x:.0%}"

    columns = [
        ("model", lambda r: f"{attention_name(r['k'], n)} (K = {r['k']})"),
        ("ms / step", lambda r: f"{r['step_s'] * 1e3:.3f}"),
        ("MB / step", lambda r: f"{r['bytes'] / 1e6:.1f}"),
        ("MFLOP / step", lambda r: f"{r['flops'] / 1e6:.1f}"),
        ("GB/s", lambda r: f"{r['gb_s']:.1f}"),
        ("share of the machine's", lambda r: pct(r["gb_s"] / machine)),
        ("attention: ms, GB/s, share", lambda r: f"{r['attention_s'] * 1e3:.3f}, {r['attention_gb_s']:.1f}, "
         f"{pct(r['attention_gb_s'] / machine)}"),
        ("roofline ms", lambda r: f"{r['roofline_s'] * 1e3:.3f}"),
        ("step / roofline", lambda r: f"{r['step_s'] / r['roofline_s']:.2f}"),
        ("realised: roofline", lambda r: pct(r["realised_roofline"])),
        ("realised: bytes alone", lambda r: pct(r["realised_bytes"])),
    ]  # fmt: skip
    return md_table(columns, rows)


def summary_row(k: int, m: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """One model's :func:`summary` numbers; ``ref`` is MHA's profile."""
    step, model = m["wall_step_s"], m["model"]
    saving = ref["wall_step_s"] - step

    def realised(predicted: float) -> float | None:
        return saving / predicted if m is not ref and predicted > 0 else None

    attention = attention_s(m["rows"])
    return {
        "k": k,
        "step_s": step,
        "bytes": model["bytes"],
        "flops": model["flops"],
        "gb_s": model["bytes"] / step / 1e9,
        "attention_s": attention,
        "attention_gb_s": model["cache_bytes"] / attention / 1e9 if attention else float("nan"),
        "roofline_s": model["roofline_s"],
        "realised_roofline": realised(ref["model"]["roofline_s"] - model["roofline_s"]),
        "realised_bytes": realised(ref["wall_step_s"] * (1 - model["bytes"] / ref["model"]["bytes"])),
    }
