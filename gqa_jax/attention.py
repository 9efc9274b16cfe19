"""Grouped-query attention: one code path for MHA (K = N), GQA-K and MQA (K = 1).

Letters: ``B`` batch, ``T`` query length, ``S`` key/value length, ``D`` d_model, ``N`` query
heads, ``K`` K/V heads, ``G = N // K`` query heads per group, ``H`` head dim, ``M = G * T``
rows of a group's queries.

Query head ``n`` belongs to group ``n // G`` and reads K/V head ``n // G`` (contiguous groups,
as in the paper). K/V are never repeated to N heads: queries are regrouped to
``[B, K, M, H]`` with ``M = G * T`` rows per K/V head and contract against ``[B, K, S, H]``
directly, so a decode step reads K/N of the MHA key/value bytes. K/V are laid out
``[B, K, S, H]`` (the KV-cache layout), measured faster than ``[B, S, K, H]`` for decode on CPU
(docs/results/decoding.md).
A quantized cache (``kv_quant.QuantizedKV``) enters the same products: the keys' scales multiply
the logits and the values' scales the probabilities (``gqa_jax.kv_quant``).

T5 rule: logits are NOT scaled by 1/sqrt(H); T5 folds that factor into the query initializer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gqa_jax import cpu_kernels, kv_quant
from gqa_jax.config import CPU_KERNEL, EINSUM_KERNEL, ModelConfig
from gqa_jax.layers import Rngs, dropout, dtype_of, fan_in_init, project
from gqa_jax.sharding import constrain

Array = jax.Array

# Under the CPU decode kernel, a group of fewer query heads than this (2 to 4) is attended one head
# at a time: XLA:CPU takes a product with 2-4 rows per K/V head at a fraction of the rate of one
# with a single row (a matrix-vector product); from 8 rows the one product is faster again
# (docs/results/decoding.md).
ONE_HEAD_AT_A_TIME_BELOW = 5

# Large negative logit for masked keys: exp() of it is exactly 0 in float32, and a fully
# masked row stays finite (uniform) instead of NaN.
MASK_VALUE = -1e10


def grouped_attention(
    q: Array,
    k: Array | kv_quant.QuantizedKV,
    v: Array | kv_quant.QuantizedKV,
    *,
    bias: Array | None = None,
    mask: Array | None = None,
    dropout_rate: float = 0.0,
    rngs: Rngs | None = None,
    one_head_at_a_time: bool = False,
) -> Array:
    """Attention of N query heads over K shared K/V heads.

    Args:
      q: ``[B, T, N, H]`` queries.
      k, v: ``[B, K, S, H]`` keys and values, ``N % K == 0``; or quantized (``kv_quant``).
      bias: ``[N, T, S]`` (or ``[B, N, T, S]``) additive logit bias, per QUERY head.
      mask: boolean, broadcastable to ``[B, T, S]``; False hides the key.
      one_head_at_a_time: the loop order: a group's query heads one at a time (G attentions of
        T rows per K/V head, each the same code) instead of all at once (one of G * T rows). The
        same numbers; the CPU decode kernel's for small groups (``Attention``): XLA:CPU takes a
        product with one row per K/V head as a matrix-vector product, several times faster than
        one with 2 or 3 rows.
    Returns:
      ``[B, T, N, H]``.
    """
    B, T, N, H = q.shape
    K, S = k.shape[1], k.shape[2]
    if N % K:
        raise ValueError(f"grouped_attention: query heads N={N} not divisible by K/V heads K={K}")
    G = N // K
    k, k_scale = kv_quant.split(k, q.dtype)  # scales [B, K, 1, S] of a quantized cache, else None
    v, v_scale = kv_quant.split(v, q.dtype)
    # Query head n = (n // G, n % G). A group's G heads and T positions become M = G * T rows
    # (row m = g * T + t) of one [M, H] x [H, S] product per (batch, K/V head): plain 4-D einsums,
    # measured faster on CPU than contracting [B, T, K, G, H] (docs/results/decoding.md).
    qm = q.reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, H)  # [B, K, M, H]
    if bias is not None:  # [..., N, T, S] -> [..., K, M, S]
        bias = bias.reshape(*bias.shape[:-3], K, G * T, S).astype(jnp.float32)
    if mask is not None:  # the same key mask for every head of a group: [B, 1, M, S]
        mask = jnp.broadcast_to(jnp.broadcast_to(mask, (B, T, S))[:, None, None], (B, 1, G, T, S))
        mask = mask.reshape(B, 1, G * T, S)

    def attend(rows: slice) -> Array:  # rows ``rows`` of every group's M: [B, K, m, H]
        logits = jnp.einsum("BKMH,BKSH->BKMS", qm[:, :, rows], k, preferred_element_type=jnp.float32)
        if k_scale is not None:  # q . (s k) = s (q . k): a key's scale multiplies its logits
            logits = logits * k_scale
        if bias is not None:
            logits = logits + bias[..., rows, :]
        if mask is not None:
            logits = jnp.where(mask[:, :, rows], logits, MASK_VALUE)
        probs = jax.nn.softmax(logits, axis=-1)  # [B, K, m, S]
        if v_scale is not None:  # sum p (s v) = sum (p s) v: a value's scale multiplies its probability
            probs = probs * v_scale
        probs = dropout(probs.astype(v.dtype), dropout_rate, rngs)
        return jnp.einsum("BKMS,BKSH->BKMH", probs, v)

    if one_head_at_a_time:  # one product per query head of a group: its T rows
        out = jnp.concatenate([attend(slice(g * T, (g + 1) * T)) for g in range(G)], axis=2)
    else:
        out = attend(slice(None))  # [B, K, M, H]
    return out.reshape(B, K, G, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)


class Attention(nnx.Module):
    """Projections ``query [D, N, H]``, ``key``/``value [D, K, H]``, ``out [N, H, D]``. ``cached``:
    the attention reads a decode cache (the decoder's self- and cross-attention), so on a mesh its
    queries are regrouped to the cache's layout (``cache_queries``) for the products with it.
    ``kernel``: the decode kernel of the program the model is built for (``config.KERNELS``):
    under ``"cpu"`` the projections are taken out-major (``layers.project``), a cached attention of
    one position is the CPU attention kernel's where ``cpu_kernels.takes`` it, and otherwise a
    group of fewer than ``ONE_HEAD_AT_A_TIME_BELOW`` query heads is attended one head at a time."""

    def __init__(
        self,
        config: ModelConfig,
        num_kv_heads: int,
        *,
        rngs: Rngs,
        cached: bool = False,
        kernel: str = EINSUM_KERNEL,
    ):
        D, N, H, K = config.d_model, config.num_heads, config.head_dim, num_kv_heads
        if N % K:
            raise ValueError(f"Attention: num_heads={N} not divisible by num_kv_heads={K}")
        pdt = dtype_of(config.param_dtype)
        # T5: the 1/sqrt(H) logit scale lives in the query initializer, not in the forward pass.
        self.query = nnx.Param(fan_in_init(D, 1.0 / H)(rngs.params(), (D, N, H), pdt))
        self.key = nnx.Param(fan_in_init(D)(rngs.params(), (D, K, H), pdt))
        self.value = nnx.Param(fan_in_init(D)(rngs.params(), (D, K, H), pdt))
        self.out = nnx.Param(fan_in_init(N * H)(rngs.params(), (N, H, D), pdt))
        self.num_heads, self.num_kv_heads, self.head_dim = N, K, H
        self.cached = cached
        self.rate = config.dropout_rate
        self.dtype = dtype_of(config.dtype)
        self.kernel = kernel  # the decode kernel it is built for (``layers.project``)
        self.one_head_at_a_time = kernel == CPU_KERNEL and N // K < ONE_HEAD_AT_A_TIME_BELOW

    def project_q(self, x: Array) -> Array:
        """``[B, T, D]`` -> ``[B, T, N, H]``."""
        q = project("BTD,DNH->BTNH", x, self.query[...].astype(self.dtype), self.kernel)
        return constrain(q, "queries")

    def project_kv(self, x: Array) -> tuple[Array, Array]:
        """``[B, S, D]`` -> keys, values ``[B, K, S, H]`` each (the cache layout)."""
        k = project("BSD,DKH->BKSH", x, self.key[...].astype(self.dtype), self.kernel)
        v = project("BSD,DKH->BKSH", x, self.value[...].astype(self.dtype), self.kernel)
        return constrain(k, self._kv_kind()), constrain(v, self._kv_kind())

    def _kv_kind(self) -> str:
        """A cached attention's keys and values are projected as the cache lies (``"cache"``): on a
        split decode mesh each device projects its own rows, instead of every row's K/V on every
        device where K is smaller than the model axis (a copy per device of the prefill's cross
        K/V). Elsewhere the two kinds name the same devices."""
        return "cache" if self.cached else "kv"

    def project_qkv(self, x: Array) -> tuple[Array, Array, Array]:
        """Self-attention ``[B, T, D]`` -> queries ``[B, T, N, H]``, keys and values ``[B, K, T, H]``."""
        return (self.project_q(x), *self.project_kv(x))

    def attend(
        self,
        q: Array,
        k: Array,
        v: Array,
        *,
        bias: Array | None = None,
        mask: Array | None = None,
        rngs: Rngs | None = None,
    ) -> Array:
        """Queries ``[B, T, N, H]`` over keys/values ``[B, K, S, H]`` -> ``[B, T, D]``."""
        if self.cached:  # rows and heads as the cache holds them (a no-op off a split decode mesh)
            q = constrain(q, "cache_queries")
        if self.kernel == CPU_KERNEL and self.cached and cpu_kernels.takes(q, k):  # a CPU decode step
            o = cpu_kernels.attend(q, k, v, bias=bias, mask=mask)
        else:
            o = grouped_attention(
                q, k, v, bias=bias, mask=mask, dropout_rate=self.rate, rngs=rngs,
                one_head_at_a_time=self.one_head_at_a_time,
            )  # fmt: skip
        if self.cached:
            o = constrain(o, "cache_queries")  # [B, T, N, H]
        out = project("BTNH,NHD->BTD", o, self.out[...].astype(self.dtype), self.kernel)
        return constrain(out, "hidden")

    def __call__(
        self,
        x_q: Array,
        x_kv: Array,
        *,
        bias: Array | None = None,
        mask: Array | None = None,
        rngs: Rngs | None = None,
    ) -> Array:
        """Full (uncached) attention: ``x_q [B, T, D]`` attends over ``x_kv [B, S, D]``."""
        k, v = self.project_kv(x_kv)
        return self.attend(self.project_q(x_q), k, v, bias=bias, mask=mask, rngs=rngs)
