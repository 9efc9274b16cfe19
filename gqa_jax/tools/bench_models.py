"""The decoding benchmarks' models and inputs (``bench decode``, ``bench step``): which K/V head
counts, the random MHA model of a preset and its ``mean`` conversions (``convert.to_grouped``, as
the paper does before uptraining), and the random encoder inputs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx

from gqa_jax import convert
from gqa_jax import model as model_lib
from gqa_jax.config import ModelConfig, divisors
from gqa_jax.model import T5

NEVER_EOS = -1  # no token id equals it: decoding never stops early
DEFAULT_RULE = "the default: N, N/2, N/4, 1, each rounded down to a divisor of N, deduplicated"

Split = tuple[Any, Any]  # nnx.split(model): (graphdef, params)


# ------------------------------------------------------------------------- K/V head choices
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


def parse_lengths(text: str, flag: str = "--lengths") -> list[int]:
    """``"64,256,512"`` -> [64, 256, 512] (sorted, deduplicated); errors name ``flag``."""
    try:
        lengths = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"{flag}={text!r} must be comma-separated integers") from None
    if not lengths or lengths[0] < 1:
        raise ValueError(f"{flag}={text!r} must be positive integers")
    return lengths


# --------------------------------------------------------------------------------- models
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
    mha = model_lib.build(config, seed=seed)
    jax.block_until_ready(nnx.state(mha))
    log(f"random MHA model: {time.perf_counter() - start:.1f} s")
    models = {config.num_heads: (config, mha)}
    for k in kv_heads:
        if k != config.num_heads:
            start = time.perf_counter()
            params, k_config, _ = convert.to_grouped(mha, config, k, "mean")
            models[k] = (k_config, model_lib.build(k_config, params))
            jax.block_until_ready(nnx.state(models[k][1]))
            log(f"mean conversion to K = {k}: {time.perf_counter() - start:.1f} s")
    return models
