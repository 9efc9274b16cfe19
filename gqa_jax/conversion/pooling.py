"""The paper's three ways to build a target K/V head from its group (section 2.1, Fig. 4): the
mean, the first member, a fresh random draw. Key and value only, float32 arithmetic; the queries
and outputs are copied unchanged.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from gqa_jax.conversion import heads
from gqa_jax.conversion.method import Merged, Method, Stack
from gqa_jax.layers import fan_in_init

KV = ("key", "value")


def _each(stack: Stack, new) -> Merged:
    """``new(layer, name, w [D, K, H])`` -> [D, K', H] for the key and value of every layer."""
    return Merged(tuple({n: new(i, n, layer[n]) for n in KV} for i, layer in enumerate(stack.layers)))


def mean(stack: Stack) -> Merged:
    """Target head ``j`` is the mean of its group's heads."""
    return _each(stack, lambda i, n, w: heads.mean_pool(w, stack.num_kv_heads))


def first(stack: Stack) -> Merged:
    """Target head ``j`` is its group's first head, ``j * G``."""
    return _each(stack, lambda i, n, w: heads.groups(w, stack.num_kv_heads)[:, :, 0, :])


def random(stack: Stack) -> Merged:
    """Target head ``j`` is a fresh draw from the model's K/V initializer (``fan_in_init(D)``),
    keyed by the seed and the parameter's path: the same seed always gives the same heads."""

    def draw(i: int, name: str, w: np.ndarray) -> np.ndarray:
        D, _, H = w.shape
        return np.asarray(fan_in_init(D)(stack.path_key(i, name), (D, stack.num_kv_heads, H), jnp.float32))

    return _each(stack, draw)


MEAN = Method("mean", "the mean of the group's heads (the paper's)", mean, KV, np.float32, paper=True)
FIRST = Method("first", "the group's first head", first, KV, np.float32, paper=True)
RANDOM = Method("random", "a fresh random head (keyed by the seed)", random, KV, np.float32, seeded=True,
                paper=True)  # fmt: skip
