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

This module runs the tables and formats them; the models and inputs are ``tools.bench_models``'s,
the floor ``tools.decode_floor``'s, the HF side ``tools.bench_hf``'s (the export itself:
``checkpoints.hf_export``).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from flax import nnx

from gqa_jax import cache as kvcache
from gqa_jax import kv_quant
from gqa_jax.checkpoints.hf_export import to_hf
from gqa_jax.config import preset
from gqa_jax.tools.bench_hf import bench_hf, hf_device, hf_parity, hf_unavailable
from gqa_jax.tools.bench_models import DEFAULT_RULE, build_models, parse_kv_heads, parse_lengths, random_ids
from gqa_jax.tools.decode_floor import floor_row
from gqa_jax.tools.decode_loops import bench_fused, bench_stepped, bench_uncached
from gqa_jax.tools.info import attention_name
from gqa_jax.tools.measurement import (
    BIG_MATRIX,
    machine_info,
    matmul_rate,
    md_table,
    measure_read_bandwidth,
    probe_sizes,
)


# ----------------------------------------------------------------------------- the benchmark
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
    if log is None:

        def log(message: str) -> None:
            print(f"[{time.perf_counter() - wall:6.1f} s] {message}", file=sys.stderr, flush=True)

    config = preset(preset_name, dtype=dtype, param_dtype=dtype)
    N, B, S, T = config.num_heads, batch, input_len, new_tokens
    ks = parse_kv_heads(kv_heads, N)
    lengths = parse_lengths(lengths) if isinstance(lengths, str) else sorted(set(lengths))
    hf_skip = None if hf else "skipped: --no-hf"
    hf_skip = hf_skip or hf_unavailable(dtype)
    res: dict[str, Any] = {
        "machine": machine_info(),
        "settings": {
            "preset": preset_name,
            "batch": B,
            "input_len": S,
            "new_tokens": T,
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
        },
    }
    ids = random_ids(config.vocab_size, B, S, seed)

    log(f"building the random MHA {preset_name} model and its conversions to K = {ks} ...")
    models = build_models(config, ks, seed, log)
    splits = {k: nnx.split(m) for k, (_, m) in models.items()}

    hf_model = None
    if hf_skip is None:
        log("exporting the MHA weights to HuggingFace T5 and checking parity ...")
        hf_model = to_hf(models[N][1], config, hf_device(), dtype)
        diff, scale = hf_parity(hf_model, models[N][1], config, seed)
        res["hf_parity_max_abs_diff"] = diff
        # float32 agrees to 1e-3; bfloat16 / float16 round every activation, so judge the
        # difference against the logits' scale (8 bits of mantissa: a few percent; 10% allowed)
        limit = 1e-3 if dtype == "float32" else 0.1 * scale
        if not diff < limit:
            raise RuntimeError(
                f"HF logits differ from ours by {diff:.3g} (>= {limit:.3g}): not the same weights"
            )

    log("measuring read bandwidth and matmul rate ...")
    D, V = config.d_model, config.vocab_size
    probes = probe_sizes(D, V)
    bandwidth = measure_read_bandwidth(B, probes["shapes"], dtype, max(runs, 10), probes["big"])
    matmul = matmul_rate(dtype, [probes["n"]], runs)
    res["floor"] = {"bandwidth": bandwidth, "matmul": matmul, "rows": {}}

    res["table_b"] = {}
    for k in ks:
        k_config, model = models[k]
        name = attention_name(k, N)
        log(f"b. {name}: fused greedy loop ({runs} runs) and stepped loop ...")
        fused = bench_fused(splits[k], ids, T, runs, cache_dtype)
        stepped = bench_stepped(splits[k], ids, T, runs, cache_dtype)
        formula = kvcache.expected_cache_bytes(k_config, B, S, T, stepped["cache_dtype"])
        row = {
            "name": name,
            "kv_heads": k,
            "cache_bytes_measured": stepped["cache_bytes"],
            "cache_bytes_formula": formula,
            "fused": {key: v for key, v in fused.items() if key != "tokens"},
            "stepped": stepped,
            "tokens_per_s": B * T / fused["median_s"],
            "time_per_sample_s": fused["median_s"] / B,
            "ttft_s": stepped["ttft_s"],
            # the stepped loop's own steps after the first: (fused - TTFT) / (T - 1) mixed two loops
            # and went negative when a tiny model's steps were below the timing noise
            "tpot_s": statistics.mean(stepped["step_latencies_s"]) if T > 1 else float("nan"),
            "step_fused_s": fused_step_s(fused["median_s"], stepped["prefill_s"], T),
        }
        res["table_b"][k] = row
        log(
            f"b. {name}: {fused['median_s']:.4g} s end to end ({row['tokens_per_s']:.1f} tokens/s, compile "
            f"{fused['compile_s']:.1f} s), TTFT {row['ttft_s'] * 1e3:.2f} ms, step p50 "
            f"{stepped['step_p50_s'] * 1e3:.3f} ms, cache {stepped['cache_bytes']['total']:,} bytes"
        )
        if k == N:
            mha_tokens = fused["tokens"]
        fl = floor_row(
            model,
            k_config,
            batch=B,
            input_len=S,
            new_tokens=T,
            cache_bytes=stepped["cache_bytes"],
            bandwidth_gb_s=bandwidth["reference"]["gb_s"],
            gflop_s=matmul["gflop_s"],
        )
        fl["step_fused_over_floor"] = row["step_fused_s"] / fl["step_floor_s"]
        fl["step_p50_over_floor"] = stepped["step_p50_s"] / fl["step_floor_s"]
        fl["prefill_over_floor"] = stepped["prefill_s"] / fl["prefill_floor_s"]
        fl["e2e_measured_s"] = fused["median_s"]
        fl["e2e_over_floor"] = fused["median_s"] / fl["e2e_floor_s"]
        res["floor"]["rows"][k] = fl
    mha_bytes = res["table_b"][N]["cache_bytes_measured"]["total"]
    for row in res["table_b"].values():
        row["cache_ratio_to_mha"] = row["cache_bytes_measured"]["total"] / mha_bytes

    log(f"a. with vs without cache at lengths {lengths} (MHA) ...")
    prefill_s = res["table_b"][N]["stepped"]["prefill_s"]
    uncached = bench_uncached(splits[N], ids, lengths, uncached_runs, uncached_budget_s, prefill_s)
    res["table_a"] = {}
    for L in lengths:
        if L == T:
            cached = res["table_b"][N]["fused"]
        else:
            fused_l = bench_fused(splits[N], ids, L, runs_a, cache_dtype)
            cached = {key: v for key, v in fused_l.items() if key != "tokens"}
        u = uncached[L]
        measured = "median_s" in u
        log(
            f"a. {L} new tokens: cached {cached['median_s']:.4g} s, uncached "
            + (f"{u['median_s']:.4g} s" if measured else f"not run (estimate {u['estimate_s']:.3g} s)")
        )
        res["table_a"][L] = {
            "cached": cached,
            "cached_tokens_per_s": B * L / cached["median_s"],
            "uncached": u,
            "uncached_measured": measured,
            "uncached_tokens_per_s": B * L / u["median_s"] if measured else None,
            "speedup": u["median_s"] / cached["median_s"] if measured else None,
        }

    if hf_model is not None:
        log(f"d. HuggingFace generate ({runs} runs) ...")
        h = bench_hf(hf_model, ids, T, runs)
        log(f"d. HF generate: {h['median_s']:.4g} s end to end on {h['device']}")
        res["hf"] = {key: v for key, v in h.items() if key != "tokens"}
        res["hf"]["token_agreement_with_ours_mha"] = float((h["tokens"] == mha_tokens).mean())
        res["hf"]["tokens_per_s"] = B * T / h["median_s"]
        res["hf"]["ratio_hf_over_ours"] = {
            k: h["median_s"] / row["fused"]["median_s"] for k, row in res["table_b"].items()
        }
    else:
        res["hf"] = {"skipped": hf_skip}
    res["total_wall_s"] = time.perf_counter() - wall
    return res


# ------------------------------------------------------------------------------ formatting
def _or_dash(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def fused_step_s(fused_s: float, prefill_s: float, steps: int) -> float:
    """The fused loop's time per step: (its end-to-end time - the stepped loop's prefill) / steps.
    The two times come from two loops; where the difference is not positive (a tiny model's steps
    below the timing noise, a loaded machine) it is NaN, not a negative time."""
    step = (fused_s - prefill_s) / steps
    return step if step > 0 else float("nan")


def _below_noise(value: float, fmt: Any) -> str:
    return "below noise" if math.isnan(value) else fmt(value)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def report(res: dict[str, Any]) -> str:
    """The four tables as Markdown."""
    st, m, fl, h = res["settings"], res["machine"], res["floor"], res["hf"]
    B, S, T, N, ks = st["batch"], st["input_len"], st["new_tokens"], st["config"]["num_heads"], st["kv_heads"]
    b, f, a = res["table_b"], fl["rows"], res["table_a"]
    name = {k: b[k]["name"] for k in ks}
    out = [
        f"# Decoding benchmark: {st['preset']} (T5.1.1 shape, random weights), batch {B}, input {S}, "
        f"{T} new tokens, {st['dtype']}"
        + (f", KV cache {st['cache_dtype']}" if st.get("cache_dtype", st["dtype"]) != st["dtype"] else ""),
        "",
        f"Machine: jax {m['jax']}, backend {m['backend']} ({m['device_count']} device(s)), "
        f"{m.get('cpus_usable', m['cpu_count'])} usable CPU(s) of {m['cpu_count']}, {m['processor']}.",
        f"Models: one random MHA model (N = {N} heads); "
        f"{', '.join(name[k] for k in ks if k != N) or 'no other'} = its mean-pooled conversions "
        "(`convert.to_grouped`: decoder self- and cross-attention).",
        f"K/V heads {ks} ({st['kv_heads_rule']}).",
        f"Timing: first call (compile) excluded, median of {st['runs']} runs, each ended by "
        "`block_until_ready`. EOS is disabled, so every row emits exactly the requested tokens. "
        "tokens/s = batch x new tokens / end-to-end time (encoder included).",
        "",
        f"## a. With vs without KV cache ({name[N]}, batch {B}, input {S})",
        "",
    ]

    def uncached_how(L: int) -> str:
        u = a[L]["uncached"]
        if a[L]["uncached_measured"]:
            return f"measured, {u['runs']} run(s)"
        return f"not run: one pass over {L} positions takes {_ms(u['step_s'])} ms (measured), x {L} steps"

    out += md_table(
        [
            ("new tokens", str),
            ("cached (s)", lambda L: f"{a[L]['cached']['median_s']:.2f}"),
            ("runs", lambda L: str(a[L]["cached"]["runs"])),
            ("cached tokens/s", lambda L: f"{a[L]['cached_tokens_per_s']:.1f}"),
            ("uncached (s)", lambda L: _or_dash(a[L]["uncached"].get("median_s"), "{:.2f}")),
            ("uncached tokens/s", lambda L: _or_dash(a[L]["uncached_tokens_per_s"], "{:.1f}")),
            ("uncached", uncached_how),
            ("cache speed-up", lambda L: _or_dash(a[L]["speedup"], "{:.1f}x")),
        ],
        sorted(a),
    )
    out += [
        "",
        f"Cached rows: `greedy_decode`, median of the runs shown (`--runs-a` beyond {T} new tokens; the "
        f"{T}-token row is table b's MHA). Uncached = `uncached_greedy_decode`: every step re-runs "
        "the whole decoder over all T positions. The full loop runs only where its estimate (prefill + "
        "T x one timed decoder pass) is within "
        f"{st['uncached_budget_s']:.0f} s (`--uncached-budget`); other rows are not run and show '-' "
        "(only measured numbers are reported)."
        + "".join(
            f" Estimate check at {L}: {a[L]['uncached']['estimate_s']:.2f} s estimated, "
            f"{a[L]['uncached']['median_s']:.2f} s measured."
            for L in sorted(a)
            if a[L]["uncached_measured"]
        ),
        "",
        f"## b. MHA / GQA / MQA (batch {B}, input {S}, {T} new tokens)",
        "",
    ]
    out += md_table(
        [
            ("model", lambda k: name[k]),
            ("K", str),
            ("cache bytes (measured)", lambda k: f"{b[k]['cache_bytes_measured']['total']:,}"),
            ("cache bytes (formula)", lambda k: f"{b[k]['cache_bytes_formula']['total']:,}"),
            ("cache / MHA", lambda k: f"{b[k]['cache_ratio_to_mha']:.3f}"),
            ("tokens/s", lambda k: f"{b[k]['tokens_per_s']:.1f}"),
            ("time per sample (ms)", lambda k: _ms(b[k]["time_per_sample_s"])),
            ("TTFT (ms)", lambda k: _ms(b[k]["ttft_s"])),
            ("TPOT (ms)", lambda k: _ms(b[k]["tpot_s"])),
            ("step p50 (ms)", lambda k: _ms(b[k]["stepped"]["step_p50_s"])),
            ("step p95 (ms)", lambda k: _ms(b[k]["stepped"]["step_p95_s"])),
            ("compile (s)", lambda k: f"{b[k]['fused']['compile_s']:.1f}"),
        ],
        ks,
    )
    ref, mm = fl["bandwidth"]["reference"], fl["matmul"]
    big_mib = fl["bandwidth"].get("big_bytes", BIG_MATRIX) // 2**20
    probes = "; ".join(
        "[{0},{1}]x[{1},{2}]".format(*p["shape"]) + f" {p.get('layout', 'in_out')}: {p['gb_s']:.1f} GB/s"
        for p in fl["bandwidth"]["probes"]
    )
    out += [
        "",
        "tokens/s and time per sample (end-to-end time / batch) come from the fused loop (`greedy_decode`: "
        "encoder + `lax.while_loop` in one jitted call). TTFT (prefill + first step) and step p50 / p95 "
        "(the other steps, one by one) come from the stepped loop (jitted `prefill`, then jitted "
        f"`decode_step` called from Python). TPOT = (fused time - TTFT) / {max(T - 1, 1)}. "
        "Compile = the fused loop's first call minus its median.",
        "",
        "## c. The floor",
        "",
        f"Read bandwidth {ref['gb_s']:.1f} GB/s = matrix bytes / median time of a jitted [B,D]x[D,V] "
        f"product, the weight stored [D, V] (in_out) or [V, D] and contracted out-major as the CPU "
        f"decode loop does (out_in) ({probes}; the fastest product on a matrix of at least "
        f"{big_mib} MiB counts). "
        f"Matmul rate {mm['gflop_s']:.1f} GFLOP/s (jitted {mm['shape'][0]}^3 product).",
        "Step floor = max(bytes / bandwidth, FLOPs / rate). Bytes = decoder-side weights (self-attention, "
        "cross-attention q and o, MLPs, norms, output layer, the gathered embedding rows) + the whole "
        f"self-attention cache (all {T} allocated slots are read every step) + every layer's cross K/V. "
        "Prefill floor = (encoder + cross K/V projection) FLOPs / rate. End-to-end floor = prefill "
        "floor + steps x step floor. Step, fused = (fused time - prefill time) / steps (two loops: "
        '"below noise" where the fused loop took no longer than the prefill alone).',
        "",
    ]
    out += md_table(
        [
            ("model", lambda k: name[k]),
            ("weights (MB)", lambda k: f"{f[k]['weight_bytes'] / 1e6:.1f}"),
            ("self K/V (MB)", lambda k: f"{f[k]['self_cache_bytes'] / 1e6:.1f}"),
            ("cross K/V (MB)", lambda k: f"{f[k]['cross_cache_bytes'] / 1e6:.1f}"),
            ("step floor (ms)", lambda k: _ms(f[k]["step_floor_s"])),
            ("step, fused (ms)", lambda k: _below_noise(b[k]["step_fused_s"], _ms)),
            ("fused / floor", lambda k: _below_noise(f[k]["step_fused_over_floor"], "{:.2f}".format)),
            ("step p50, stepped (ms)", lambda k: _ms(b[k]["stepped"]["step_p50_s"])),
            ("p50 / floor", lambda k: f"{f[k]['step_p50_over_floor']:.2f}"),
        ],
        ks,
    )
    out.append("")
    out += md_table(
        [
            ("model", lambda k: name[k]),
            ("prefill GFLOP", lambda k: f"{f[k]['prefill_flops'] / 1e9:.1f}"),
            ("prefill floor (ms)", lambda k: _ms(f[k]["prefill_floor_s"])),
            ("prefill (ms)", lambda k: _ms(b[k]["stepped"]["prefill_s"])),
            ("prefill / floor", lambda k: f"{f[k]['prefill_over_floor']:.2f}"),
            ("end-to-end floor (s)", lambda k: f"{f[k]['e2e_floor_s']:.3f}"),
            ("end to end (s)", lambda k: f"{f[k]['e2e_measured_s']:.3f}"),
            ("end to end / floor", lambda k: f"{f[k]['e2e_over_floor']:.2f}"),
        ],
        ks,
    )
    out += [
        "",
        f"## d. HuggingFace `generate` on the same weights (batch {B}, input {S}, {T} new tokens)",
        "",
    ]
    if "skipped" in h:
        out.append(h["skipped"])
    else:
        out += md_table(
            [
                ("ours", lambda k: name[k]),
                (
                    "HF",
                    lambda k: (
                        "MHA (the same weights)" if k == N else "MHA (the weights it was converted from)"
                    ),
                ),
                ("ours (s)", lambda k: f"{b[k]['fused']['median_s']:.3f}"),
                ("HF (s)", lambda k: f"{h['median_s']:.3f}"),
                ("HF / ours", lambda k: f"{h['ratio_hf_over_ours'][k]:.2f}x"),
                ("ours tokens/s", lambda k: f"{b[k]['tokens_per_s']:.1f}"),
                ("HF tokens/s", lambda k: f"{h['tokens_per_s']:.1f}"),
            ],
            ks,
        )
        out += [
            "",
            "HF: `T5ForConditionalGeneration.generate(num_beams=1, do_sample=False, use_cache=True, "
            f"min_new_tokens=max_new_tokens={T})` on {h.get('device', 'cpu')}, torch {h['torch_threads']} "
            "thread(s), median of "
            f"{h['runs']} runs after one warm-up. Same weights: max |logits diff| "
            f"{res['hf_parity_max_abs_diff']:.2e} (checked in this run); greedy tokens equal ours (MHA) at "
            f"{100 * h['token_agreement_with_ours_mha']:.1f}% of positions "
            "(HF suppresses EOS, ours ignores it).",
        ]
    out += ["", f"Total wall time: {res['total_wall_s']:.1f} s."]
    return "\n".join(out)
