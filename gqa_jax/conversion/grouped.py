"""``grouped``: similar heads share a target head. The K/V heads are reordered (each with its
query heads and output rows, which leaves the layer's function unchanged) so that each run of
``G = K // K'`` holds heads close in cosine similarity, then mean-pooled.

Letters as in ``gqa_jax.conversion.heads``. A self-attention stack shares one relative position
bias, whose columns follow the query heads, so it gets one order for all its layers (chosen from
their features side by side) and the bias columns are permuted with it; cross-attention has no
bias, and each layer gets its own order.

Calibrated (``C`` [D, D], the second moment of the layer's K/V input): the features are
``C^{1/2} k`` and ``C^{1/2} v``, so heads that differ only where the inputs never go look alike.
"""

from __future__ import annotations

import numpy as np

from gqa_jax.conversion import heads
from gqa_jax.conversion.method import Merged, Method, Stack


def head_features(k: np.ndarray, v: np.ndarray, second_moment: np.ndarray | None = None) -> np.ndarray:
    """[K, 2*D*H]: each K/V head's K and V projections, flattened (what ``grouped`` compares); with
    ``second_moment`` C [D, D], of ``C^{1/2} k`` and ``C^{1/2} v`` (their activations' geometry)."""
    K = k.shape[1]
    if second_moment is not None:
        root, _ = heads.weighting(second_moment)
        k, v = np.einsum("ed,dkh->ekh", root, k), np.einsum("ed,dkh->ekh", root, v)
    return np.concatenate([k.transpose(1, 0, 2).reshape(K, -1), v.transpose(1, 0, 2).reshape(K, -1)], axis=1)


def similar_groups(features: np.ndarray, group_size: int) -> list[int]:
    """An order of the ``K`` heads (rows of ``features`` [K, F]) in which each run of
    ``group_size`` holds heads close in cosine similarity: greedily, the lowest-numbered free head
    with its ``group_size - 1`` most similar free heads (ties: the lower number). Deterministic."""
    f = features / np.maximum(np.linalg.norm(features, axis=1, keepdims=True), 1e-30)
    sim = f @ f.T
    free, order = list(range(len(f))), []
    while free:
        head = free.pop(0)
        best = sorted(free, key=lambda m: (-round(float(sim[head, m]), 12), m))[: group_size - 1]
        order += [head, *sorted(best)]
        free = [m for m in free if m not in best]
    return order


def grouped(stack: Stack) -> Merged:
    feats = [
        head_features(layer["key"], layer["value"], c)
        for layer, c in zip(stack.layers, stack.second_moments, strict=True)
    ]
    if stack.kind == "cross":  # no position bias: each layer its own groups
        orders = [similar_groups(f, stack.group_size) for f in feats]
    else:  # the stack's bias follows the query heads: one order for every layer
        orders = [similar_groups(np.concatenate(feats, axis=1), stack.group_size)] * len(stack.layers)
    merged, query_order = [], None
    for layer, order in zip(stack.layers, orders, strict=True):
        q, k, v, o, query_order = heads.permute(
            layer["query"], layer["key"], layer["value"], layer["out"], order
        )
        K2 = stack.num_kv_heads
        merged.append({"query": q, "key": heads.mean_pool(k, K2), "value": heads.mean_pool(v, K2), "out": o})
    return Merged(
        tuple(merged), query_order=None if stack.kind == "cross" else query_order, head_orders=orders
    )


GROUPED = Method("grouped", "groups of similar heads, then their mean", grouped, calibrates=True)
