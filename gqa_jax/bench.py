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

Timing rules: every timed function is jitted; its first call (compile + run) is the warm-up and
is excluded; a timing is the median of ``runs`` later calls, each ended by
``jax.block_until_ready``; compile time = first call - that median. Two ways to decode:

- fused: ``decoding.greedy_decode`` (encoder + ``lax.while_loop`` in one jitted call) gives
  the end-to-end time, tokens/s and time per sample;
- stepped: a jitted prefill, then the jitted ``decoding.decode_step`` called from Python and
  blocked on after each step, gives TTFT and the per-step latencies (p50 / p95).

EOS is disabled (``eos_id=-1``; HF: ``min_new_tokens = max_new_tokens``) so every row emits
exactly ``T`` tokens: random weights would otherwise stop at random places.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gqa_jax import cache as kvcache
from gqa_jax import convert, decoding
from gqa_jax.config import ModelConfig, divisors, preset
from gqa_jax.info import attention_name
from gqa_jax.model import T5

NEVER_EOS = -1  # no token id equals it: decoding never stops early
_BIG_MATRIX = 16 * 2**20  # a bandwidth probe must not fit in the CPU caches (bytes)
_BIG_MATRIX_ACCELERATOR = 256 * 2**20  # nor in a GPU's L2 (60 MB on an H200) or a TPU's VMEM
_PROJECTIONS = ("query", "key", "value", "out", "wi_0", "wi_1", "wo")  # [in, out]-style matrices


# ---------------------------------------------------------------------------------- timing
def measure(fn: Callable[[], Any], runs: int) -> tuple[dict[str, Any], Any]:
    """Call ``fn`` once (compile + warm-up, excluded), then ``runs`` times; block on each result.

    Returns ``({"median_s", "times_s", "first_s", "compile_s", "runs"}, first result)``.
    """
    start = time.perf_counter()
    first = jax.block_until_ready(fn())
    first_s = time.perf_counter() - start
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    timing = {"median_s": median, "times_s": times, "first_s": first_s, "runs": runs}
    timing["compile_s"] = max(first_s - median, 0.0)
    return timing, first


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d.device_kind) for d in jax.devices()],
        "device_count": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": _cpu_model() or platform.processor() or platform.machine(),
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    return info


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


# ------------------------------------------------------------------------- K/V head choices
_DEFAULT_RULE = "the default: N, N/2, N/4, 1, each rounded down to a divisor of N, deduplicated"


def default_kv_heads(num_heads: int) -> list[int]:
    """N, N/2, N/4, 1, each rounded down to a divisor of N, deduplicated (N=6 -> 6, 3, 1)."""
    divs = divisors(num_heads)
    picks = [max(d for d in divs if d <= num_heads / f) for f in (1, 2, 4)] + [1]
    return sorted(set(picks), reverse=True)


def parse_kv_heads(text: str | None, num_heads: int) -> list[int]:
    """``"6,3,1"`` -> [6, 3, 1]; N (the MHA reference) is always included."""
    if text is None:
        return default_kv_heads(num_heads)
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--kv-heads={text!r} must be comma-separated integers") from None
    bad = [k for k in ks if k < 1 or num_heads % k]
    if bad or not ks:
        raise ValueError(
            f"--kv-heads {bad or text!r}: each must divide num_heads={num_heads}: {divisors(num_heads)}"
        )
    return sorted({num_heads, *ks}, reverse=True)


def parse_lengths(text: str) -> list[int]:
    """``"64,256,512"`` -> [64, 256, 512] (sorted, deduplicated)."""
    try:
        lengths = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--lengths={text!r} must be comma-separated integers") from None
    if not lengths or lengths[0] < 1:
        raise ValueError(f"--lengths={text!r} must be positive integers")
    return lengths


# --------------------------------------------------------------------------------- models
Split = tuple[Any, Any]  # nnx.split(model): (graphdef, params)


def random_ids(vocab_size: int, batch: int, length: int, seed: int) -> np.ndarray:
    """The benchmarks' encoder inputs: ``[batch, length]`` int32 ids in ``[2, vocab_size)`` (no
    pad, no EOS), the same for a given seed."""
    return np.random.default_rng(seed).integers(2, vocab_size, size=(batch, length)).astype(np.int32)


def build_models(
    config: ModelConfig, kv_heads: list[int], seed: int, log: Callable[[str], None] = lambda _: None
) -> dict[int, tuple[ModelConfig, T5]]:
    """The random MHA model and its ``mean`` conversions to each K (``{K: (config, model)}``);
    ``log`` hears how long each took."""
    start = time.perf_counter()
    mha = T5(config, rngs=nnx.Rngs(seed))
    jax.block_until_ready(nnx.state(mha))
    log(f"random MHA model: {time.perf_counter() - start:.1f} s")
    models = {config.num_heads: (config, mha)}
    for k in kv_heads:
        if k != config.num_heads:
            start = time.perf_counter()
            params, k_config, _ = convert.to_grouped(mha, config, k, "mean")
            models[k] = (k_config, convert.to_model(params, k_config))
            jax.block_until_ready(nnx.state(models[k][1]))
            log(f"mean conversion to K = {k}: {time.perf_counter() - start:.1f} s")
    return models


def _flat_params(model: T5) -> dict[tuple[Any, ...], jax.Array]:
    return {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


# ------------------------------------------------------------------------ fused and stepped
def bench_fused(split: Split, ids: np.ndarray, T: int, runs: int) -> dict[str, Any]:
    """``greedy_decode`` end to end (one jitted call); checks that every row emitted T tokens."""
    timing, result = measure(lambda: decoding.greedy_decode(split, ids, T, eos_id=NEVER_EOS), runs)
    lengths = np.asarray(result.lengths)
    if not (lengths == T).all():
        raise RuntimeError(f"greedy_decode emitted {lengths.tolist()} tokens per row, expected {T}")
    return {**timing, "tokens": np.asarray(result.tokens)}


def _prefill_state(graphdef: Any, T: int, params: Any, ids: jax.Array, key: jax.Array):
    model = nnx.merge(graphdef, params)
    cache = decoding.prefill(model, ids, T, chunked=decoding._fast_steps(None))  # as greedy_decode's
    return decoding.init_state(cache, key, vocab_size=model.config.vocab_size, return_logits=False)


def _step(graphdef: Any, params: Any, state: Any):
    return decoding.decode_step(nnx.merge(graphdef, params), state, eos_id=NEVER_EOS)


def bench_stepped(split: Split, ids: np.ndarray, T: int, runs: int) -> dict[str, Any]:
    """TTFT (jitted prefill + first jitted step, median of ``runs``), then the remaining T - 1
    steps of the last run one by one: per-step latencies, and the cache bytes measured."""
    graphdef, params = split
    prefill = jax.jit(functools.partial(_prefill_state, graphdef, T))
    step = jax.jit(functools.partial(_step, graphdef), donate_argnums=1)  # the cache is updated in place
    ids, key = jnp.asarray(ids), jax.random.key(0)

    def timed(fn, *args):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        return out, time.perf_counter() - start

    state, prefill_first = timed(prefill, params, ids, key)
    state, step_first = timed(step, params, state)
    prefill_times, ttfts = [], []
    for _ in range(runs):
        state, t_prefill = timed(prefill, params, ids, key)
        state, t_step = timed(step, params, state)
        prefill_times.append(t_prefill)
        ttfts.append(t_prefill + t_step)
    latencies = []
    for _ in range(T - 1):
        state, t_step = timed(step, params, state)
        latencies.append(t_step)
    if int(state.step) != T or not (np.asarray(state.lengths) == T).all():
        raise RuntimeError(f"stepped decoding ran {int(state.step)} steps, expected {T}")
    prefill_s = statistics.median(prefill_times)
    step_p50 = statistics.median(latencies) if latencies else float("nan")
    return {
        "prefill_s": prefill_s,
        "prefill_compile_s": max(prefill_first - prefill_s, 0.0),
        "step_compile_s": max(step_first - step_p50, 0.0) if latencies else float("nan"),
        "ttft_s": statistics.median(ttfts),
        "ttft_times_s": ttfts,
        "step_latencies_s": latencies,
        "step_p50_s": step_p50,
        "step_p95_s": percentile(latencies, 95) if latencies else float("nan"),
        "cache_bytes": kvcache.cache_bytes(state.cache),
        "cache_dtype": str(state.cache.self_k[0].dtype),
    }


# ------------------------------------------------------------------------- the cache-free path
def _uncached_pass(graphdef: Any, params: Any, inputs, cross_kv, mask, t):
    """One step of ``decoding.uncached_greedy_decode``: the whole decoder over all T positions.

    The cross-attention K/V projection of the encoder output is loop-invariant and XLA hoists
    it out of the compiled loop, so the pass takes it precomputed (a pass that re-projects it
    overestimated the loop's steps several times over). Table a's notes compare estimate and
    measurement wherever the full loop ran."""
    model = nnx.merge(graphdef, params)
    hidden, _ = model.decoder(model.shared(inputs), cross_kv, mask)  # [B, T, D]
    logits = model.logits(hidden)  # [B, T, V]
    return jnp.argmax(jax.lax.dynamic_index_in_dim(logits, t, axis=1, keepdims=False), -1)


def bench_uncached(
    split: Split, ids: np.ndarray, lengths: list[int], runs: int, budget_s: float, prefill_s: float
) -> dict[int, dict[str, Any]]:
    """Without a cache: estimate = ``prefill_s`` (encoder + cross K/V, timed on the cached path) +
    T x (one timed decoder pass over T positions); the full loop is run (and timed, ``runs``
    times after its compiling call) only where that estimate is within ``budget_s``."""
    graphdef, params = split
    ids_j = jnp.asarray(ids)
    cross_kv = jax.jit(lambda p, i: (m := nnx.merge(graphdef, p)).decoder.cross_kv(m.encode(i)))(
        params, ids_j
    )
    step = jax.jit(functools.partial(_uncached_pass, graphdef))
    out = {}
    for T in lengths:
        inputs = jnp.zeros((ids.shape[0], T), jnp.int32)
        step_timing, _ = measure(lambda i=inputs: step(params, i, cross_kv, ids_j != 0, jnp.int32(0)), 2)
        estimate = prefill_s + T * step_timing["median_s"]
        row: dict[str, Any] = {
            "estimate_s": estimate,
            "step_s": step_timing["median_s"],
            "prefill_s": prefill_s,
        }
        if estimate <= budget_s:
            timing, result = measure(
                lambda T=T: decoding.uncached_greedy_decode(split, ids, T, eos_id=NEVER_EOS), runs
            )
            if not (np.asarray(result.lengths) == T).all():
                raise RuntimeError(f"uncached decoding emitted {np.asarray(result.lengths)}, expected {T}")
            row.update(timing)
        out[T] = row
    return out


# ---------------------------------------------------------------------------------- the floor
def on_accelerator() -> bool:
    """True when JAX runs on a GPU or TPU (the probes grow, HF follows onto the GPU)."""
    return jax.default_backend() != "cpu"


def probe_sizes(d_model: int, vocab: int) -> dict[str, Any]:
    """Bandwidth probe shapes, the least bytes a probe must have to count, and the matmul size:
    the output layer's [D, V] and a 4096^2 matrix; on an accelerator also a 16384^2 one (the
    others fit in an H200's 60 MB L2) and an 8192^3 matmul (2048^3 is over in microseconds)."""
    if on_accelerator():
        return {
            "shapes": [(d_model, vocab), (4096, 4096), (16384, 16384)],
            "big": _BIG_MATRIX_ACCELERATOR,
            "n": 8192,
        }
    return {"shapes": [(d_model, vocab), (4096, 4096)], "big": _BIG_MATRIX, "n": 2048}


def measure_read_bandwidth(
    batch: int, shapes: list[tuple[int, int]], dtype: Any, runs: int, big: int = _BIG_MATRIX
) -> dict:
    """``[B, D] x [D, V]`` products: GB/s = matrix bytes / median time, per shape and per weight
    layout: ``[D, V]`` contracted as stored (``in_out``) and ``[V, D]`` contracted out-major as
    the CPU decode loop does (``out_in``, ``layers.project``). The reference is the fastest
    product on a matrix of at least ``big`` bytes (a smaller one would measure the caches)."""
    products = {
        "in_out": jax.jit(lambda x, w: x @ w),  # w [D, V]
        "out_in": jax.jit(lambda x, wt: jax.lax.optimization_barrier(wt @ x.T).T),  # wt [V, D]
    }
    results = []
    for d, v in shapes:
        w = jax.random.normal(jax.random.key(1), (d, v), jnp.float32).astype(dtype)
        x = jnp.ones((batch, d), dtype)
        nbytes = int(w.nbytes)
        for layout, product in products.items():
            weight = w if layout == "in_out" else w.T  # eager: a [V, D] array of its own
            timing, _ = measure(lambda x=x, w=weight, f=product: f(x, w), runs)
            results.append(
                {"shape": [batch, d, v], "layout": layout, "bytes": nbytes, "median_s": timing["median_s"]}
                | {"gb_s": nbytes / timing["median_s"] / 1e9}
            )
            del weight
    counted = [r for r in results if r["bytes"] >= big] or results
    return {"probes": results, "reference": max(counted, key=lambda r: r["gb_s"]), "big_bytes": big}


def measure_matmul_rate(n: int, dtype: Any, runs: int) -> dict[str, Any]:
    """A jitted ``[n, n] x [n, n]`` product: GFLOP/s = 2 n^3 / median time."""
    a = jax.random.normal(jax.random.key(2), (n, n), jnp.float32).astype(dtype)
    matmul = jax.jit(jnp.matmul)
    timing, _ = measure(lambda: matmul(a, a), runs)
    return {
        "shape": [n, n, n],
        "median_s": timing["median_s"],
        "gflop_s": 2 * n**3 / timing["median_s"] / 1e9,
    }


def step_reads(model: T5, config: ModelConfig, batch: int) -> dict[str, int]:
    """Bytes of parameters one decode step reads, counted from the parameters: decoder
    self-attention, cross-attention query / out (its K/V are in the cache), MLPs, norms, the
    decoder's relative position table, the output layer, and the B gathered embedding rows.
    Also the step's matmul FLOPs on those weights (``2 x B x elements``)."""
    weights, flops = 0, 0
    for path, value in _flat_params(model).items():
        size, nbytes = int(value.size), int(value.nbytes)
        if path[0] == "shared":
            if config.tie_word_embeddings:  # the embedding is also the output layer: all of it
                weights, flops = weights + nbytes, flops + 2 * batch * size
            else:
                weights += batch * nbytes // config.vocab_size  # B rows of [V, D]
        elif path[0] == "lm_head":
            weights, flops = weights + nbytes, flops + 2 * batch * size
        elif path[0] == "decoder" and not ("cross_attn" in path and path[-1] in ("key", "value")):
            weights += nbytes
            if path[-1] in _PROJECTIONS:
                flops += 2 * batch * size
    return {"weight_bytes": weights, "weight_flops": flops}


def prefill_flops(model: T5, config: ModelConfig, batch: int, input_len: int) -> int:
    """Matmul FLOPs of prefill: the encoder (projections, MLPs, attention scores and values) and
    the decoder's one-time cross-attention K/V projections. Norms and biases are ignored."""
    B, S, N, H = batch, input_len, config.num_heads, config.head_dim
    flops = 4 * B * N * S * S * H * config.num_encoder_layers  # QK^T and PV
    for path, value in _flat_params(model).items():
        encoder = path[0] == "encoder" and path[-1] in _PROJECTIONS
        cross_kv = path[0] == "decoder" and "cross_attn" in path and path[-1] in ("key", "value")
        if encoder or cross_kv:
            flops += 2 * B * S * int(value.size)
    return flops


def floor_row(
    model: T5,
    config: ModelConfig,
    *,
    batch: int,
    input_len: int,
    new_tokens: int,
    cache_bytes: dict[str, int],
    bandwidth_gb_s: float,
    gflop_s: float,
) -> dict[str, Any]:
    """The floor of one model: per decode step max(bytes / bandwidth, FLOPs / rate), where the
    bytes are the weights above plus the whole allocated cache (all T slots of the
    self-attention K/V are read every step, masked or not; all layers' cross K/V); end to end
    the prefill FLOPs / rate plus T steps."""
    reads = step_reads(model, config, batch)
    N, H, L = config.num_heads, config.head_dim, config.num_decoder_layers
    attn_flops = 4 * batch * N * H * (new_tokens + input_len) * L  # scores + values, self and cross
    step_bytes = reads["weight_bytes"] + cache_bytes["self"] + cache_bytes["cross"]
    step_flops = reads["weight_flops"] + attn_flops
    step_floor = max(step_bytes / (bandwidth_gb_s * 1e9), step_flops / (gflop_s * 1e9))
    p_flops = prefill_flops(model, config, batch, input_len)
    prefill_floor = p_flops / (gflop_s * 1e9)
    return {
        "weight_bytes": reads["weight_bytes"],
        "self_cache_bytes": cache_bytes["self"],
        "cross_cache_bytes": cache_bytes["cross"],
        "step_bytes": step_bytes,
        "step_flops": step_flops,
        "step_floor_s": step_floor,
        "step_bound": "bandwidth" if step_bytes / bandwidth_gb_s >= step_flops / gflop_s else "compute",
        "prefill_flops": p_flops,
        "prefill_floor_s": prefill_floor,
        "e2e_floor_s": prefill_floor + new_tokens * step_floor,
    }


# ------------------------------------------------------------------------------ HuggingFace
def hf_unavailable(dtype: str = "float32") -> str | None:
    """None if HF can run beside us at ``dtype`` (on our device kind), else the reason."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        return "skipped: transformers/torch not installed"
    if on_accelerator() and not torch.cuda.is_available():
        return f"skipped: JAX runs on {jax.default_backend()} but torch sees no CUDA device"
    if hf_device() == "cpu" and dtype != "float32":
        return f"skipped: on the CPU the HF comparison runs at float32 only (--dtype {dtype})"
    return None


def hf_device() -> str:
    """Where HF runs: the GPU when JAX runs on one (and torch sees it), else the CPU."""
    import torch

    return "cuda" if on_accelerator() and torch.cuda.is_available() else "cpu"


def to_hf(model: T5, config: ModelConfig, device: str = "cpu", dtype: str = "float32"):
    """A ``transformers.T5ForConditionalGeneration`` holding ``model``'s (MHA) weights, on
    ``device`` at ``dtype``.

    The import table of ``checkpoints/hf.py`` read backwards: ours ``[D, N, H]`` -> HF
    ``[N*H, D]``, ``[N, H, D]`` -> ``[D, N*H]``, ``[D, F]`` -> ``[F, D]``; the rest as is.
    """
    import torch
    import transformers

    from gqa_jax.checkpoints.hf import _tensor_map

    grouped = [
        kind
        for kind in ("encoder_self", "decoder_self", "cross")
        if config.kv_heads(kind) != config.num_heads
    ]
    if grouped or config.tie_word_embeddings:
        raise ValueError(f"to_hf: HF T5 needs MHA and an untied lm_head; grouped={grouped}")
    hf_config = transformers.T5Config(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        d_kv=config.head_dim,
        d_ff=config.d_ff,
        num_layers=config.num_encoder_layers,
        num_decoder_layers=config.num_decoder_layers,
        num_heads=config.num_heads,
        relative_attention_num_buckets=config.relative_attention_num_buckets,
        relative_attention_max_distance=config.relative_attention_max_distance,
        dropout_rate=0.0,
        layer_norm_epsilon=config.layer_norm_epsilon,
        feed_forward_proj=config.mlp_activation,
        tie_word_embeddings=False,  # transformers 5: "do not scale the decoder output"
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    with torch.device("meta"):  # no random init; every parameter is assigned below
        hf = transformers.T5ForConditionalGeneration(hf_config)
    flat = _flat_params(model)

    def assign(name: str, array: np.ndarray) -> torch.nn.Parameter:
        module_name, _, leaf = name.rpartition(".")
        param = torch.nn.Parameter(torch.from_numpy(np.array(array, dtype=np.float32)), requires_grad=False)
        setattr(hf.get_submodule(module_name), leaf, param)
        return param

    for name, (shape, path, _) in _tensor_map(config).items():
        w = np.asarray(flat[path])
        if path[-1] in _PROJECTIONS:
            w = w.reshape(shape[::-1]).T
        assign(name, w)
    shared = hf.shared.weight
    hf.encoder.embed_tokens.weight = shared  # HF ties these to `shared` at init (not on meta)
    hf.decoder.embed_tokens.weight = shared
    assign("lm_head.weight", np.asarray(flat[("lm_head",)]).T)  # untied (T5.1.1)
    left = [n for n, t in [*hf.named_parameters(), *hf.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"to_hf: parameters not assigned: {left}")
    return hf.to(device=device, dtype=getattr(torch, dtype)).eval()


def hf_parity(hf, model: T5, config: ModelConfig, seed: int) -> tuple[float, float]:
    """Max |logits difference| of HF vs ours on a small batch (2 x 16 inputs, 8 decoder tokens),
    and the largest |logit| (the scale a low-precision difference is judged against)."""
    import torch

    rng = np.random.default_rng(seed + 1)
    enc = rng.integers(2, config.vocab_size, size=(2, 16))
    dec = rng.integers(2, config.vocab_size, size=(2, 8))
    dec[:, 0] = 0
    device = next(hf.parameters()).device
    with torch.inference_mode():
        logits = hf(
            input_ids=torch.tensor(enc, device=device), decoder_input_ids=torch.tensor(dec, device=device)
        )
        ref = logits.logits.float().cpu().numpy()
    graphdef, params = nnx.split(model)
    forward = jax.jit(lambda p, e, d: nnx.merge(graphdef, p)(e, d))  # eager would compile op by op
    ours = np.asarray(forward(params, jnp.asarray(enc), jnp.asarray(dec)), np.float32)
    return float(np.abs(ours - ref).max()), float(np.abs(ref).max())


def bench_hf(hf, ids: np.ndarray, T: int, runs: int) -> dict[str, Any]:
    """HF ``generate``: greedy, KV cache on, exactly T new tokens; first call excluded."""
    import torch

    device = next(hf.parameters()).device
    input_ids = torch.tensor(ids, device=device)
    mask = input_ids != 0

    def generate():
        with torch.inference_mode():
            out = hf.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=T,
                min_new_tokens=T,
                num_beams=1,
                do_sample=False,
                use_cache=True,
                decoder_start_token_id=0,
            )
        if device.type == "cuda":
            torch.cuda.synchronize()  # block_until_ready for torch
        return out

    timing, out = measure(generate, runs)
    if out.shape != (ids.shape[0], T + 1):  # the start token, then T new tokens
        raise RuntimeError(f"HF generate returned shape {tuple(out.shape)}, expected {(ids.shape[0], T + 1)}")
    return {
        **timing,
        "tokens": out[:, 1:].cpu().numpy(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
    }


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
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run tables a-d; returns every number (JSON-able after :func:`to_json`). Progress goes to
    ``log`` (default: stderr, with the elapsed time)."""
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
            "kv_heads_rule": "given; N is always added" if kv_heads else _DEFAULT_RULE,
            "lengths": lengths,
            "runs": runs,
            "runs_a": runs_a,
            "uncached_runs": uncached_runs,
            "uncached_budget_s": uncached_budget_s,
            "dtype": dtype,
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
    matmul = measure_matmul_rate(probes["n"], dtype, runs)
    res["floor"] = {"bandwidth": bandwidth, "matmul": matmul, "rows": {}}

    res["table_b"] = {}
    for k in ks:
        k_config, model = models[k]
        name = attention_name(k, N)
        log(f"b. {name}: fused greedy loop ({runs} runs) and stepped loop ...")
        fused = bench_fused(splits[k], ids, T, runs)
        stepped = bench_stepped(splits[k], ids, T, runs)
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
            "tpot_s": (fused["median_s"] - stepped["ttft_s"]) / (T - 1) if T > 1 else float("nan"),
            "step_fused_s": (fused["median_s"] - stepped["prefill_s"]) / T,
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
            cached = {key: v for key, v in bench_fused(splits[N], ids, L, runs_a).items() if key != "tokens"}
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
Column = tuple[str, Callable[[Any], str]]  # (header, item -> cell)


def _md(columns: list[Column], items: list[Any]) -> list[str]:
    """A Markdown table: one row per item."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(cell(item) for _, cell in columns) + " |" for item in items]


def _or_dash(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


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
        f"{T} new tokens, {st['dtype']}",
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

    out += _md(
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
    out += _md(
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
    big_mib = fl["bandwidth"].get("big_bytes", _BIG_MATRIX) // 2**20
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
        "floor + steps x step floor. Step, fused = (fused time - prefill time) / steps.",
        "",
    ]
    out += _md(
        [
            ("model", lambda k: name[k]),
            ("weights (MB)", lambda k: f"{f[k]['weight_bytes'] / 1e6:.1f}"),
            ("self K/V (MB)", lambda k: f"{f[k]['self_cache_bytes'] / 1e6:.1f}"),
            ("cross K/V (MB)", lambda k: f"{f[k]['cross_cache_bytes'] / 1e6:.1f}"),
            ("step floor (ms)", lambda k: _ms(f[k]["step_floor_s"])),
            ("step, fused (ms)", lambda k: _ms(b[k]["step_fused_s"])),
            ("fused / floor", lambda k: f"{f[k]['step_fused_over_floor']:.2f}"),
            ("step p50, stepped (ms)", lambda k: _ms(b[k]["stepped"]["step_p50_s"])),
            ("p50 / floor", lambda k: f"{f[k]['step_p50_over_floor']:.2f}"),
        ],
        ks,
    )
    out.append("")
    out += _md(
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
        out += _md(
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


def write_json(res: dict[str, Any], path: str | os.PathLike) -> None:
    with open(path, "w") as f:
        json.dump(to_json(res), f, indent=1)
        f.write("\n")


def to_json(res: Any) -> Any:
    """``res`` with numpy scalars / arrays turned into Python numbers and lists, keys into strings."""
    if isinstance(res, dict):
        return {str(k): to_json(v) for k, v in res.items()}
    if isinstance(res, list | tuple):
        return [to_json(v) for v in res]
    if isinstance(res, np.ndarray):
        return res.tolist()
    if isinstance(res, np.generic):
        return res.item()
    if isinstance(res, float) and not math.isfinite(res):
        return None
    return res
