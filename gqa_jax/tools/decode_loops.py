"""The timed decoding paths of ``bench decode`` (``measurement.measure``'s rule; EOS disabled, so every
row emits exactly T tokens and every path is checked for it):

- fused: ``decoding.greedy_decode`` (encoder + ``lax.while_loop`` in one jitted call) gives the
  end-to-end time, tokens/s and time per sample;
- stepped: ``decoding.start`` (the prefill), then ``decoding.step`` called from Python and blocked
  on after each step, gives TTFT and the per-step latencies (p50 / p95): the fused loop's programs,
  with its settings and kernel (``decoding.decode_config``), the weights laid out for the steps
  once beforehand (``decoding.step_weights``), as the fused loop lays them out once per decode;
- uncached: ``uncached.greedy_decode`` (every step re-runs the whole decoder), or its
  estimate where the full loop would take too long.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gqa_jax import cache as kvcache
from gqa_jax import decoding, uncached
from gqa_jax.tools.bench_models import NEVER_EOS, Split
from gqa_jax.tools.measurement import measure, percentile


# ------------------------------------------------------------------------ fused and stepped
def bench_fused(
    split: Split, ids: np.ndarray, T: int, runs: int, cache_dtype: str | None = None
) -> dict[str, Any]:
    """``greedy_decode`` end to end (one jitted call); checks that every row emitted T tokens."""

    def decode() -> Any:
        return decoding.greedy_decode(split, ids, T, eos_id=NEVER_EOS, cache_dtype=cache_dtype)

    timing, result = measure(decode, runs)
    lengths = np.asarray(result.lengths)
    if not (lengths == T).all():
        raise RuntimeError(f"greedy_decode emitted {lengths.tolist()} tokens per row, expected {T}")
    return {**timing, "tokens": np.asarray(result.tokens)}


def bench_stepped(
    split: Split, ids: np.ndarray, T: int, runs: int, cache_dtype: str | None = None
) -> dict[str, Any]:
    """TTFT (jitted prefill + first jitted step, median of ``runs``), then the remaining T - 1
    steps of the last run one by one: per-step latencies, and the cache bytes measured."""
    graphdef, params = split
    config = decoding.decode_config(T, eos_id=NEVER_EOS, cache_dtype=cache_dtype)  # greedy_decode's
    prefill = functools.partial(decoding.start, graphdef, config=config)
    step = functools.partial(decoding.step, graphdef, config=config)  # the state donated
    ids, key, greedy = jnp.asarray(ids), jax.random.key(0), jnp.float32(0.0)

    def timed(fn, *args):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        return out, time.perf_counter() - start

    weights = jax.block_until_ready(
        decoding.step_weights(graphdef, params, config)
    )  # once per model, untimed
    state, prefill_first = timed(prefill, params, ids, key)
    state, step_first = timed(step, weights, state, greedy)
    prefill_times, ttfts = [], []
    for _ in range(runs):
        state, t_prefill = timed(prefill, params, ids, key)
        state, t_step = timed(step, weights, state, greedy)
        prefill_times.append(t_prefill)
        ttfts.append(t_prefill + t_step)
    latencies = []
    for _ in range(T - 1):
        state, t_step = timed(step, weights, state, greedy)
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
        "cache_dtype": str(jax.tree.leaves(state.cache.self_k[0])[0].dtype),  # a quantized entry: its values
    }


# ------------------------------------------------------------------------- the cache-free path
def _uncached_pass(graphdef: Any, params: Any, inputs, cross_kv, mask, t):
    """One step of ``uncached.greedy_decode``: the whole decoder over all T positions.

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
                lambda T=T: uncached.greedy_decode(split, ids, T, eos_id=NEVER_EOS), runs
            )
            if not (np.asarray(result.lengths) == T).all():
                raise RuntimeError(f"uncached decoding emitted {np.asarray(result.lengths)}, expected {T}")
            row.update(timing)
        out[T] = row
    return out
