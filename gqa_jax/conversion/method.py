"""What a conversion method is: the object the registry (``gqa_jax.conversion``) lists, what it is
given and what it returns. ``gqa_jax.convert`` applies a method to a checkpoint.

Letters: ``D`` d_model, ``N`` query heads, ``K`` source K/V heads, ``K'`` target K/V heads,
``H`` head dim, ``L`` layers.

A method converts one attention kind (e.g. every decoder layer's cross-attention) at a time: it
receives a :class:`Stack` (the projections of all the kind's layers, as numpy arrays in the
method's arithmetic dtype) and returns a :class:`Merged` (per layer, the projections it rewrote;
key and value always, at ``K'`` heads). Whole stacks, because a method may choose one head order
for all the layers of a self-attention stack (they share its relative position bias, whose
columns follow the query heads). The projections a method does not return are copied unchanged,
and so is everything else in the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax
import numpy as np

PROJECTIONS = ("query", "key", "value", "out")  # one attention layer's: [D, N, H], [D, K, H] x 2, [N, H, D]
Projections = Mapping[str, np.ndarray]  # projection name -> array


@dataclasses.dataclass(frozen=True)
class Stack:
    """The input of a method: one attention kind's layers and what the method may use.

    ``layers[i]`` holds layer ``i``'s projections named in the method's ``reads``;
    ``second_moments[i]`` is ``C = X^T X / n`` [D, D] of that layer's K/V input (calibration,
    ``gqa_jax.calibration``) or None; ``path_key(i, name)`` is the PRNG key of layer ``i``'s
    projection ``name`` (from the conversion's seed and the parameter's path).
    """

    kind: str  # "encoder_self", "decoder_self" or "cross"
    layers: tuple[Projections, ...]
    num_kv_heads: int  # K'
    second_moments: tuple[np.ndarray | None, ...]
    path_key: Callable[[int, str], jax.Array]

    @property
    def source_kv_heads(self) -> int:
        """K: the source's K/V heads of this kind."""
        return self.layers[0]["key"].shape[1]

    @property
    def group_size(self) -> int:
        """``K // K'``: source K/V heads merged into one target head."""
        return self.source_kv_heads // self.num_kv_heads


@dataclasses.dataclass(frozen=True)
class Merged:
    """The output of a method: ``layers[i]`` maps each projection it rewrote to its new array
    (``key`` and ``value`` [D, K', H] at least); ``query_order``, for a self-attention stack whose
    query heads were permuted, is that permutation (the stack's relative position bias columns
    follow it); ``head_orders``, per layer, the source K/V heads' order before contiguous groups
    of ``K // K'`` were merged (the manifest's group map), or None for the natural order."""

    layers: tuple[dict[str, np.ndarray], ...]
    query_order: list[int] | None = None
    head_orders: list[list[int]] | None = None


@dataclasses.dataclass(frozen=True)
class Method:
    """A conversion method: its name (``convert --method``, ``uptrain.method``), a one-line summary
    (the CLI's help, the docs' table), the merge, which projections it reads, its arithmetic dtype
    (inputs are cast to it, results cast back to the stored dtype), whether it draws from the
    conversion's seed (``Stack.path_key``; the manifest records the seed only then), whether it can
    use calibration statistics, and whether it is one of the paper's (its Fig. 4)."""

    name: str
    summary: str
    merge: Callable[[Stack], Merged]
    reads: tuple[str, ...] = PROJECTIONS
    dtype: type = np.float64
    seeded: bool = False
    calibrates: bool = False
    paper: bool = False
