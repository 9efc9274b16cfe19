"""KV cache of the T5 decoder: byte accounting (the cache pytree itself comes later).

Letters: ``B`` batch, ``S`` encoder (input) length, ``T`` decoder (output) length, ``N`` query
heads, ``K`` K/V heads, ``H`` head dim, ``L`` decoder layers.

A decoder layer caches keys and values for two attentions, both at ``K`` heads (never ``N``):

- self-attention: ``[B, K, T, H]`` keys + values per layer, ``K = config.kv_heads("decoder_self")``;
- cross-attention: ``[B, K, S, H]`` keys + values per layer over the encoder output,
  ``K = config.kv_heads("cross")``, computed once per input.

So (PAPER.md) ``bytes = 2 (K and V) x L x B x length x K x H x itemsize``: doubling a length
doubles its part, halving ``K`` halves it, and GQA-K holds ``K / N`` of the MHA bytes.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from gqa_jax.config import ModelConfig


def itemsize(dtype: Any) -> int:
    """Bytes per element of a numeric dtype given by name (``"bfloat16"``) or object."""
    try:
        dt = jnp.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"unknown dtype {dtype!r}; e.g. float32, bfloat16, float16, int8") from e
    if not (jnp.issubdtype(dt, jnp.floating) or jnp.issubdtype(dt, jnp.integer)):
        raise ValueError(f"dtype {dtype!r} is not a floating or integer dtype; a cache holds numbers")
    return int(dt.itemsize)


def cache_bytes_per_token(config: ModelConfig, dtype: Any) -> dict[str, int]:
    """Cache bytes added per token at batch 1, over all decoder layers.

    Returns ``{"self": bytes per output (decoder) token, "cross": bytes per input (encoder) token}``,
    i.e. ``2 x L x K x H x itemsize`` with the K of each attention.
    """
    size = itemsize(dtype)
    L, H = config.num_decoder_layers, config.head_dim
    return {
        "self": 2 * L * config.kv_heads("decoder_self") * H * size,
        "cross": 2 * L * config.kv_heads("cross") * H * size,
    }


def expected_cache_bytes(
    config: ModelConfig, batch: int, input_len: int, output_len: int, dtype: Any
) -> dict[str, int]:
    """Bytes of a full decode cache: ``{"self": ..., "cross": ..., "total": ...}``.

    ``self = 2 x L x B x T x K_self x H x itemsize`` (``T = output_len``) and
    ``cross = 2 x L x B x S x K_cross x H x itemsize`` (``S = input_len``).
    """
    for name, value in (("batch", batch), ("input_len", input_len), ("output_len", output_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"expected_cache_bytes: {name}={value!r} must be a positive integer")
    per_token = cache_bytes_per_token(config, dtype)
    self_bytes = batch * output_len * per_token["self"]
    cross_bytes = batch * input_len * per_token["cross"]
    return {"self": self_bytes, "cross": cross_bytes, "total": self_bytes + cross_bytes}
