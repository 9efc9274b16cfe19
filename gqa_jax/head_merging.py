"""Merging K/V heads beyond mean pooling, one attention layer at a time (numpy, float64).

Letters: ``D`` d_model, ``N`` query heads, ``K`` source K/V heads, ``K'`` target K/V heads,
``G = K // K'`` source heads per target head, ``R = N // K`` query heads per source K/V head,
``H`` head dim. One layer's projections: ``q`` [D, N, H], ``k`` and ``v`` [D, K, H], ``o``
[N, H, D]; query head ``n`` reads K/V head ``n // R``, and the target's query head ``n`` reads
target head ``n // (N // K')``, so target head ``j`` serves the source heads ``j*G .. j*G+G-1``.

Each method returns the four projections with ``k`` and ``v`` of ``K'`` heads (the standard GQA
shape, so decoding costs what mean pooling's model costs), and rewrites ``q`` and ``o`` so that
as much of each head's function as possible survives the merge:

- ``permute(q, k, v, o, order)`` reorders the K/V heads (with their query heads and output rows)
  without changing the layer's function: ``grouped`` chooses ``order`` with ``similar_groups``
  so that similar heads share a target head, then mean-pools.
- ``aligned``: T5 has no rotary embedding, so a head's K projection can be rotated by any
  orthogonal ``Rm`` [H, H] if its query heads are rotated the same way (``q k^T`` is unchanged),
  and its V projection by ``Sm`` if its output rows get ``Sm^T``. Each member is rotated onto the
  group's first head (orthogonal Procrustes: ``Rm = U Vt`` from the SVD of ``km^T kref``) before
  the mean. Heads that are rotations of one another merge exactly.
- ``svd``: the group's stacked projections ``[k_1 .. k_G]`` [D, G*H] = ``U S Vt``; the shared
  head is ``U[:, :H] S[:H]`` (the best rank-H fit of all members at once) and member ``m``'s own
  part ``Cm = S^-1 U^T km`` [H, H] (``km ~ shared Cm``) moves into its query heads
  (``qn Cm^T``); likewise V, with ``Em`` moved into the output rows (``Em on``). With ``G = 1``
  it would be an exact change of basis, so the head is kept as it is.

Calibrated (``second_moment`` given: ``C = X^T X / n`` [D, D], the second moment of the layer's
K/V input ``X`` over some tokens, gathered by ``gqa_jax.calibration``): what should survive is each
head's activations ``X km``, not its weights, so both methods measure in the inner product
``<a, b>_C = tr(a^T C b)``, i.e. on ``C^{1/2} km``:

- ``grouped``: the heads' features are ``C^{1/2} km`` and ``C^{1/2} vm``, so heads that differ
  only where the inputs never go look alike;
- ``svd``: ``C^{1/2} [k_1 .. k_G] = U S Vt``; the shared head is ``C^{-1/2} U[:, :H] S[:H]`` and
  member ``m``'s part is its [H, H] block of ``Vt[:H]``, so ``X km ~ X shared Cm`` is the best
  rank-H fit of the group's activations (in the mean over the calibration tokens).

This module only receives ``C``; it never sees data.
"""

from __future__ import annotations

import numpy as np

MERGES = ("grouped", "aligned", "svd")
CALIBRATED = ("grouped", "svd")  # the methods that can weigh heads by a second moment of their input
# C + RIDGE * trace(C) / D * I: the calibration tokens may not span every input direction (fewer
# tokens than D, or inputs confined to a subspace), and C^{-1/2} needs C invertible. The ridge is a
# millionth of C's mean eigenvalue: it changes the fit on the directions the data covers by about
# that much, and on the uncovered ones svd's shared head keeps the weights' own values (projected on
# the group's top right singular vectors) instead of whatever an ill-conditioned inverse would give.
RIDGE = 1e-6


def _query_heads(m: int, num_heads: int, num_kv: int) -> slice:
    """The query heads that read source K/V head ``m``."""
    r = num_heads // num_kv
    return slice(m * r, (m + 1) * r)


def permute(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, order: list[int]):
    """K/V heads in ``order`` (new head ``i`` is old head ``order[i]``), each with its query heads
    and output rows: the layer computes the same function. Returns ``(q, k, v, o, query_order)``;
    ``query_order`` is the query-head permutation (for a per-head relative position bias)."""
    N, K = q.shape[1], k.shape[1]
    query_order = [n for m in order for n in range(N)[_query_heads(m, N, K)]]
    return q[:, query_order], k[:, order], v[:, order], o[query_order], query_order


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


def weighting(second_moment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(C^{1/2}, C^{-1/2})`` [D, D] of the ridged second moment (``RIDGE``), symmetric, float64."""
    D = second_moment.shape[0]
    c = (second_moment + second_moment.T) / 2  # symmetric to the last bit
    floor = RIDGE * np.trace(c) / D
    eigenvalues, vectors = np.linalg.eigh(c + floor * np.eye(D))
    eigenvalues = np.maximum(eigenvalues, floor)  # rounding may leave one a little below the ridge
    root = np.einsum("de,e,fe->df", vectors, np.sqrt(eigenvalues), vectors)
    inverse = np.einsum("de,e,fe->df", vectors, 1.0 / np.sqrt(eigenvalues), vectors)
    return root, inverse


def head_features(k: np.ndarray, v: np.ndarray, second_moment: np.ndarray | None = None) -> np.ndarray:
    """[K, 2*D*H]: each K/V head's K and V projections, flattened (what ``grouped`` compares); with
    ``second_moment`` C [D, D], of ``C^{1/2} k`` and ``C^{1/2} v`` (their activations' geometry)."""
    K = k.shape[1]
    if second_moment is not None:
        root, _ = weighting(second_moment)
        k, v = np.einsum("ed,dkh->ekh", root, k), np.einsum("ed,dkh->ekh", root, v)
    return np.concatenate([k.transpose(1, 0, 2).reshape(K, -1), v.transpose(1, 0, 2).reshape(K, -1)], axis=1)


def mean_pool(k: np.ndarray, num_kv: int) -> np.ndarray:
    """[D, K, H] -> [D, K', H]: the mean of each contiguous group."""
    D, K, H = k.shape
    return k.reshape(D, num_kv, K // num_kv, H).mean(axis=2)


def _procrustes(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The orthogonal [H, H] ``R`` minimizing ``|a R - ref|`` (a, ref: [D, H])."""
    u, _, vt = np.linalg.svd(a.T @ ref)
    return u @ vt


def aligned(q, k, v, o, num_kv: int):
    """Rotate every member onto its group's first head (K: Procrustes, folded into its query
    heads; V: folded into its output rows), then mean-pool. Float64 in, float64 out."""
    N, K = q.shape[1], k.shape[1]
    G = K // num_kv
    q, k, v, o = q.copy(), k.copy(), v.copy(), o.copy()
    for j in range(num_kv):
        ref = j * G
        for m in range(ref + 1, ref + G):
            heads = _query_heads(m, N, K)
            r = _procrustes(k[:, m], k[:, ref])
            k[:, m], q[:, heads] = k[:, m] @ r, q[:, heads] @ r
            s = _procrustes(v[:, m], v[:, ref])
            v[:, m], o[heads] = v[:, m] @ s, np.einsum("hi,nhd->nid", s, o[heads])
    return q, mean_pool(k, num_kv), mean_pool(v, num_kv), o


def _shared_basis(members: np.ndarray):
    """members [D, G, H] -> (shared [D, H], parts [G, H, H]) with ``members[:, m] ~ shared @ parts[m]``."""
    D, G, H = members.shape
    u, s, _ = np.linalg.svd(members.reshape(D, G * H), full_matrices=False)
    u, s = u[:, :H], s[:H]
    inverse = np.where(s > s[0] * 1e-12, 1.0 / np.maximum(s, 1e-300), 0.0)  # rank-deficient: drop
    parts = np.einsum("h,dh,dgi->ghi", inverse, u, members)  # S^-1 U^T member
    return u * s, parts


def _weighted_shared_basis(members: np.ndarray, root: np.ndarray, inverse: np.ndarray):
    """As ``_shared_basis``, the fit measured on the activations: ``root`` = C^{1/2}, ``inverse`` =
    C^{-1/2} [D, D]; ``C^{1/2} members`` = U S Vt, shared = C^{-1/2} U_H S_H, parts = blocks of Vt_H."""
    D, G, H = members.shape
    weighted = np.einsum("ed,dgh->egh", root, members).reshape(D, G * H)  # [D, G*H]
    u, s, vt = np.linalg.svd(weighted, full_matrices=False)
    shared = inverse @ (u[:, :H] * s[:H])  # [D, H]
    parts = vt[:H].reshape(H, G, H).transpose(1, 0, 2)  # [G, H, H]: member m ~ shared @ parts[m]
    return shared, parts


def svd(q, k, v, o, num_kv: int, second_moment: np.ndarray | None = None):
    """Each group's shared K (V) head from the SVD of its stacked members (with ``second_moment``
    C [D, D]: of their activations, ``C^{1/2}`` times them); each member's remainder folded into its
    query heads (output rows). Float64 in, float64 out."""
    D, N, H = q.shape
    K = k.shape[1]
    G = K // num_kv
    if G == 1:  # one member: its best rank-H fit is itself (no change of basis, no rounding)
        return q, k, v, o
    if second_moment is None:
        fit = _shared_basis
    else:
        root, inverse = weighting(second_moment)

        def fit(members: np.ndarray):
            return _weighted_shared_basis(members, root, inverse)

    q, o = q.copy(), o.copy()
    new_k, new_v = np.empty((D, num_kv, H)), np.empty((D, num_kv, H))
    for j in range(num_kv):
        members = slice(j * G, (j + 1) * G)
        new_k[:, j], ck = fit(k[:, members])
        new_v[:, j], ev = fit(v[:, members])
        for g in range(G):
            heads = _query_heads(j * G + g, N, K)
            q[:, heads] = np.einsum("dnh,ih->dni", q[:, heads], ck[g])  # qn Cm^T
            o[heads] = np.einsum("ih,nhd->nid", ev[g], o[heads])  # Em on
    return q, new_k, new_v, o
