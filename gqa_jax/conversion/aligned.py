"""``aligned``: each member rotated onto its group's first head before the mean.

T5 has no rotary embedding, so a head's K projection can be rotated by any orthogonal ``Rm``
[H, H] if its query heads are rotated the same way (``q k^T`` is unchanged), and its V projection
by ``Sm`` if its output rows get ``Sm^T``. Each member is rotated onto the group's first head
(orthogonal Procrustes: ``Rm = U Vt`` from the SVD of ``km^T kref``), then the group is
mean-pooled. Heads that are rotations of one another merge exactly. Letters as in
``gqa_jax.conversion.heads``.
"""

from __future__ import annotations

import numpy as np

from gqa_jax.conversion import heads
from gqa_jax.conversion.method import Merged, Method, Stack


def procrustes(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The orthogonal [H, H] ``R`` minimizing ``|a R - ref|`` (a, ref: [D, H])."""
    u, _, vt = np.linalg.svd(a.T @ ref)
    return u @ vt


def align(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, num_kv: int):
    """One layer: every member rotated onto its group's first head (K: folded into its query heads;
    V: into its output rows), then mean-pooled. Float64 in, float64 out."""
    N, K = q.shape[1], k.shape[1]
    G = K // num_kv
    q, k, v, o = q.copy(), k.copy(), v.copy(), o.copy()
    for j in range(num_kv):
        ref = j * G
        for m in range(ref + 1, ref + G):
            members = heads.query_heads(m, N, K)
            r = procrustes(k[:, m], k[:, ref])
            k[:, m], q[:, members] = k[:, m] @ r, q[:, members] @ r
            s = procrustes(v[:, m], v[:, ref])
            v[:, m], o[members] = v[:, m] @ s, np.einsum("hi,nhd->nid", s, o[members])
    return q, heads.mean_pool(k, num_kv), heads.mean_pool(v, num_kv), o


def aligned(stack: Stack) -> Merged:
    out = []
    for layer in stack.layers:
        q, k, v, o = align(layer["query"], layer["key"], layer["value"], layer["out"], stack.num_kv_heads)
        out.append({"query": q, "key": k, "value": v, "out": o})
    return Merged(tuple(out))


ALIGNED = Method("aligned", "members rotated onto the group's first head, then the mean", aligned)
