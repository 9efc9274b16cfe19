"""``medoid``: each target head is one of its group's own heads, the one closest to the group.

Like ``first`` it keeps a real source head (its key and value together), but it chooses the
member whose key and value projections are nearest (squared Frobenius distance, key and value
added) to the group's mean: the most central head rather than the lowest-numbered. Ties go to the
lower number. Key and value only; the queries and outputs are copied unchanged. Letters as in
``gqa_jax.conversion.heads``.
"""

from __future__ import annotations

import numpy as np

from gqa_jax.conversion import heads
from gqa_jax.conversion.method import Merged, Method, Stack


def central_members(k: np.ndarray, v: np.ndarray, num_kv: int) -> list[int]:
    """Per target head ``j``, the index ``g`` (within the group) of its most central member."""
    kg, vg = heads.groups(k, num_kv), heads.groups(v, num_kv)  # [D, K', G, H]
    distance = ((kg - kg.mean(axis=2, keepdims=True)) ** 2).sum(axis=(0, 3))  # [K', G]
    distance += ((vg - vg.mean(axis=2, keepdims=True)) ** 2).sum(axis=(0, 3))
    return [int(np.argmin(row)) for row in distance]  # argmin: the first of equals


def medoid(stack: Stack) -> Merged:
    out = []
    for layer in stack.layers:
        k, v, K2 = layer["key"], layer["value"], stack.num_kv_heads
        chosen = central_members(k, v, K2)
        kg, vg = heads.groups(k, K2), heads.groups(v, K2)
        out.append({
            "key": np.stack([kg[:, j, g] for j, g in enumerate(chosen)], axis=1),  # [D, K', H]
            "value": np.stack([vg[:, j, g] for j, g in enumerate(chosen)], axis=1),
        })  # fmt: skip
    return Merged(tuple(out))


MEDOID = Method("medoid", "the group's most central head (nearest to the group's mean)", medoid,
                reads=("key", "value"))  # fmt: skip
