"""grain's per-epoch shuffle of a map dataset, the same order, at a cost that does not grow as the
dataset shrinks.

``grain.MapDataset.shuffle(seed)`` places element ``j`` of epoch ``e`` at
``index_shuffle(j, n - 1, seed + e, rounds=4)``: a 4-round Simon-style Feistel cipher on a block of
at least 16 bits, keyed by ``std::seed_seq{seed}``, applied again and again until the value lands in
``[0, n - 1]`` (cycle walking). Under 65,536 elements the block is the 16-bit minimum, so one
element costs about 65,536 / n cipher calls: 0.4 ms per element of a 40-element split, 15 ms an
epoch whatever ``n`` is. The suite's and the quick demo's datasets are that small.

:func:`shuffled` keeps grain's order (the data a seed gives, and a saved iterator's position, do not
change) and, for a block of 16 bits, computes a whole epoch's permutation at once with numpy: the
cipher over all 65,536 values, then each value's first in-range successor by pointer doubling
(log2 of the longest walk steps). Larger datasets keep grain's transformation: their walks are
short. ``tests/test_pipeline.py`` checks the permutation against grain's ``index_shuffle``.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import grain
import numpy as np

BLOCK = 1 << 16  # grain's smallest cipher block: datasets up to this size are shuffled here
_ROUNDS = 4  # grain's rounds for MapDataset.shuffle
_M32 = 0xFFFFFFFF
_LOCK = threading.Lock()


def shuffled(ds: grain.MapDataset, seed: int) -> grain.MapDataset:
    """``ds.shuffle(seed)``'s elements in its order: :class:`EpochShuffle` up to ``BLOCK`` elements."""
    return EpochShuffle(ds, seed) if 0 < len(ds) <= BLOCK else ds.shuffle(seed=seed)


class EpochShuffle(grain.MapDataset):
    """Element ``i`` is ``parent[perm_e[j] + e * n]`` (``e, j = divmod(i, n)``) as grain's shuffle
    gives it, ``perm_e`` computed once per epoch (:func:`permutation`)."""

    def __init__(self, parent: grain.MapDataset, seed: int):
        super().__init__(parent)
        if not 0 <= seed < 2**32:
            raise ValueError(f"a shuffle seed is between 0 and 2**32 - 1, not {seed}")
        self._seed = int(seed)
        self._n = len(parent)

    def __len__(self) -> int:
        return self._n

    def __str__(self) -> str:
        return "EpochShuffle"

    def _index(self, index: int) -> int:
        epoch, j = divmod(index, self._n)
        return int(permutation(self._n, (self._seed + epoch) & _M32)[j]) + epoch * self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        return self._parent[self._index(index)]

    def _getitems(self, indices: Any) -> Any:
        return self._parent._getitems([self._index(i) for i in indices])


def permutation(n: int, seed: int) -> np.ndarray:
    """``[index_shuffle(j, n - 1, seed, 4) for j in range(n)]`` for ``n <= BLOCK`` (read-only):
    computed once, however many of grain's prefetch threads ask for it at the same time."""
    with _LOCK:
        return _permutation(n, seed)


@functools.lru_cache(maxsize=16)
def _permutation(n: int, seed: int) -> np.ndarray:
    if n == 1:
        return np.zeros(1, np.int64)
    step = _cipher16(np.arange(BLOCK, dtype=np.uint32), _seed_seq(seed, _ROUNDS)).astype(np.int64)
    stop = step <= n - 1
    # jump[v]: walking from v, the first value in range, or where 2^k steps end if none is yet
    jump = step
    while not stop[:n].all():
        jump = np.where(stop, jump, jump[jump])
        stop = jump <= n - 1
    out = jump[:n].copy()
    out.flags.writeable = False
    return out


def _seed_seq(seed: int, count: int) -> list[int]:
    """``std::seed_seq{seed}.generate`` of ``count`` 32-bit words (the C++ standard's algorithm,
    [rand.util.seedseq], for one input word)."""
    b = [0x8B8B8B8B] * count
    t = next((t for size, t in ((623, 11), (68, 7), (39, 5), (7, 3)) if count >= size), (count - 1) // 2)
    p, s = (count - t) // 2, 1
    q = p + t
    for k in range(max(s + 1, count)):
        x = b[k % count] ^ b[(k + p) % count] ^ b[(k - 1) % count]
        r1 = (1664525 * (x ^ (x >> 27))) & _M32
        r2 = (r1 + (s if k == 0 else (k % count + seed) if k <= s else k % count)) & _M32
        b[(k + p) % count] = (b[(k + p) % count] + r1) & _M32
        b[(k + q) % count] = (b[(k + q) % count] + r2) & _M32
        b[k % count] = r2
    for k in range(max(s + 1, count), max(s + 1, count) + count):
        x = (b[k % count] + b[(k + p) % count] + b[(k - 1) % count]) & _M32
        r3 = (1566083941 * (x ^ (x >> 27))) & _M32
        r4 = (r3 - k % count) & _M32
        b[(k + p) % count] ^= r3
        b[(k + q) % count] ^= r4
        b[k % count] = r4
    return b


def _cipher16(value: np.ndarray, keys: list[int]) -> np.ndarray:
    """The Feistel cipher on 16-bit blocks (two 8-bit words, each round key's low 8 bits)."""

    def rotl(x: np.ndarray, r: int) -> np.ndarray:
        return ((x << r) | (x >> (8 - r))) & 0xFF

    def f(x: np.ndarray) -> np.ndarray:
        return (rotl(x, 1) & x) ^ rotl(x, 2)

    left, right = (value >> 8) & 0xFF, value & 0xFF
    for k1, k2 in zip(keys[0::2], keys[1::2], strict=True):
        left = left ^ f(right) ^ (k1 & 0xFF)
        right = right ^ f(left) ^ (k2 & 0xFF)
    return (left << 8) | right
