"""The CPU decode fast path, in one place: what a decode step on one CPU device does differently.

Letters: ``B`` batch, ``T`` query length, ``S`` key/value length, ``N`` query heads, ``K`` K/V
heads, ``G = N // K``, ``H`` head dim.

The fast path is one static choice, the decode kernel ``"cpu"`` (``config.KERNELS``; the other is
``"einsum"``, the plain products of any backend), made once on the host by :func:`kernel_for`
(the CPU backend and a single device) when ``decoding.decode_config`` builds a loop's
``DecodeConfig``. The decode programs set it on the model they merge inside ``jit``
(``decoding.merged``: ``model.set_attributes(kernel=...)``, the NNX idiom for a static mode), and
each module reads its own ``kernel`` where it acts, as MaxText's attention reads
``attention_kernel``: ``layers.project_many`` takes a decode step's few-row weight products
out-major (:func:`out_major_products`), ``attention.grouped_attention`` takes one query position a
query head at a time (:func:`attention_by_head`, chosen by :func:`by_head`), and the prefill
encodes in row chunks (:func:`encode_chunk_rows`). A model built anywhere else (training, the
teacher-forced decoder, ``decode_step`` called on a fresh model) has ``kernel="einsum"``. The
results equal the plain path's to float rounding (same sums, another order; the tokens are
identical in the tests).

What each part does (each measured faster on the CPU than the plain program; docs/results/decoding.md):

- Out-major weight products. A decode step reads every weight once for a few rows. The weight,
  stored ``[in, out]``, is transposed to ``[out, in]`` and contracted as ``W @ X.T``. The
  transpose (and the stacking of q/k/v and of the MLP's two input matrices into one matrix) sits
  behind an ``optimization_barrier`` so XLA does not fold it back into the dot; it is
  loop-invariant, so XLA hoists it out of the ``while_loop`` and it happens once per decode.
- Grouped attention of one position, head by head. Instead of one batched product with G query
  rows per K/V head, the group's heads are taken one at a time: G one-row products per K/V head,
  reading each K/V block G times (the later reads hit the CPU caches). MHA (G = 1) keeps its
  path; groups over ``STEP_MAX_GROUP`` heads keep one product (the graph would grow).
- Chunked prefill. Encoding a few rows at a time keeps a chunk's activations and ``[N, S, S]``
  logits in the CPU caches through a layer.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from gqa_jax.config import CPU_KERNEL, EINSUM_KERNEL

Array = jax.Array

STEP_ROWS = (2, 64)  # rows for which the out-major product measured faster on CPU
STEP_MIN_WEIGHT = 1 << 16  # elements: smaller weights sit in the CPU caches, layout barely matters
STEP_MAX_GROUP = 8  # query heads per group taken one by one (MQA at xxl, G = 64, keeps one product)
ENCODE_CHUNK_TOKENS = 1024  # tokens per chunk of the chunked prefill


def kernel_for(mesh: Any) -> str:
    """The decode kernel for a loop on ``mesh`` (None: no mesh): ``"cpu"`` (this fast path) on the
    CPU backend and a single device, else ``"einsum"``. Asked on the host, once per loop, by
    ``decoding.decode_config``."""
    if mesh is None:
        one_cpu = jax.default_backend() == "cpu"
    else:
        one_cpu = mesh.devices.size == 1 and mesh.devices.flat[0].platform == "cpu"  # a TPU slice's mesh too
    return CPU_KERNEL if one_cpu else EINSUM_KERNEL


def encode_chunk_rows(batch: int, input_len: int) -> int:
    """Rows per chunk of the chunked encoder: the largest divisor of ``batch`` whose chunk holds at
    most ``ENCODE_CHUNK_TOKENS`` tokens (at least 1 row; ``batch`` itself means no chunking)."""
    fits = [r for r in range(1, batch + 1) if batch % r == 0 and r * input_len <= ENCODE_CHUNK_TOKENS]
    return max(fits, default=1)


def _parse(spec: str, x: Array, w: Array) -> tuple[str, str, str, list[str], list[str], list[str], dict]:
    """``"BTD,DF->BTF"`` -> the letters of x, w and the output; rows (x only), cols (w only),
    inner (both) letters; every letter's size."""
    x_letters, rest = spec.split(",")
    w_letters, out_letters = rest.split("->")
    rows = [c for c in x_letters if c not in w_letters]
    cols = [c for c in w_letters if c not in x_letters]
    inner = [c for c in x_letters if c in w_letters]
    size = dict(zip(x_letters, x.shape, strict=True)) | dict(zip(w_letters, w.shape, strict=True))
    return x_letters, w_letters, out_letters, rows, cols, inner, size


def out_major_products(specs: list[str], x: Array, ws: list[Array]) -> list[Array] | None:
    """``[jnp.einsum(spec, x, w) ...]`` as one out-major product ``W [out, in] @ X.T [in, rows]``
    over the weights stacked, or None when it does not apply (rows outside ``STEP_ROWS``, weights
    under ``STEP_MIN_WEIGHT`` elements in all, or specs that do not share x's rows and inner
    letters): the caller then takes the einsums. ``layers.project_many`` asks for it under the
    ``"cpu"`` kernel."""
    parsed = [_parse(spec, x, w) for spec, w in zip(specs, ws, strict=True)]
    x_letters, _, _, rows, _, inner, size = parsed[0]
    n_rows = math.prod(size[c] for c in rows)
    same = all(p[0] == x_letters and p[3] == rows and p[5] == inner for p in parsed)
    big = sum(w.size for w in ws) >= STEP_MIN_WEIGHT  # tiny test models keep einsum (and compile faster)
    if not (STEP_ROWS[0] <= n_rows <= STEP_ROWS[1] and same and big):
        return None
    n_in = math.prod(size[c] for c in inner)
    x2 = jnp.einsum(f"{x_letters}->{''.join(rows + inner)}", x).reshape(n_rows, n_in)
    w2s = [
        jnp.einsum(f"{w_letters}->{''.join(cols + inner)}", w).reshape(-1, n_in)
        for (_, w_letters, _, _, cols, _, _), w in zip(parsed, ws, strict=True)
    ]
    w2 = jax.lax.optimization_barrier(jnp.concatenate(w2s) if len(w2s) > 1 else w2s[0])  # [out, in]
    y = jax.lax.optimization_barrier(w2 @ x2.T).T  # [out, rows] computed, then [rows, out]
    outs, at = [], 0
    for (_, _, out_letters, _, cols, _, sz), w2_i in zip(parsed, w2s, strict=True):
        n_out = w2_i.shape[0]
        y_i = y[:, at : at + n_out].reshape(*(sz[c] for c in rows + cols))
        outs.append(jnp.einsum(f"{''.join(rows + cols)}->{out_letters}", y_i))
        at += n_out
    return outs


def by_head(T: int, G: int, *, dropout: bool, kernel: str) -> bool:
    """Whether grouped attention of ``T`` query positions with ``G`` heads per group is taken
    head by head (:func:`attention_by_head`): the ``"cpu"`` kernel, one position, 1 < G <=
    ``STEP_MAX_GROUP``, no attention dropout."""
    return kernel == CPU_KERNEL and T == 1 and 1 < G <= STEP_MAX_GROUP and not dropout


def attention_by_head(
    q: Array,
    k: Array,
    v: Array,
    *,
    bias: Array | None,
    mask: Array | None,
    mask_value: float,
    k_scale: Array | None = None,
    v_scale: Array | None = None,
) -> Array:
    """Grouped attention of one query position (``q [B, 1, N, H]`` over ``k, v [B, K, S, H]``),
    one query head of each group at a time: G products ``[B, K, H] x [B, K, S, H]`` instead of
    one with G rows per K/V head. ``bias [..., N, 1, S]``, ``mask`` broadcastable to
    ``[B, 1, S]``; masked logits are ``mask_value``; a quantized cache's ``k_scale`` / ``v_scale``
    ``[B, K, 1, S]`` multiply the logits / probabilities. Returns ``[B, 1, N, H]``."""
    B, _, N, H = q.shape
    K, S = k.shape[1], k.shape[2]
    G = N // K
    qg = q.reshape(B, K, G, H)  # [B, K, G, H]: query head n = (n // G, n % G)
    if bias is not None:
        bias = jnp.broadcast_to(bias, (B, N, 1, S)).reshape(B, K, G, S).astype(jnp.float32)
    if mask is not None:
        mask = jnp.broadcast_to(mask, (B, 1, S))  # [B, 1, S]: every K/V head
    outs = []
    for g in range(G):
        logits = jnp.einsum("BKH,BKSH->BKS", qg[:, :, g], k, preferred_element_type=jnp.float32)
        if k_scale is not None:
            logits = logits * k_scale[:, :, 0]
        if bias is not None:
            logits = logits + bias[:, :, g]
        if mask is not None:
            logits = jnp.where(mask, logits, mask_value)
        probs = jax.nn.softmax(logits, axis=-1)  # [B, K, S]
        if v_scale is not None:
            probs = probs * v_scale[:, :, 0]
        outs.append(jnp.einsum("BKS,BKSH->BKH", probs.astype(v.dtype), v))  # [B, K, H]
    return jnp.stack(outs, axis=2).reshape(B, 1, N, H)
