"""``bench decode``'s report: ``bench_decode.run_decode_bench``'s result as Markdown, a header
(the machine, the models, the timing rules) and one section per table (a: with vs without the
KV cache; b: MHA / GQA / MQA; c: the floor; d: HuggingFace ``generate``)."""

from __future__ import annotations

import math
from typing import Any

from gqa_jax.tools.measurement import BIG_MATRIX, md_table


def report(res: dict[str, Any]) -> str:
    """The four tables as Markdown."""
    sections = [_header(res), _section_a(res), _section_b(res), _section_c(res), _section_d(res)]
    sections.append([f"Total wall time: {res['total_wall_s']:.1f} s."])
    return "\n\n".join("\n".join(lines) for lines in sections)


def _header(res: dict[str, Any]) -> list[str]:
    """The title, the machine, the models and the timing rules."""
    st, m, name = res["settings"], res["machine"], _names(res)
    N, ks = st["config"]["num_heads"], st["kv_heads"]
    return [
        f"# Decoding benchmark: {st['preset']} (T5.1.1 shape, random weights), {_shape(st)}, {st['dtype']}"
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
    ]


def _section_a(res: dict[str, Any]) -> list[str]:
    """Table a: with vs without the KV cache, per output length."""
    st, a = res["settings"], res["table_a"]
    N, T = st["config"]["num_heads"], st["new_tokens"]

    def uncached_how(L: int) -> str:
        u = a[L]["uncached"]
        if a[L]["uncached_measured"]:
            return f"measured, {u['runs']} run(s)"
        return f"not run: one pass over {L} positions takes {_ms(u['step_s'])} ms (measured), x {L} steps"

    table = md_table(
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
    checks = "".join(
        f" Estimate check at {L}: {a[L]['uncached']['estimate_s']:.2f} s estimated, "
        f"{a[L]['uncached']['median_s']:.2f} s measured."
        for L in sorted(a)
        if a[L]["uncached_measured"]
    )
    return [
        f"## a. With vs without KV cache ({_names(res)[N]}, batch {st['batch']}, input {st['input_len']})",
        "",
        *table,
        "",
        f"Cached rows: `greedy_decode`, median of the runs shown (`--runs-a` beyond {T} new tokens; the "
        f"{T}-token row is table b's MHA). Uncached = `uncached.greedy_decode`: every step re-runs "
        "the whole decoder over all T positions. The full loop runs only where its estimate (prefill + "
        "T x one timed decoder pass) is within "
        f"{st['uncached_budget_s']:.0f} s (`--uncached-budget`); other rows are not run and show '-' "
        "(only measured numbers are reported)." + checks,
    ]


def _section_b(res: dict[str, Any]) -> list[str]:
    """Table b: per model, the cache bytes, tokens/s and the latencies."""
    st, b = res["settings"], res["table_b"]
    table = _per_model(
        res,
        [
            ("K", str),
            ("cache bytes (measured)", lambda k: f"{b[k]['cache_bytes_measured']['total']:,}"),
            ("cache bytes (formula)", lambda k: f"{b[k]['cache_bytes_formula']['total']:,}"),
            ("cache / MHA", lambda k: f"{b[k]['cache_ratio_to_mha']:.3f}"),
            ("tokens/s", lambda k: f"{b[k]['tokens_per_s']:.1f}"),
            ("time per sample (ms)", lambda k: _ms(b[k]["time_per_sample_s"])),
            ("TTFT (ms)", lambda k: _ms(b[k]["ttft_s"])),
            ("TPOT: mean step (ms)", lambda k: _ms(b[k]["tpot_s"])),
            ("step p50 (ms)", lambda k: _ms(b[k]["stepped"]["step_p50_s"])),
            ("step p95 (ms)", lambda k: _ms(b[k]["stepped"]["step_p95_s"])),
            ("compile (s)", lambda k: f"{b[k]['fused']['compile_s']:.1f}"),
        ],
    )
    return [
        f"## b. MHA / GQA / MQA ({_shape(st)})",
        "",
        *table,
        "",
        "tokens/s and time per sample (end-to-end time / batch) come from the fused loop (`greedy_decode`: "
        "encoder + `lax.while_loop` in one jitted call). TTFT (prefill + first step), TPOT (the mean of the "
        f"other {max(st['new_tokens'] - 1, 1)} steps) and step p50 / p95 come from the stepped loop "
        "(`decoding.start`, then `decoding.step` called from Python, one step per call, on the weights "
        "`decoding.step_weights` laid out once for the steps, as the fused loop lays them out once per "
        "decode). Compile = the fused loop's first call minus its median.",
    ]


def _section_c(res: dict[str, Any]) -> list[str]:
    """Table c: the floor's rates and rules, then measured over floor per step and end to end."""
    fl, T = res["floor"], res["settings"]["new_tokens"]
    ref, mm = fl["bandwidth"]["reference"], fl["matmul"]
    big_mib = fl["bandwidth"].get("big_bytes", BIG_MATRIX) // 2**20
    probes = "; ".join(
        "[{0},{1}]x[{1},{2}]".format(*p["shape"]) + f" {p.get('layout', 'in_out')}: {p['gb_s']:.1f} GB/s"
        for p in fl["bandwidth"]["probes"]
    )
    return [
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
        *_floor_per_step(res),
        "",
        *_floor_end_to_end(res),
    ]


def _floor_per_step(res: dict[str, Any]) -> list[str]:
    """Per model: the bytes a step reads, the step floor and the measured steps over it."""
    b, f = res["table_b"], res["floor"]["rows"]
    return _per_model(
        res,
        [
            ("weights (MB)", lambda k: f"{f[k]['weight_bytes'] / 1e6:.1f}"),
            ("self K/V (MB)", lambda k: f"{f[k]['self_cache_bytes'] / 1e6:.1f}"),
            ("cross K/V (MB)", lambda k: f"{f[k]['cross_cache_bytes'] / 1e6:.1f}"),
            ("step floor (ms)", lambda k: _ms(f[k]["step_floor_s"])),
            ("step, fused (ms)", lambda k: _below_noise(b[k]["step_fused_s"], _ms)),
            ("fused / floor", lambda k: _below_noise(f[k]["step_fused_over_floor"], "{:.2f}".format)),
            ("step p50, stepped (ms)", lambda k: _ms(b[k]["stepped"]["step_p50_s"])),
            ("p50 / floor", lambda k: f"{f[k]['step_p50_over_floor']:.2f}"),
        ],
    )


def _floor_end_to_end(res: dict[str, Any]) -> list[str]:
    """Per model: the prefill and the end-to-end time over their floors."""
    b, f = res["table_b"], res["floor"]["rows"]
    return _per_model(
        res,
        [
            ("prefill GFLOP", lambda k: f"{f[k]['prefill_flops'] / 1e9:.1f}"),
            ("prefill floor (ms)", lambda k: _ms(f[k]["prefill_floor_s"])),
            ("prefill (ms)", lambda k: _ms(b[k]["stepped"]["prefill_s"])),
            ("prefill / floor", lambda k: f"{f[k]['prefill_over_floor']:.2f}"),
            ("end-to-end floor (s)", lambda k: f"{f[k]['e2e_floor_s']:.3f}"),
            ("end to end (s)", lambda k: f"{f[k]['e2e_measured_s']:.3f}"),
            ("end to end / floor", lambda k: f"{f[k]['e2e_over_floor']:.2f}"),
        ],
    )


def _section_d(res: dict[str, Any]) -> list[str]:
    """Table d: HuggingFace ``generate`` on the same weights against ours (or why it was skipped)."""
    st, b, h = res["settings"], res["table_b"], res["hf"]
    N, T = st["config"]["num_heads"], st["new_tokens"]
    title = f"## d. HuggingFace `generate` on the same weights ({_shape(st)})"
    if "skipped" in h:
        return [title, "", h["skipped"]]
    table = _per_model(
        res,
        [
            (
                "HF",
                lambda k: "MHA (the same weights)" if k == N else "MHA (the weights it was converted from)",
            ),
            ("ours (s)", lambda k: f"{b[k]['fused']['median_s']:.3f}"),
            ("HF (s)", lambda k: f"{h['median_s']:.3f}"),
            ("HF / ours", lambda k: f"{h['ratio_hf_over_ours'][k]:.2f}x"),
            ("ours tokens/s", lambda k: f"{b[k]['tokens_per_s']:.1f}"),
            ("HF tokens/s", lambda k: f"{h['tokens_per_s']:.1f}"),
        ],
        first="ours",
    )
    return [
        title,
        "",
        *table,
        "",
        "HF: `T5ForConditionalGeneration.generate(num_beams=1, do_sample=False, use_cache=True, "
        f"min_new_tokens=max_new_tokens={T})` on {h.get('device', 'cpu')}, torch {h['torch_threads']} "
        f"thread(s), median of {h['runs']} runs after one warm-up. Same weights: max |logits diff| "
        f"{res['hf_parity_max_abs_diff']:.2e} (checked in this run); greedy tokens equal ours (MHA) at "
        f"{100 * h['token_agreement_with_ours_mha']:.1f}% of positions "
        "(HF suppresses EOS, ours ignores it).",
    ]


def _per_model(res: dict[str, Any], columns: list[tuple[str, Any]], first: str = "model") -> list[str]:
    """A table of one row per model: its name (under ``first``), then ``columns``."""
    name = _names(res)
    return md_table([(first, lambda k: name[k]), *columns], res["settings"]["kv_heads"])


def _or_dash(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _below_noise(value: float, fmt: Any) -> str:
    return "below noise" if math.isnan(value) else fmt(value)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def _names(res: dict[str, Any]) -> dict[int, str]:
    """Each model's name, by its K/V heads."""
    return {k: res["table_b"][k]["name"] for k in res["settings"]["kv_heads"]}


def _shape(st: dict[str, Any]) -> str:
    return f"batch {st['batch']}, input {st['input_len']}, {st['new_tokens']} new tokens"
