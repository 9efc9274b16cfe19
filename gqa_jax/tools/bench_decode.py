"""Decoding benchmark: cache vs no cache, MHA / GQA-K / MQA, the roofline floor, HuggingFace.

Letters: ``B`` batch, ``S`` input length, ``T`` new tokens (= ``max_decode_len``), ``N`` query
heads, ``K`` K/V heads, ``H`` head dim, ``D`` d_model, ``V`` vocab.

One random MHA model of a preset is built; GQA-K / MQA are its ``mean`` conversions
(``convert.to_grouped``), as the paper does before uptraining, and HuggingFace's T5 gets the
very same MHA weights (parity checked in the run). Tables (Markdown), all numbers in a dict:

- a. with vs without the KV cache at several output lengths (MHA);
- b. per K: cache bytes measured vs formula, tokens/s, time per sample, TTFT, TPOT, p50/p95;
- c. the floor: bytes a decode step must read / measured read bandwidth, prefill FLOPs /
  measured matmul rate; measured time over floor per step and end to end;
- d. HuggingFace ``generate`` (greedy, ``use_cache``) on the same weights vs ours.

Timing rules (``tools.measurement.measure``): every timed function is jitted; its first call (compile
+ run) is the warm-up and is excluded; a timing is the median of ``runs`` later calls, each ended
by ``jax.block_until_ready``; compile time = first call - that median. Two ways to decode
(``tools.decode_loops``):

- fused: ``decoding.greedy_decode`` (encoder + ``lax.while_loop`` in one jitted call) gives
  the end-to-end time, tokens/s and time per sample;
- stepped: a jitted prefill, then the jitted ``decoding.decode_step`` called from Python and
  blocked on after each step, gives TTFT and the per-step latencies (p50 / p95).

EOS is disabled (``eos_id=-1``; HF: ``min_new_tokens = max_new_tokens``) so every row emits
exactly ``T`` tokens: random weights would otherwise stop at random places.

This module runs the tables (``tools.bench_decode_report`` formats them); the models and inputs
are ``tools.bench_models``'s, the floor ``tools.decode_floor``'s, the HF side ``tools.bench_hf``'s
(the export itself: ``checkpoints.hf_export``).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from flax import nnx

from gqa_jax import cache as kvcache
from gqa_jax import kv_quant
from gqa_jax.checkpoints.hf_export import to_hf
from gqa_jax.config import ModelConfig, preset
from gqa_jax.model import T5
from gqa_jax.tools.bench_hf import bench_hf, hf_device, hf_parity, hf_unavailable
from gqa_jax.tools.bench_models import (
    DEFAULT_RULE,
    Split,
    build_models,
    parse_kv_heads,
    parse_lengths,
    random_ids,
)
from gqa_jax.tools.decode_floor import floor_row
from gqa_jax.tools.decode_loops import bench_fused, bench_stepped, bench_uncached
from gqa_jax.tools.info import attention_name
from gqa_jax.tools.measurement import machine_info, matmul_rate, measure_read_bandwidth, probe_sizes


# ----------------------------------------------------------------------------- the benchmark
@dataclasses.dataclass(frozen=True)
class _Bench:
    """What every table's measurement shares: the models (``{K: (config, model)}``, split for the
    jitted loops), the encoder inputs, the new tokens ``T`` and the run settings."""

    config: ModelConfig
    models: dict[int, tuple[ModelConfig, T5]]
    splits: dict[int, Split]
    ids: np.ndarray
    new_tokens: int
    runs: int
    cache_dtype: str | None
    log: Callable[[str], None]

    @classmethod
    def build(
        cls,
        config: ModelConfig,
        kv_heads: list[int],
        ids: np.ndarray,
        new_tokens: int,
        runs: int,
        cache_dtype: str | None,
        seed: int,
        log: Callable[[str], None],
    ) -> _Bench:
        """The random MHA model of ``config`` and its conversions to each of ``kv_heads``, split, with
        the inputs and the run settings."""
        models = build_models(config, kv_heads, seed, log)
        splits = {k: nnx.split(m) for k, (_, m) in models.items()}
        return cls(config, models, splits, ids, new_tokens, runs, cache_dtype, log)

    @property
    def batch(self) -> int:
        return self.ids.shape[0]

    @property
    def input_len(self) -> int:
        return self.ids.shape[1]

    @property
    def mha(self) -> int:
        return self.config.num_heads


@dataclasses.dataclass(frozen=True)
class _Decoded:
    """One model's measurements: its table-b row, its floor row (table c) and the tokens its
    fused loop emitted."""

    row: dict[str, Any]
    floor: dict[str, Any]
    tokens: np.ndarray


def run_decode_bench(
    *,
    preset_name: str = "small",
    batch: int = 8,
    input_len: int = 512,
    new_tokens: int = 64,
    kv_heads: str | None = None,
    lengths: str | list[int] | tuple[int, ...] = (64, 256, 512),
    runs: int = 5,
    runs_a: int = 3,
    uncached_runs: int = 1,
    uncached_budget_s: float = 60.0,
    hf: bool = True,
    dtype: str = "float32",
    cache_dtype: str | None = None,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run tables a-d; returns every number (JSON-able after :func:`measurement.to_json`). Progress goes to
    ``log`` (default: stderr, with the elapsed time). ``cache_dtype``: our KV cache's (None: ``dtype``;
    ``int8`` / fp8: quantized, ``gqa_jax.kv_quant``) in every table of ours."""
    cache_dtype = kv_quant.check_cache_dtype(cache_dtype)
    wall = time.perf_counter()
    log = log or _stderr_log(wall)
    config = preset(preset_name, dtype=dtype, param_dtype=dtype)
    ks = parse_kv_heads(kv_heads, config.num_heads)
    lengths = parse_lengths(lengths) if isinstance(lengths, str) else sorted(set(lengths))
    hf_skip = (None if hf else "skipped: --no-hf") or hf_unavailable(dtype)
    res: dict[str, Any] = {"machine": machine_info()}
    res["settings"] = {
        "preset": preset_name,
        "batch": batch,
        "input_len": input_len,
        "new_tokens": new_tokens,
        "kv_heads": ks,
        "kv_heads_rule": "given; N is always added" if kv_heads else DEFAULT_RULE,
        "lengths": lengths,
        "runs": runs,
        "runs_a": runs_a,
        "uncached_runs": uncached_runs,
        "uncached_budget_s": uncached_budget_s,
        "dtype": dtype,
        "cache_dtype": cache_dtype or dtype,
        "seed": seed,
        "config": config.to_dict(),
    }
    ids = random_ids(config.vocab_size, batch, input_len, seed)
    log(f"building the random MHA {preset_name} model and its conversions to K = {ks} ...")
    bench = _Bench.build(config, ks, ids, new_tokens, runs, cache_dtype, seed, log)
    hf_model = None
    if hf_skip is None:
        hf_model, res["hf_parity_max_abs_diff"] = _hf_model(bench, dtype, seed)
    res["floor"] = _measure_rates(bench, dtype)
    decoded = {k: _measure_model(bench, k, res["floor"]) for k in ks}
    res["floor"]["rows"] = {k: d.floor for k, d in decoded.items()}
    res["table_b"] = _table_b(decoded, bench.mha)
    res["table_a"] = _measure_a(bench, lengths, runs_a, uncached_runs, uncached_budget_s, res["table_b"])
    res["hf"] = {"skipped": hf_skip} if hf_model is None else _measure_hf(bench, hf_model, decoded)
    res["total_wall_s"] = time.perf_counter() - wall
    return res


def _stderr_log(wall: float) -> Callable[[str], None]:
    def log(message: str) -> None:
        print(f"[{time.perf_counter() - wall:6.1f} s] {message}", file=sys.stderr, flush=True)

    return log


def _without_tokens(timing: dict[str, Any]) -> dict[str, Any]:
    return {key: v for key, v in timing.items() if key != "tokens"}


def _hf_model(bench: _Bench, dtype: str, seed: int) -> tuple[Any, float]:
    """HuggingFace's T5 holding the MHA weights, and its max |logits difference| to ours (checked)."""
    bench.log("exporting the MHA weights to HuggingFace T5 and checking parity ...")
    mha = bench.models[bench.mha][1]
    hf_model = to_hf(mha, bench.config, hf_device(), dtype)
    diff, scale = hf_parity(hf_model, mha, bench.config, seed)
    # float32 agrees to 1e-3; bfloat16 / float16 round every activation, so judge the
    # difference against the logits' scale (8 bits of mantissa: a few percent; 10% allowed)
    limit = 1e-3 if dtype == "float32" else 0.1 * scale
    if not diff < limit:
        raise RuntimeError(f"HF logits differ from ours by {diff:.3g} (>= {limit:.3g}): not the same weights")
    return hf_model, diff


def _measure_rates(bench: _Bench, dtype: str) -> dict[str, Any]:
    """The floor's rates: the read bandwidth and the matmul rate."""
    bench.log("measuring read bandwidth and matmul rate ...")
    probes = probe_sizes(bench.config.d_model, bench.config.vocab_size)
    bandwidth = measure_read_bandwidth(
        bench.batch, probes["shapes"], dtype, max(bench.runs, 10), probes["big"]
    )
    return {"bandwidth": bandwidth, "matmul": matmul_rate(dtype, [probes["n"]], bench.runs)}


def _measure_model(bench: _Bench, k: int, rates: dict[str, Any]) -> _Decoded:
    """Table b's row of the model with ``k`` K/V heads (the fused loop, the stepped loop, the cache
    bytes measured and by the formula) and its floor row."""
    B, S, T = bench.batch, bench.input_len, bench.new_tokens
    k_config, model = bench.models[k]
    name = attention_name(k, bench.mha)
    bench.log(f"b. {name}: fused greedy loop ({bench.runs} runs) and stepped loop ...")
    fused = bench_fused(bench.splits[k], bench.ids, T, bench.runs, bench.cache_dtype)
    stepped = bench_stepped(bench.splits[k], bench.ids, T, bench.runs, bench.cache_dtype)
    row = {
        "name": name,
        "kv_heads": k,
        "cache_bytes_measured": stepped["cache_bytes"],
        "cache_bytes_formula": kvcache.expected_cache_bytes(k_config, B, S, T, stepped["cache_dtype"]),
        "fused": _without_tokens(fused),
        "stepped": stepped,
        "tokens_per_s": B * T / fused["median_s"],
        "time_per_sample_s": fused["median_s"] / B,
        "ttft_s": stepped["ttft_s"],
        # the stepped loop's own steps after the first: (fused - TTFT) / (T - 1) would mix two loops
        # and goes negative where a tiny model's steps are below the timing noise
        "tpot_s": statistics.mean(stepped["step_latencies_s"]) if T > 1 else float("nan"),
        "step_fused_s": fused_step_s(fused["median_s"], stepped["prefill_s"], T),
    }
    bench.log(
        f"b. {name}: {fused['median_s']:.4g} s end to end ({row['tokens_per_s']:.1f} tokens/s, compile "
        f"{fused['compile_s']:.1f} s), TTFT {row['ttft_s'] * 1e3:.2f} ms, step p50 "
        f"{stepped['step_p50_s'] * 1e3:.3f} ms, cache {stepped['cache_bytes']['total']:,} bytes"
    )
    fl = floor_row(
        model,
        k_config,
        batch=B,
        input_len=S,
        new_tokens=T,
        cache_bytes=stepped["cache_bytes"],
        bandwidth_gb_s=rates["bandwidth"]["reference"]["gb_s"],
        gflop_s=rates["matmul"]["gflop_s"],
    )
    fl["step_fused_over_floor"] = row["step_fused_s"] / fl["step_floor_s"]
    fl["step_p50_over_floor"] = stepped["step_p50_s"] / fl["step_floor_s"]
    fl["prefill_over_floor"] = stepped["prefill_s"] / fl["prefill_floor_s"]
    fl["e2e_measured_s"] = fused["median_s"]
    fl["e2e_over_floor"] = fused["median_s"] / fl["e2e_floor_s"]
    return _Decoded(row, fl, fused["tokens"])


def fused_step_s(fused_s: float, prefill_s: float, steps: int) -> float:
    """The fused loop's time per step: (its end-to-end time - the stepped loop's prefill) / steps.
    The two times come from two loops; where the difference is not positive (a tiny model's steps
    below the timing noise, a loaded machine) it is NaN, not a negative time."""
    step = (fused_s - prefill_s) / steps
    return step if step > 0 else float("nan")


def _table_b(decoded: dict[int, _Decoded], mha: int) -> dict[int, dict[str, Any]]:
    """Table b's rows, each with its cache bytes over the MHA model's."""
    mha_bytes = decoded[mha].row["cache_bytes_measured"]["total"]
    return {
        k: d.row | {"cache_ratio_to_mha": d.row["cache_bytes_measured"]["total"] / mha_bytes}
        for k, d in decoded.items()
    }


def _measure_a(
    bench: _Bench,
    lengths: list[int],
    runs_a: int,
    uncached_runs: int,
    uncached_budget_s: float,
    table_b: dict[int, dict[str, Any]],
) -> dict[int, dict[str, Any]]:
    """Table a: the MHA model with vs without the cache at each output length (the cache-free loop
    only where its estimate is within the budget; at ``T`` the cached time is table b's)."""
    split, mha_row = bench.splits[bench.mha], table_b[bench.mha]
    bench.log(f"a. with vs without cache at lengths {lengths} (MHA) ...")
    prefill_s = mha_row["stepped"]["prefill_s"]
    uncached = bench_uncached(split, bench.ids, lengths, uncached_runs, uncached_budget_s, prefill_s)
    table = {}
    for L in lengths:
        if L == bench.new_tokens:
            cached = mha_row["fused"]
        else:
            cached = _without_tokens(bench_fused(split, bench.ids, L, runs_a, bench.cache_dtype))
        table[L] = _row_a(bench, L, cached, uncached[L])
    return table


def _row_a(bench: _Bench, L: int, cached: dict[str, Any], u: dict[str, Any]) -> dict[str, Any]:
    """Table a's row at ``L`` new tokens: the cached and the uncached loop's timings."""
    measured = "median_s" in u
    bench.log(
        f"a. {L} new tokens: cached {cached['median_s']:.4g} s, uncached "
        + (f"{u['median_s']:.4g} s" if measured else f"not run (estimate {u['estimate_s']:.3g} s)")
    )
    B = bench.batch
    return {
        "cached": cached,
        "cached_tokens_per_s": B * L / cached["median_s"],
        "uncached": u,
        "uncached_measured": measured,
        "uncached_tokens_per_s": B * L / u["median_s"] if measured else None,
        "speedup": u["median_s"] / cached["median_s"] if measured else None,
    }


def _measure_hf(bench: _Bench, hf_model: Any, decoded: dict[int, _Decoded]) -> dict[str, Any]:
    """Table d: HuggingFace ``generate`` on the MHA weights, against each of our models."""
    bench.log(f"d. HuggingFace generate ({bench.runs} runs) ...")
    h = bench_hf(hf_model, bench.ids, bench.new_tokens, bench.runs)
    bench.log(f"d. HF generate: {h['median_s']:.4g} s end to end on {h['device']}")
    out = _without_tokens(h)
    out["token_agreement_with_ours_mha"] = float((h["tokens"] == decoded[bench.mha].tokens).mean())
    out["tokens_per_s"] = bench.batch * bench.new_tokens / h["median_s"]
    out["ratio_hf_over_ours"] = {k: h["median_s"] / d.row["fused"]["median_s"] for k, d in decoded.items()}
    return out
