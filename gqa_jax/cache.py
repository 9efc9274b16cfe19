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

The paper's decode (``config.PAPER_SWITCHES``, instruments for its timings, never the default) holds
the cache as T5X did: no cross-attention K/V but the encoder output (``encoded``, projected again at
every step), and the self-attention cache in T5X's layout ``[B, K, H, T]`` and written by its one-hot
update (a :class:`CacheForm`, static in the pytree).
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
from gqa_jax.config import DecodeConfig, ModelConfig

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
    config: ModelConfig, batch: int, input_len: int, output_len: int, dtype: Any, *, cross: bool = True
) -> dict[str, int]:
    """Bytes of a full decode cache: ``{"self": ..., "cross": ..., "total": ...}``.

    ``self = 2 x L x B x T x K_self x H x itemsize`` (``T = output_len``) and
    ``cross = 2 x L x B x S x K_cross x H x itemsize`` (``S = input_len``; 0 without a cross
    cache, ``cross=False``: the paper's decode); ``H x itemsize`` becomes ``H + 4`` for a quantized
    ``dtype`` (int8, fp8: the scales are counted).
    """
    for name, value in (("batch", batch), ("input_len", input_len), ("output_len", output_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"expected_cache_bytes: {name}={value!r} must be a positive integer")
    per_token = cache_bytes_per_token(config, dtype)
    self_bytes = batch * output_len * per_token["self"]
    cross_bytes = batch * input_len * per_token["cross"] if cross else 0
    return {"self": self_bytes, "cross": cross_bytes, "total": self_bytes + cross_bytes}


# ------------------------------------------------------------------------- the cache pytree
Entry = Array | kv_quant.QuantizedKV  # one layer's keys or values: float, or quantized with scales
ONE_HOT_SCOPE = "paper_one_hot_write"  # the name scope of the paper's decode's one-hot cache write


@dataclasses.dataclass(frozen=True)
class CacheForm:
    """How the self-attention cache is held and written: ours (``[B, K, T, H]``, one
    ``dynamic_update_slice``), or the paper's decode's instruments: ``length_last``, T5X's layout
    ``[B, K, H, T]`` moved back for the attention at every step; ``one_hot``, T5X's write
    ``cached + new * one_hot(index)``."""

    length_last: bool = False
    one_hot: bool = False

    @classmethod
    def of(cls, config: DecodeConfig) -> CacheForm:
        return cls(length_last=config.t5x_layout, one_hot=config.one_hot_write)


OUR_FORM = CacheForm()  # our decode's


@struct.dataclass
class KVCache:
    """Decoder KV cache, an explicit pytree passed into and returned from every decode step.

    ``self_k`` / ``self_v``: one ``[B, K_self, T_max, H]`` array per decoder layer (``[B, K_self,
    H, T_max]`` in T5X's layout: ``form``), written at ``index`` (a scalar, the next position every
    row writes). ``cross_k`` / ``cross_v``: one ``[B, K_cross, S, H]`` array per layer, projected
    ONCE from the encoder output at prefill; empty in the paper's decode, which carries the encoder
    output ``encoded [B, S, D]`` instead and projects it at every step. ``cross_mask [B, S]``: False
    at encoder padding. A quantized cache holds a ``kv_quant.QuantizedKV`` (values + scales) in
    place of each array.
    """

    self_k: tuple[Entry, ...]
    self_v: tuple[Entry, ...]
    cross_k: tuple[Entry, ...]
    cross_v: tuple[Entry, ...]
    cross_mask: Array
    index: Array  # [] int32, shared by every row
    encoded: Array | None = None  # [B, S, D]: the paper's decode (cross_recompute) only
    form: CacheForm = struct.field(pytree_node=False, default=OUR_FORM)

    @property
    def max_decode_len(self) -> int:
        return length_of(self.self_k[0], self.form)


def length_of(entry: Entry, form: CacheForm) -> int:
    """The positions ``T_max`` a self-attention cache entry holds."""
    return entry.shape[-1 if form.length_last else -2]


def empty_self_cache(
    config: ModelConfig, batch: int, max_decode_len: int, dtype: Any, form: CacheForm = OUR_FORM
) -> tuple[tuple[Entry, ...], tuple[Entry, ...]]:
    """Zeroed self-attention keys and values: per layer ``[B, K_self, T_max, H]`` (``form``'s
    layout; quantized entries for an int8 / fp8 ``dtype``, whose scales start at 0 under the one-hot
    write, so that adding a scale writes it)."""
    shape = (batch, config.kv_heads("decoder_self"), max_decode_len, config.head_dim)
    name = _dtype_name(dtype)

    def zeros() -> Entry:
        if not kv_quant.is_quantized(name):
            entry = jnp.zeros(shape, dtype)
        elif form.one_hot:
            scale = jnp.zeros((*shape[:-1], 1), kv_quant.SCALE_DTYPE)
            entry = kv_quant.QuantizedKV(jnp.zeros(shape, name), scale)
        else:
            entry = kv_quant.empty(shape, name)
        return kv_quant.constrain(_held(entry, form))

    L = config.num_decoder_layers
    return tuple(zeros() for _ in range(L)), tuple(zeros() for _ in range(L))


def _held(x: Entry, form: CacheForm) -> Entry:
    """Keys or values ``[B, K, T, H]`` in ``form``'s layout (T5X's: ``[B, K, H, T]``)."""
    return jax.tree.map(lambda a: jnp.moveaxis(a, -2, -1), x) if form.length_last else x


def attended(entry: Entry, form: CacheForm) -> Entry:
    """A self-attention cache entry as the attention takes it, ``[B, K, T, H]``: T5X's layout moved
    back (``moveaxis``, at every step), ours as it is."""
    return jax.tree.map(lambda a: jnp.moveaxis(a, -1, -2), entry) if form.length_last else entry


def dtype_name(entry: Entry) -> str:
    """The dtype a cache entry holds its keys or values in (a quantized one's values')."""
    return (entry.values if isinstance(entry, kv_quant.QuantizedKV) else entry).dtype.name


def store(x: Array, dtype: Any) -> Entry:
    """Keys or values ``[B, K, S, H]`` as the cache holds them in ``dtype`` (quantized for int8 /
    fp8, cast otherwise)."""
    name = _dtype_name(dtype)
    return kv_quant.constrain(kv_quant.quantize(x, name) if kv_quant.is_quantized(name) else x.astype(dtype))


def write(cache: Entry, new: Array, index: Array, form: CacheForm = OUR_FORM) -> Entry:
    """Write ``new [B, K, T, H]`` into ``cache [B, K, T_max, H]`` at positions ``index + 0..T-1``
    of every row (``index`` a scalar): one ``dynamic_update_slice`` for the batch. A quantized
    cache: the new rows quantized, their values and scales written at the same place. ``form``: the
    paper's decode's layout and one-hot write (:class:`CacheForm`; one token per step)."""

    def update(c: Array, x: Array) -> Array:
        if form.one_hot:
            return _one_hot_add(c, x, index, form)
        at = (0, 0, 0, index) if form.length_last else (0, 0, index, 0)
        return jax.lax.dynamic_update_slice(c, x.astype(c.dtype), at)

    if isinstance(cache, kv_quant.QuantizedKV):
        q = _held(kv_quant.quantize(new, cache.values.dtype.name), form)
        return kv_quant.constrain(
            kv_quant.QuantizedKV(values=update(cache.values, q.values), scale=update(cache.scale, q.scale))
        )
    return kv_quant.constrain(update(cache, _held(new, form)))


def _one_hot_add(cache: Array, new: Array, index: Array, form: CacheForm) -> Array:
    """T5X's write: ``cache + new * one_hot(index)``, the one token broadcast over every position
    and kept at ``index`` alone; the whole cache is read and written. ``new``: one position, in the
    cache's layout (``[B, K, 1, H]``, or ``[B, K, H, 1]`` length last)."""
    length = length_of(cache, form)
    if length_of(new, form) != 1:
        raise ValueError(f"the one-hot cache write takes one token per step (T5X's); got {new.shape}")
    with jax.named_scope(ONE_HOT_SCOPE):  # its ops' names say what the compiler made of it
        one_hot = jax.nn.one_hot(index, length, dtype=cache.dtype)  # [T_max]
        return cache + new.astype(cache.dtype) * (one_hot if form.length_last else one_hot[:, None])


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
    cross = len(cache.cross_k) if cache.encoded is None else L  # the paper's decode: no cross K/V
    if len(cache.self_k) != L or cross != L:
        problems.append(f"{len(cache.self_k)} cached layers, config has num_decoder_layers={L}")
    else:
        kinds = [("decoder_self", cache.self_k[0], 2 if cache.form.length_last else 3)]
        kinds += [("cross", cache.cross_k[0], 3)] if cache.encoded is None else []
        for kind, entry, h_axis in kinds:
            K, shape = config.kv_heads(kind), tuple(entry.shape)
            if shape[1] != K or shape[h_axis] != H:
                problems.append(f"{kind} cache {shape} needs [B, K={K}, length, H={H}] (num_kv_heads={K})")
    if cache.encoded is not None and cache.encoded.shape[-1] != config.d_model:
        problems.append(f"encoder output {cache.encoded.shape} needs [B, S, D={config.d_model}]")
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
    *,
    cross: bool = True,
) -> tuple[dict[str, Any], list[sharding.Replication]]:
    """How a decode cache ``[B, K, length, H]`` per layer lies on ``mesh`` (through ``decode_mesh``:
    heads over ``model`` as far as K allows, rows over ``data`` and the rest of the model axis):
    per kind (``self``, ``cross``) its ``PartitionSpec``, the formula's total bytes, the shards,
    and the bytes each device holds (``total / shards``; a replicated axis is not divided). Also
    what is replicated (``replication_report`` states the waste). ``cross=False``: no cross-attention
    cache (the paper's decode), its bytes 0."""
    mesh, rules = decode_mesh(config, mesh, rules)
    size = itemsize(dtype)
    total = expected_cache_bytes(config, batch, input_len, output_len, dtype, cross=cross)
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
