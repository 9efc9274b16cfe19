"""An 8-bit KV cache: keys and values stored as int8 (or fp8) with one float32 scale per token
and K/V head.

Letters: ``B`` batch, ``K`` K/V heads, ``T`` cached positions, ``H`` head dim, ``N`` query heads,
``M`` query rows of a group, ``S`` key positions.

``quantize(x [B, K, T, H], "int8")`` -> ``QuantizedKV(values [B, K, T, H] int8, scale [B, K, T, 1]
float32)`` with ``x ~= values * scale``: ``scale = max_h |x| / QMAX`` (127 for int8, the largest
finite value for fp8), int8 rounds to the nearest integer, fp8 casts. A token's K (or V) head
thus costs ``H`` bytes plus a 4-byte scale instead of ``H x itemsize``: 68 bytes at ``H = 64``
against 128 in bfloat16 and 256 in float32.

The attention never builds a float copy of the cache: a key's scale is a factor of its whole
score, ``q . (s_k values_k) = s_k (q . values_k)``, so it multiplies the logits ``[B, K, M, S]``
column by column; a value's scale multiplies its probability before the product with the values,
``sum_s p_s (s_v values_v) = sum_s (p_s s_v) values_v``. Only the int8 -> float convert of the
values remains inside the products.

``cache_dtype`` (the decoding API's and the tools' option): None keeps the model's dtype; a float
dtype (float32, bfloat16, float16) stores the cache in it; ``int8``, ``float8_e4m3fn`` and
``float8_e5m2`` quantize as above. ``check_cache_dtype`` rejects anything else, and a quantized
dtype the backend cannot compile, before any decoding starts.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from gqa_jax import sharding

Array = jax.Array

SCALE_DTYPE = jnp.float32
SCALE_BYTES = 4  # per cached token and K/V head, for K and for V
QMAX = {"int8": 127.0, "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
FLOAT_CACHE_DTYPES = ("float32", "bfloat16", "float16")
CACHE_DTYPES = (*FLOAT_CACHE_DTYPES, *QMAX)


@struct.dataclass
class QuantizedKV:
    """One layer's quantized keys (or values): ``values [B, K, T, H]`` (int8 / fp8) and
    ``scale [B, K, T, 1]`` (float32); ``values * scale`` is the cached tensor."""

    values: Array
    scale: Array

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.scale.nbytes


def is_quantized(cache_dtype: str | None) -> bool:
    return cache_dtype in QMAX


def check_cache_dtype(cache_dtype: Any) -> str | None:
    """``cache_dtype`` as a name (None: the model's dtype), or a ValueError naming the choices; a
    quantized dtype is compiled once on the default backend, and one the backend cannot compile
    is refused here rather than inside the decode loop."""
    if cache_dtype is None:
        return None
    name = getattr(cache_dtype, "__name__", None) or str(cache_dtype)
    try:
        name = jnp.dtype(cache_dtype).name
    except TypeError:
        pass
    if name not in CACHE_DTYPES:
        raise ValueError(
            f"cache_dtype={cache_dtype!r} is not a KV-cache dtype: use one of {', '.join(CACHE_DTYPES)} "
            "(None keeps the model's dtype; int8 and fp8 store a float32 scale per token and head)"
        )
    if is_quantized(name):
        probe_backend(name, jax.default_backend())
    return name


@functools.cache
def probe_backend(name: str, backend: str) -> None:
    """A ValueError unless ``backend`` compiles a round trip through the quantized ``name``
    (once per pair: cached)."""
    x = jnp.linspace(-1.0, 1.0, 16, dtype=jnp.float32).reshape(1, 1, 2, 8)
    try:
        back = jax.jit(lambda a: dequantize(quantize(a, name)))(x)
        ok = bool(jnp.all(jnp.abs(back - x) <= 0.07))
    except Exception as e:  # XLA reports an unsupported type as one of several error classes
        raise ValueError(
            f"the {backend} backend cannot hold a {name} KV cache ({type(e).__name__}: {str(e)[:200]}); "
            "use cache_dtype='int8' or leave it None"
        ) from e
    if not ok:
        raise ValueError(
            f"the {backend} backend computes {name} wrongly (a round trip through it is off by more "
            "than its rounding); use cache_dtype='int8' or leave it None"
        )


def quantize(x: Array, cache_dtype: str) -> QuantizedKV:
    """``x [..., H]`` -> values in ``cache_dtype`` and a float32 scale per row ``[..., 1]``."""
    qmax = QMAX[cache_dtype]
    x32 = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x32), axis=-1, keepdims=True)
    scale = jnp.where(amax > 0, amax / qmax, 1.0).astype(SCALE_DTYPE)
    scaled = x32 / scale
    if cache_dtype == "int8":
        scaled = jnp.round(scaled)
    values = jnp.clip(scaled, -qmax, qmax).astype(cache_dtype)
    return QuantizedKV(values=values, scale=scale)


def dequantize(q: QuantizedKV, dtype: Any = jnp.float32) -> Array:
    """The float tensor a ``QuantizedKV`` stands for (for tests and inspection; the attention
    applies the scales to the logits and probabilities instead)."""
    return (q.values.astype(jnp.float32) * q.scale).astype(dtype)


def empty(shape: tuple[int, ...], cache_dtype: str) -> QuantizedKV:
    """A zeroed quantized cache ``[B, K, T, H]`` (unit scales)."""
    return QuantizedKV(values=jnp.zeros(shape, cache_dtype), scale=jnp.ones((*shape[:-1], 1), SCALE_DTYPE))


def constrain(x: Array | QuantizedKV) -> Array | QuantizedKV:
    """The ``cache`` activation sharding on a cache entry, float or quantized (values and scale)."""
    return jax.tree.map(lambda a: sharding.constrain(a, "cache"), x)


def split(x: Array | QuantizedKV, dtype: Any) -> tuple[Array, Array | None]:
    """For the attention: ``(values as dtype [B, K, S, H], per-key scale [B, K, 1, S] or None)``."""
    if isinstance(x, QuantizedKV):
        return x.values.astype(dtype), jnp.swapaxes(x.scale, -1, -2)
    return x, None
