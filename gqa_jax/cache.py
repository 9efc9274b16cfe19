"""KV cache of the T5 decoder: the cache pytree, its update at one shared index, and byte accounting.

Letters: ``B`` batch, ``S`` encoder (input) length, ``T`` decoder (output) length, ``N`` query
heads, ``K`` K/V heads, ``H`` head dim, ``L`` decoder layers.

A decoder layer caches keys and values for two attentions, both at ``K`` heads (never ``N``):

- self-attention: ``[B, K, T, H]`` keys + values per layer, ``K = config.kv_heads("decoder_self")``;
- cross-attention: ``[B, K, S, H]`` keys + values per layer over the encoder output,
  ``K = config.kv_heads("cross")``, computed once per input.

Every row writes at one shared position ``index`` (a scalar): T5's decoder starts every row at
position 0 and the rows step together, so one ``dynamic_update_slice`` writes the whole batch's new
K/V (as T5X and MaxText do), never a per-row scatter, which a TPU compiles to a loop over rows.

So (the paper's section 2) ``bytes = 2 (K and V) x L x B x length x K x H x itemsize``: doubling a length
doubles its part, halving ``K`` halves it, and GQA-K holds ``K / N`` of the MHA bytes. A quantized
cache (``cache_dtype`` int8 / fp8, ``gqa_jax.kv_quant``) holds 1-byte elements and a 4-byte scale
per token and K/V head: ``2 x L x B x length x K x (H + 4)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from gqa_jax import kv_quant, sharding
from gqa_jax.config import ModelConfig

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
    i.e. ``2 x L x K x H x itemsize`` with the K of each attention; for a quantized cache dtype
    (int8, fp8) ``2 x L x K x (H x 1 + 4)``, the 4 being each head's float32 scale.
    """
    name = _dtype_name(dtype)
    per_head = config.head_dim * itemsize(dtype) + (
        kv_quant.SCALE_BYTES if kv_quant.is_quantized(name) else 0
    )
    L = config.num_decoder_layers
    return {
        "self": 2 * L * config.kv_heads("decoder_self") * per_head,
        "cross": 2 * L * config.kv_heads("cross") * per_head,
    }


def _dtype_name(dtype: Any) -> str | None:
    try:
        return jnp.dtype(dtype).name
    except TypeError:
        return None


def expected_cache_bytes(
    config: ModelConfig, batch: int, input_len: int, output_len: int, dtype: Any
) -> dict[str, int]:
    """Bytes of a full decode cache: ``{"self": ..., "cross": ..., "total": ...}``.

    ``self = 2 x L x B x T x K_self x H x itemsize`` (``T = output_len``) and
    ``cross = 2 x L x B x S x K_cross x H x itemsize`` (``S = input_len``); ``H x itemsize``
    becomes ``H + 4`` for a quantized ``dtype`` (int8, fp8: the scales are counted).
    """
    for name, value in (("batch", batch), ("input_len", input_len), ("output_len", output_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"expected_cache_bytes: {name}={value!r} must be a positive integer")
    per_token = cache_bytes_per_token(config, dtype)
    self_bytes = batch * output_len * per_token["self"]
    cross_bytes = batch * input_len * per_token["cross"]
    return {"self": self_bytes, "cross": cross_bytes, "total": self_bytes + cross_bytes}


# ------------------------------------------------------------------------- the cache pytree
Entry = Array | kv_quant.QuantizedKV  # one layer's keys or values: float, or quantized with scales


@struct.dataclass
class KVCache:
    """Decoder KV cache, an explicit pytree passed into and returned from every decode step.

    ``self_k`` / ``self_v``: one ``[B, K_self, T_max, H]`` array per decoder layer, written at
    ``index`` (a scalar, the next position every row writes). ``cross_k`` / ``cross_v``: one
    ``[B, K_cross, S, H]`` array per layer, projected ONCE from the encoder output at prefill
    (T5X re-projects them at every step). ``cross_mask [B, S]``: False at encoder padding.
    A quantized cache holds a ``kv_quant.QuantizedKV`` (values + scales) in place of each array.
    """

    self_k: tuple[Entry, ...]
    self_v: tuple[Entry, ...]
    cross_k: tuple[Entry, ...]
    cross_v: tuple[Entry, ...]
    cross_mask: Array
    index: Array  # [] int32, shared by every row

    @property
    def max_decode_len(self) -> int:
        return self.self_k[0].shape[2]


def empty_self_cache(
    config: ModelConfig, batch: int, max_decode_len: int, dtype: Any
) -> tuple[tuple[Entry, ...], tuple[Entry, ...]]:
    """Zeroed self-attention keys and values: per layer ``[B, K_self, T_max, H]`` (quantized
    entries for an int8 / fp8 ``dtype``)."""
    shape = (batch, config.kv_heads("decoder_self"), max_decode_len, config.head_dim)
    name = _dtype_name(dtype)

    def zeros() -> Entry:
        entry = kv_quant.empty(shape, name) if kv_quant.is_quantized(name) else jnp.zeros(shape, dtype)
        return kv_quant.constrain(entry)

    L = config.num_decoder_layers
    return tuple(zeros() for _ in range(L)), tuple(zeros() for _ in range(L))


def store(x: Array, dtype: Any) -> Entry:
    """Keys or values ``[B, K, S, H]`` as the cache holds them in ``dtype`` (quantized for int8 /
    fp8, cast otherwise)."""
    name = _dtype_name(dtype)
    return kv_quant.constrain(kv_quant.quantize(x, name) if kv_quant.is_quantized(name) else x.astype(dtype))


def write(cache: Entry, new: Array, index: Array) -> Entry:
    """Write ``new [B, K, T, H]`` into ``cache [B, K, T_max, H]`` at positions ``index + 0..T-1``
    of every row (``index`` a scalar): one ``dynamic_update_slice`` for the batch. A quantized
    cache: the new rows quantized, their values and scales written at the same place."""

    def update(c: Array, x: Array) -> Array:
        return jax.lax.dynamic_update_slice(c, x.astype(c.dtype), (0, 0, index, 0))

    if isinstance(cache, kv_quant.QuantizedKV):
        q = kv_quant.quantize(new, cache.values.dtype.name)
        return kv_quant.constrain(
            kv_quant.QuantizedKV(values=update(cache.values, q.values), scale=update(cache.scale, q.scale))
        )
    return kv_quant.constrain(update(cache, new))


def cache_bytes(cache: KVCache) -> dict[str, int]:
    """Bytes of the cached keys and values (and a quantized cache's scales), measured from the
    arrays (masks and index excluded)."""
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


def decode_kv_heads(config: ModelConfig) -> int:
    """The K/V heads the decode cache's layout must serve: those of the decoder's self- and
    cross-attention (their common divisor where they differ)."""
    return math.gcd(config.kv_heads("decoder_self"), config.kv_heads("cross"))


def decode_mesh(
    config: ModelConfig, mesh: Any, rules: Mapping[str, sharding.MeshAxes] | None = None
) -> tuple[Any, dict[str, sharding.MeshAxes]]:
    """``sharding.decode_mesh`` for this model's decoder K/V heads: the mesh and rules its decode
    programs run on (rules None: ``sharding.RULES``)."""
    return sharding.decode_mesh(mesh, sharding.RULES if rules is None else rules, decode_kv_heads(config))


def cache_layout(
    config: Any,
    mesh: Any,
    batch: int,
    input_len: int,
    output_len: int,
    dtype: Any,
    rules: Mapping[str, sharding.MeshAxes] | None = None,
) -> tuple[dict[str, Any], list[sharding.Replication]]:
    """How a decode cache ``[B, K, length, H]`` per layer lies on ``mesh`` (through ``decode_mesh``:
    heads over ``model`` as far as K allows, rows over ``data`` and the rest of the model axis):
    per kind (``self``, ``cross``) its ``PartitionSpec``, the formula's total bytes, the shards,
    and the bytes each device holds (``total / shards``; a replicated axis is not divided). Also
    what is replicated (``replication_report`` states the waste)."""
    mesh, rules = decode_mesh(config, mesh, rules)
    size = itemsize(dtype)
    total = expected_cache_bytes(config, batch, input_len, output_len, dtype)
    out: dict[str, Any] = {}
    replicated: list[sharding.Replication] = []
    for kind, attn, length in (("self", "decoder_self", output_len), ("cross", "cross", input_len)):
        shape = (batch, config.kv_heads(attn), length, config.head_dim)
        found: list[sharding.Replication] = []
        axes = sharding.ACTIVATION_AXES["cache"]
        ps = sharding.spec(axes, shape, mesh, rules, name=f"cache.{kind}", itemsize=size, replicated=found)
        n = sharding.shards(ps, mesh)
        per_device = total[kind] // n
        for r in found:  # the bytes a device holds of this kind's cache, over all layers, K and V
            replicated.append(dataclasses.replace(r, bytes_per_device=per_device))
        out[kind] = {"spec": ps, "total_bytes": total[kind], "shards": n, "bytes_per_device": per_device}
    return out, replicated
