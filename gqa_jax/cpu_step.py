"""The CPU decode fast path, in one place: what a decode loop on one CPU device does differently.

Letters: ``B`` batch, ``T`` query length, ``S`` key/value length, ``N`` query heads, ``K`` K/V
heads, ``G = N // K``, ``H`` head dim.

The decode loops (``decoding.decode_loop``, ``beam_search``) ask :func:`use_for` once per
compile, and that is the one dispatch point: on one CPU device the prefill encodes in row
chunks (:func:`encode_chunk_rows`) and the loop's step is traced inside :func:`step`, where
``layers.project_many`` takes few-row weight products out-major (:func:`out_major_products`)
and ``attention.grouped_attention`` takes one query position a query head at a time
(:func:`attention_by_head`). Training, the encoder, ``decode_step`` called alone, meshes over
several devices and GPUs / TPUs never enter it and keep the plain einsums. The results equal the
plain path's to float rounding (same sums, another order; the tokens are identical in the tests).

Why, measured on the 2-core development VM (t5-small shape, batch 8, input 512, float32; the
numbers and the tools that took them are in docs/decoding.md):

- Out-major weight products. A decode step reads every weight once for 8 rows. XLA:CPU reads a
  weight stored ``[in, out]`` at 4-5 GB/s in such a product, the same weight transposed to
  ``[out, in]`` and contracted as ``W @ X.T`` at 10-18 GB/s (the output layer: 14 -> 7 ms). The
  transpose (and the stacking of q/k/v and of the MLP's two input matrices into one matrix) sits
  behind an ``optimization_barrier`` so XLA does not fold it back into the dot; it is
  loop-invariant, so XLA hoists it out of the ``while_loop`` and it happens once per decode.
- Grouped attention of one position, head by head. XLA:CPU sends a batched product with G = 2..6
  query rows per K/V head to YNNPACK, which read the cross-attention cache at 3-4 GB/s; one-row
  products read at 10-14 GB/s. Taking the group's heads one at a time reads each K/V block G times
  (the later reads hit the caches) and is faster: GQA-3 4.33 -> 3.91 s end to end (MHA, G = 1,
  keeps its path; groups over ``STEP_MAX_GROUP`` heads keep one product: the graph would grow).
- Chunked prefill. Encoding a few rows at a time keeps a chunk's activations and ``[N, S, S]``
  logits in the CPU caches: 8 x 512 tokens 2.10 -> 1.84 s, 32 x 128: 1.76 -> 1.58 s, 8 x 1024:
  6.55 -> 5.15 s (T5-small encoder).
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array

STEP_ROWS = (2, 64)  # rows for which the out-major product measured faster on CPU
STEP_MIN_WEIGHT = 1 << 16  # elements: smaller weights sit in the CPU caches, layout barely matters
STEP_MAX_GROUP = 8  # query heads per group taken one by one (MQA at xxl, G = 64, keeps one product)
ENCODE_CHUNK_TOKENS = 1024  # tokens per chunk of the chunked prefill

_STATE = threading.local()


def use_for(mesh: Any) -> bool:
    """Whether a decode loop on ``mesh`` (None: no mesh) takes the CPU fast path: the CPU backend
    and a single device."""
    one_device = mesh is None or mesh.devices.size == 1
    return one_device and jax.default_backend() == "cpu"


@contextlib.contextmanager
def step(enabled: bool = True):
    """Trace a decode step with the fast path on (``enabled``) or off."""
    before = getattr(_STATE, "on", False)
    _STATE.on = enabled
    try:
        yield
    finally:
        _STATE.on = before


def active() -> bool:
    """Whether a trace runs inside :func:`step` (a CPU decode loop's step)."""
    return getattr(_STATE, "on", False)


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
    letters): the caller then takes the einsums."""
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


def by_head(T: int, G: int, dropout: bool) -> bool:
    """Whether grouped attention of ``T`` query positions with ``G`` heads per group is taken
    head by head (:func:`attention_by_head`): inside :func:`step`, one position, 1 < G <=
    ``STEP_MAX_GROUP``, no attention dropout."""
    return active() and T == 1 and 1 < G <= STEP_MAX_GROUP and not dropout


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
