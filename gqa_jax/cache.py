"""KV cache of the T5 decoder: the cache pytree, its per-row update, and byte accounting.

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

import jax
import jax.numpy as jnp
from flax import struct

from gqa_jax.config import ModelConfig
from gqa_jax.sharding import constrain

Array = jax.Array


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


# ------------------------------------------------------------------------- the cache pytree
@struct.dataclass
class KVCache:
    """Decoder KV cache, an explicit pytree passed into and returned from every decode step.

    ``self_k`` / ``self_v``: one ``[B, K_self, T_max, H]`` array per decoder layer, written at
    ``index`` (per row: the next position to write). ``cross_k`` / ``cross_v``: one
    ``[B, K_cross, S, H]`` array per layer, projected ONCE from the encoder output at prefill
    (T5X re-projects them at every step). ``cross_mask [B, S]``: False at encoder padding.
    """

    self_k: tuple[Array, ...]
    self_v: tuple[Array, ...]
    cross_k: tuple[Array, ...]
    cross_v: tuple[Array, ...]
    cross_mask: Array
    index: Array  # [B] int32

    @property
    def max_decode_len(self) -> int:
        return self.self_k[0].shape[2]


def empty_self_cache(
    config: ModelConfig, batch: int, max_decode_len: int, dtype: Any
) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
    """Zeroed self-attention keys and values: per layer ``[B, K_self, T_max, H]``."""
    shape = (batch, config.kv_heads("decoder_self"), max_decode_len, config.head_dim)
    keys = tuple(constrain(jnp.zeros(shape, dtype), "kv") for _ in range(config.num_decoder_layers))
    return keys, tuple(constrain(jnp.zeros(shape, dtype), "kv") for _ in range(config.num_decoder_layers))


def write(cache: Array, new: Array, index: Array) -> Array:
    """Write ``new [B, K, T, H]`` into ``cache [B, K, T_max, H]`` at each row's ``index [B]``."""
    update = jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (0, i, 0)))
    return constrain(update(cache, new.astype(cache.dtype), index), "kv")


def cache_bytes(cache: KVCache) -> dict[str, int]:
    """Bytes of the cached keys and values, measured from the arrays (masks and index excluded)."""
    self_bytes = sum(x.nbytes for x in (*cache.self_k, *cache.self_v))
    cross_bytes = sum(x.nbytes for x in (*cache.cross_k, *cache.cross_v))
    return {"self": self_bytes, "cross": cross_bytes, "total": self_bytes + cross_bytes}


def check_cache(config: ModelConfig, cache: KVCache) -> None:
    """Raise a ValueError if ``cache`` was not built for ``config`` (layers, K/V heads, head dim)."""
    L, H = config.num_decoder_layers, config.head_dim
    problems = []
    if len(cache.self_k) != L or len(cache.cross_k) != L:
        problems.append(f"{len(cache.self_k)} cached layers, config has num_decoder_layers={L}")
    else:
        for kind, arrays in (("decoder_self", cache.self_k), ("cross", cache.cross_k)):
            K = config.kv_heads(kind)
            if arrays[0].shape[1] != K or arrays[0].shape[3] != H:
                problems.append(
                    f"{kind} cache {arrays[0].shape} needs [B, K={K}, length, H={H}] (num_kv_heads={K})"
                )
    if problems:
        raise ValueError("KV cache was built for another config: " + "; ".join(problems))
