"""What a decode program on one CPU device does differently, in one place: the decode kernel
``"cpu"`` (``config.KERNELS``; the other, ``"einsum"``, is every other backend's).

The kernel is chosen once on the host, for the mesh, by :func:`kernel_for` when
``decoding.decode_config`` builds a program's ``DecodeConfig``. It changes layouts, never the
math, and the modules never see it:

- The step's weights out-major. A decode step reads every weight once for a few rows. XLA:CPU
  reads a weight stored ``[in, out]`` at a third of the rate of the same weight stored
  ``[out, in]`` in such a product. ``decoding.step_weights`` lays out the products a step reads
  (:data:`STEP_PRODUCTS`: ``[in..., out...]`` -> ``[out..., in...]``, :func:`out_major`) once per
  decode, outside the step; the step's model sees them back in their own shapes
  (:func:`in_major`, a transpose XLA folds into the product's operand layout), so its products
  are the plain einsums of ``model.py`` reading the weights out-major.
- The greedy token by the argmax kernel, read in the logits' own layout (:func:`argmax`).
- The prefill in row chunks (:func:`encode_chunk_rows`). Encoding a few rows at a time keeps a
  chunk's activations and ``[N, S, S]`` logits in the CPU caches through a layer.

Each was measured faster on the CPU than the plain program (docs/results/decoding.md); the tokens
are the plain program's (the tests compare them).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from gqa_jax import cpu_kernels
from gqa_jax.config import CPU_KERNEL, EINSUM_KERNEL

# The weight products a decode step takes (``layers.project``), by parameter name, and how many
# leading axes of each are its input: query / key / value ``[D, N|K, H]``, out ``[N, H, D]``, wi
# ``[D, F]``, wo ``[F, D]``, lm_head ``[D, V]``. Under ``decoder``, cross-attention's key / value
# excepted (the prefill's).
STEP_PRODUCTS = {"query": 1, "key": 1, "value": 1, "out": 2, "wi_0": 1, "wi_1": 1, "wo": 1, "lm_head": 1}
ENCODE_CHUNK_TOKENS = 1024  # tokens per chunk of the chunked prefill


def kernel_for(mesh: Any) -> str:
    """The decode kernel for a loop on ``mesh`` (None: no mesh): ``"cpu"`` on the CPU backend and a
    single device, else ``"einsum"``. Asked on the host, once per loop, by ``decoding.decode_config``."""
    if mesh is None:
        one_cpu = jax.default_backend() == "cpu"
    else:
        one_cpu = mesh.devices.size == 1 and mesh.devices.flat[0].platform == "cpu"  # a TPU slice's mesh too
    return CPU_KERNEL if one_cpu else EINSUM_KERNEL


def argmax(logits: jax.Array) -> jax.Array:
    """``jnp.argmax(logits, -1)`` of a CPU step's ``[B, V]`` logits, read in the ``[V, B]`` they lie
    in (``layers.project``'s out-major product): by the argmax kernel where it takes them
    (``cpu_kernels.argmax_takes``: float32, a batch in whole vectors), else in two plain
    reductions, the largest logit (a NaN if the row has one) and then the first index that holds
    it. XLA:CPU runs argmax's one (value, index) reduction across that layout several times slower
    than either."""
    by_token = logits.T  # [V, B]: as the out-major product laid them out (no copy)
    if cpu_kernels.argmax_takes(by_token):
        return cpu_kernels.argmax(by_token)
    V = by_token.shape[0]
    best = jnp.max(by_token, axis=0)  # [B]
    hit = (by_token == best) | jnp.isnan(by_token)  # a NaN row's max is NaN: its first NaN
    return jnp.min(jnp.where(hit, jnp.arange(V, dtype=jnp.int32)[:, None], V), axis=0)


def encode_chunk_rows(batch: int, input_len: int) -> int:
    """Rows per chunk of the chunked encoder: the largest divisor of ``batch`` whose chunk holds at
    most ``ENCODE_CHUNK_TOKENS`` tokens (at least 1 row; ``batch`` itself means no chunking)."""
    fits = [r for r in range(1, batch + 1) if batch % r == 0 and r * input_len <= ENCODE_CHUNK_TOKENS]
    return max(fits, default=1)


def _input_axes(path: tuple[Any, ...]) -> int:
    """How many leading axes of the parameter at ``path`` are a step product's input (0: none)."""
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]  # not nnx's ``.value``
    name = names[-1]
    prefill_only = "cross_attn" in names and name in ("key", "value")  # the cross K/V projections
    if name == "lm_head" or (names[0] == "decoder" and name in STEP_PRODUCTS and not prefill_only):
        return STEP_PRODUCTS[name]
    return 0


def out_major(params: Any) -> Any:
    """The model's parameters (``nnx.split``'s state) with each step product's weight stored as one
    ``[out, in]`` matrix (``[D, N, H]`` -> ``[N * H, D]``); other parameters as they are."""

    def move(path: tuple[Any, ...], w: jax.Array) -> jax.Array:
        n = _input_axes(path)
        return w if not n else w.reshape(math.prod(w.shape[:n]), -1).T

    return jax.tree_util.tree_map_with_path(move, params)


def shapes_of(params: Any) -> tuple[tuple[int, ...], ...]:
    """The parameters' shapes in tree order: what :func:`in_major` needs to undo :func:`out_major`."""
    return tuple(tuple(leaf.shape) for leaf in jax.tree.leaves(params))


def in_major(params: Any, shapes: tuple[tuple[int, ...], ...]) -> Any:
    """The inverse of :func:`out_major`, given the model's shapes (:func:`shapes_of`): each matrix
    unflattened to ``[out..., in...]``, then its axes put back in the model's order; ``layers.project``
    under the ``"cpu"`` kernel undoes exactly these steps, so XLA reads the matrix as it lies."""

    def back(path: tuple[Any, ...], w: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        n = _input_axes(path)
        if not n:
            return w
        rank = len(shape)
        unflat = w.reshape(*shape[n:], *shape[:n])  # [out..., in...]
        return jnp.transpose(unflat, [*range(rank - n, rank), *range(rank - n)])

    leaves, tree = jax.tree_util.tree_flatten_with_path(params)
    back_leaves = [back(p, w, s) for (p, w), s in zip(leaves, shapes, strict=True)]
    return jax.tree_util.tree_unflatten(tree, back_leaves)
