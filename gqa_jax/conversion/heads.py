"""Head algebra the conversion methods share (numpy, one attention layer at a time).

Letters: ``D`` d_model, ``N`` query heads, ``K`` source K/V heads, ``K'`` target K/V heads,
``R = N // K`` query heads per source K/V head, ``H`` head dim. One layer's projections: ``q``
[D, N, H], ``k`` and ``v`` [D, K, H], ``o`` [N, H, D]; query head ``n`` reads K/V head ``n // R``,
and the target's query head ``n`` reads target head ``n // (N // K')``, so target head ``j``
serves the source heads ``j*G .. j*G+G-1`` (``G = K // K'``, contiguous, as in the paper).
"""

from __future__ import annotations

import numpy as np

# C + RIDGE * trace(C) / D * I: the calibration tokens may not span every input direction (fewer
# tokens than D, or inputs confined to a subspace), and C^{-1/2} needs C invertible. The ridge is a
# millionth of C's mean eigenvalue: it changes the fit on the directions the data covers by about
# that much, and on the uncovered ones a fit keeps the weights' own values instead of whatever an
# ill-conditioned inverse would give.
RIDGE = 1e-6


def query_heads(m: int, num_heads: int, num_kv: int) -> slice:
    """The query heads that read source K/V head ``m``."""
    r = num_heads // num_kv
    return slice(m * r, (m + 1) * r)


def groups(k: np.ndarray, num_kv: int) -> np.ndarray:
    """[D, K, H] -> [D, K', G, H]: target head ``j``'s members ``j*G .. j*G+G-1``."""
    D, K, H = k.shape
    return k.reshape(D, num_kv, K // num_kv, H)


def mean_pool(k: np.ndarray, num_kv: int) -> np.ndarray:
    """[D, K, H] -> [D, K', H]: the mean of each contiguous group (in ``k``'s dtype)."""
    return groups(k, num_kv).mean(axis=2)


def permute(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, order: list[int]):
    """K/V heads in ``order`` (new head ``i`` is old head ``order[i]``), each with its query heads
    and output rows: the layer computes the same function. Returns ``(q, k, v, o, query_order)``;
    ``query_order`` is the query-head permutation (for a per-head relative position bias)."""
    N, K = q.shape[1], k.shape[1]
    query_order = [n for m in order for n in range(N)[query_heads(m, N, K)]]
    return q[:, query_order], k[:, order], v[:, order], o[query_order], query_order


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
