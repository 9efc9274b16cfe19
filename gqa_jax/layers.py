"""T5.1.1 building blocks: RMS norm, embedding, gated-GELU MLP, relative position bias.

Letters: ``B`` batch, ``T`` query length, ``S`` key length, ``D`` d_model, ``F`` MLP hidden,
``N`` query heads, ``V`` vocab.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from gqa_jax.config import CPU_KERNEL, EINSUM_KERNEL, ModelConfig
from gqa_jax.sharding import constrain

Array = jax.Array

# Fan-in initializers, as T5X/Flaxformer use them; `in_axis`/`out_axis` name the fan axes.
_normal = jax.nn.initializers.normal


def fan_in_init(fan_in: int, scale: float = 1.0):
    """Normal init with variance ``scale / fan_in`` (T5's variance_scaling(1, fan_in, normal))."""
    return _normal(stddev=math.sqrt(scale / fan_in))


def project(spec: str, x: Array, w: Array, kernel: str = EINSUM_KERNEL) -> Array:
    """``jnp.einsum(spec, x, w)`` for an activation ``x`` and a weight ``w``: one product that
    contracts the shared letters in ``w``'s own order (jnp.einsum sorts them). Under the ``"cpu"``
    decode kernel (the model a CPU decode step runs, ``T5(kernel=)``) it is taken out-major,
    ``W [out, in] @ X.T [in, rows]``, the ``[out, rows]`` result behind a barrier so XLA keeps that
    orientation: XLA:CPU runs it faster than ``X @ W`` for the few rows of a step, and reads a
    weight ``gqa_jax.cpu_step`` laid out ``[out, in]`` as it lies."""
    ins, out = spec.split("->")
    xs, ws = ins.split(",")
    inner = [c for c in ws if c in xs]
    rows, cols = [c for c in xs if c not in inner], [c for c in ws if c not in inner]
    if kernel == CPU_KERNEL:
        size = dict(zip(xs, x.shape, strict=True)) | dict(zip(ws, w.shape, strict=True))
        n_in = math.prod(size[c] for c in inner)
        x2 = jnp.transpose(x, [xs.index(c) for c in rows + inner]).reshape(-1, n_in)  # [rows, in]
        w2 = jnp.transpose(w, [ws.index(c) for c in cols + inner]).reshape(-1, n_in)  # [out, in]
        y = jax.lax.optimization_barrier(w2 @ x2.T).T.reshape([size[c] for c in rows + cols])
    else:
        y = jax.lax.dot_general(
            x, w, (([xs.index(c) for c in inner], [ws.index(c) for c in inner]), ((), ()))
        )
    names = rows + cols
    return jnp.transpose(y, [names.index(c) for c in out])


def dtype_of(name: str) -> jnp.dtype:
    return jnp.dtype(name)


class KeyStream:
    """The keys ``nnx.Rngs(key)`` draws from its one stream, for whichever stream is asked
    (``params()``, ``dropout()``): ``fold_in(key, 0)``, ``fold_in(key, 1)``, ..., counted in Python.
    ``nnx.Rngs`` counts in a Variable, and under a trace (``jit``, ``eval_shape``) each update has
    flax ask the new count's tracer for its ``sharding``, which JAX answers with an error message
    that scans the whole trace so far: quadratic in the model's depth (XXL's structure traced in
    4.3 s, not 0.26 s; a 24-layer train step in 11.6 s, not 4.8 s)."""

    def __init__(self, key: Array | int):
        self.key = jax.random.key(key) if isinstance(key, int) else key
        self.count = 0

    def __call__(self) -> Array:
        self.count += 1
        return jax.random.fold_in(self.key, self.count - 1)

    params = dropout = __call__


Rngs = nnx.Rngs | KeyStream  # what a constructor draws its parameters' keys, a forward pass dropout's, from


def dropout(x: Array, rate: float, rngs: Rngs | None) -> Array:
    """Inverted dropout; a no-op when ``rngs`` is None (evaluation) or the rate is 0."""
    if rngs is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rngs.dropout(), 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


class RMSNorm(nnx.Module):
    """T5 layer norm: scale only, no mean subtraction, no bias; statistics in float32."""

    def __init__(self, dim: int, config: ModelConfig):
        self.scale = nnx.Param(jnp.ones((dim,), dtype_of(config.param_dtype)))
        self.eps = config.layer_norm_epsilon
        self.dtype = dtype_of(config.dtype)

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        y = x32 * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(self.dtype)


class Embed(nnx.Module):
    """Token embedding ``[V, D]``; also the output layer when embeddings are tied."""

    def __init__(self, config: ModelConfig, *, rngs: Rngs):
        init = _normal(stddev=1.0)
        shape = (config.vocab_size, config.d_model)
        self.embedding = nnx.Param(init(rngs.params(), shape, dtype_of(config.param_dtype)))
        self.dtype = dtype_of(config.dtype)

    def __call__(self, ids: Array) -> Array:
        """``ids [B, T]`` -> ``[B, T, D]``."""
        return jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)


class MLP(nnx.Module):
    """T5.1.1 gated-GELU MLP ``wo(gelu(x wi_0) * (x wi_1))`` (no biases); or ReLU for T5 v1.0."""

    def __init__(self, config: ModelConfig, *, rngs: Rngs, kernel: str = EINSUM_KERNEL):
        D, F = config.d_model, config.d_ff
        pdt = dtype_of(config.param_dtype)
        self.gated = config.mlp_activation == "gated-gelu"
        self.wi_0 = nnx.Param(fan_in_init(D)(rngs.params(), (D, F), pdt))
        if self.gated:
            self.wi_1 = nnx.Param(fan_in_init(D)(rngs.params(), (D, F), pdt))
        self.wo = nnx.Param(fan_in_init(F)(rngs.params(), (F, D), pdt))
        self.rate = config.dropout_rate
        self.dtype = dtype_of(config.dtype)
        self.kernel = kernel  # the decode kernel it is built for (``project``)

    def __call__(self, x: Array, rngs: Rngs | None = None) -> Array:
        """``x [B, T, D]`` -> ``[B, T, D]``."""
        if self.gated:
            h = project("BTD,DF->BTF", x, self.wi_0[...].astype(self.dtype), self.kernel)
            gate = project("BTD,DF->BTF", x, self.wi_1[...].astype(self.dtype), self.kernel)
            # T5.1.1 (and HF's "gelu_new") use the tanh approximation of GELU.
            h = jax.nn.gelu(h, approximate=True) * gate
        else:
            h = project("BTD,DF->BTF", x, self.wi_0[...].astype(self.dtype), self.kernel)
            h = jax.nn.relu(h)
        h = dropout(constrain(h, "mlp"), self.rate, rngs)
        out = project("BTF,FD->BTD", h, self.wo[...].astype(self.dtype), self.kernel)
        return constrain(out, "hidden")


def relative_position_bucket(
    relative_position: Array, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> Array:
    """Map ``key_position - query_position`` to T5's bucket ids.

    Half the buckets (all of them when causal) hold exact small distances; the rest cover
    distances up to ``max_distance`` on a log scale; anything farther shares the last bucket.
    Bidirectional: keys after the query use the upper half of the buckets. Causal: keys after
    the query (which the mask hides anyway) fall in bucket 0.
    """
    rel = jnp.asarray(relative_position, jnp.int32)
    offset = jnp.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        offset = jnp.where(rel > 0, num_buckets, 0)
        distance = jnp.abs(rel)
    else:
        distance = jnp.maximum(-rel, 0)
    exact = num_buckets // 2
    # Log-spaced bucket for distances >= exact (float32 as in T5/HF; clipped to the last bucket).
    scaled = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / exact) / math.log(max_distance / exact)
    log_bucket = exact + (scaled * (num_buckets - exact)).astype(jnp.int32)
    log_bucket = jnp.minimum(log_bucket, num_buckets - 1)
    return offset + jnp.where(distance < exact, distance, log_bucket)


class RelativePositionBias(nnx.Module):
    """One table ``[buckets, N]`` per stack, shared by its layers; the bias is per query head."""

    def __init__(self, config: ModelConfig, *, bidirectional: bool, rngs: Rngs):
        shape = (config.relative_attention_num_buckets, config.num_heads)
        init = jax.nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")
        self.embedding = nnx.Param(init(rngs.params(), shape, dtype_of(config.param_dtype)))
        self.bidirectional = bidirectional
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance

    def __call__(self, query_positions: Array, key_positions: Array) -> Array:
        """Positions ``[..., T]`` and ``[S]`` -> bias ``[..., N, T, S]`` (float32).

        Teacher forcing passes ``[T]``, a cached decode step the positions ``index + 0..T-1`` its
        rows share (``[T]`` too): one bias for the batch."""
        rel = key_positions - query_positions[..., :, None]  # [..., T, S]
        buckets = relative_position_bucket(
            rel,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        bias = jnp.take(self.embedding[...].astype(jnp.float32), buckets, axis=0)  # [..., T, S, N]
        return jnp.moveaxis(bias, -1, -3)
