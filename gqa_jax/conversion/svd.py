"""``svd``: the group's shared head is the best rank-H fit of all its members at once.

The group's stacked projections ``[k_1 .. k_G]`` [D, G*H] = ``U S Vt``; the shared head is
``U[:, :H] S[:H]`` and member ``m``'s own part ``Cm = S^-1 U^T km`` [H, H] (``km ~ shared Cm``)
moves into its query heads (``qn Cm^T``); likewise V, with ``Em`` moved into the output rows
(``Em on``). With ``G = 1`` it would be an exact change of basis, so the head is kept as it is.

Calibrated (``C`` [D, D], the second moment of the layer's K/V input ``X``): what should survive
is each head's activations ``X km``, so the fit is measured on ``C^{1/2} km``:
``C^{1/2} [k_1 .. k_G] = U S Vt``, the shared head is ``C^{-1/2} U[:, :H] S[:H]`` and member
``m``'s part its [H, H] block of ``Vt[:H]``: ``X km ~ X shared Cm`` is the best rank-H fit of the
group's activations (in the mean over the calibration tokens). Letters as in
``gqa_jax.conversion.heads``.
"""

from __future__ import annotations

import numpy as np

from gqa_jax.conversion import heads
from gqa_jax.conversion.method import Merged, Method, Stack


def shared_basis(members: np.ndarray):
    """members [D, G, H] -> (shared [D, H], parts [G, H, H]) with ``members[:, m] ~ shared @ parts[m]``."""
    D, G, H = members.shape
    u, s, _ = np.linalg.svd(members.reshape(D, G * H), full_matrices=False)
    u, s = u[:, :H], s[:H]
    inverse = np.where(s > s[0] * 1e-12, 1.0 / np.maximum(s, 1e-300), 0.0)  # rank-deficient: drop
    parts = np.einsum("h,dh,dgi->ghi", inverse, u, members)  # S^-1 U^T member
    return u * s, parts


def weighted_shared_basis(members: np.ndarray, root: np.ndarray, inverse: np.ndarray):
    """As ``shared_basis``, the fit measured on the activations: ``root`` = C^{1/2}, ``inverse`` =
    C^{-1/2} [D, D]; ``C^{1/2} members`` = U S Vt, shared = C^{-1/2} U_H S_H, parts = blocks of Vt_H."""
    D, G, H = members.shape
    weighted = np.einsum("ed,dgh->egh", root, members).reshape(D, G * H)  # [D, G*H]
    u, s, vt = np.linalg.svd(weighted, full_matrices=False)
    shared = inverse @ (u[:, :H] * s[:H])  # [D, H]
    parts = vt[:H].reshape(H, G, H).transpose(1, 0, 2)  # [G, H, H]: member m ~ shared @ parts[m]
    return shared, parts


def fit(q, k, v, o, num_kv: int, second_moment: np.ndarray | None = None):
    """One layer: each group's shared K (V) head from the SVD of its stacked members (with
    ``second_moment`` C [D, D]: of their activations); each member's remainder folded into its
    query heads (output rows). Float64 in, float64 out."""
    D, N, H = q.shape
    K = k.shape[1]
    G = K // num_kv
    if G == 1:  # one member: its best rank-H fit is itself (no change of basis, no rounding)
        return q, k, v, o
    if second_moment is None:
        basis = shared_basis
    else:
        root, inverse = heads.weighting(second_moment)

        def basis(members: np.ndarray):
            return weighted_shared_basis(members, root, inverse)

    q, o = q.copy(), o.copy()
    new_k, new_v = np.empty((D, num_kv, H)), np.empty((D, num_kv, H))
    for j in range(num_kv):
        members = slice(j * G, (j + 1) * G)
        new_k[:, j], ck = basis(k[:, members])
        new_v[:, j], ev = basis(v[:, members])
        for g in range(G):
            reading = heads.query_heads(j * G + g, N, K)
            q[:, reading] = np.einsum("dnh,ih->dni", q[:, reading], ck[g])  # qn Cm^T
            o[reading] = np.einsum("ih,nhd->nid", ev[g], o[reading])  # Em on
    return q, new_k, new_v, o


def svd(stack: Stack) -> Merged:
    out = []
    for layer, c in zip(stack.layers, stack.second_moments, strict=True):
        q, k, v, o = fit(layer["query"], layer["key"], layer["value"], layer["out"], stack.num_kv_heads, c)
        out.append({"query": q, "key": k, "value": v, "out": o})
    return Merged(tuple(out))


SVD = Method("svd", "the group's best rank-H fit, each member's remainder moved into its queries", svd,
             calibrates=True)  # fmt: skip
