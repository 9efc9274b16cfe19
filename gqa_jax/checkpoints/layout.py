"""Foreign checkpoints' tensors in our parameter layout, read whole or one device's slice at a time.

Every importer (HF safetensors, HF Flax, T5X) describes each stored tensor by a ``Tensor``: our
parameter path, our shape, and ``axes``, which says for each stored axis which of our axes it
holds (several merged, outermost first). For example our query kernel is ``[D, N, H]``:

    T5X / HF Flax ``[D, N*H]``   axes ((0,), (1, 2))
    HF torch      ``[N*H, D]``   axes ((1, 2), (0,))
    T5X 3-D       ``[D, N, H]``  axes ((0,), (1,), (2,))

so one function (``read``) turns any block of ours into the stored rows it needs: a merged group
reads whole inner axes (a head's ``H`` values are contiguous) and slices them afterwards. With a
mesh, ``materialize`` builds each parameter with ``jax.make_array_from_callback``: every device
receives only the block its sharding (from the rule table) assigns, read from the file on the
host that owns the device, so no host or device ever holds a full copy of a sharded parameter.

``check`` compares the stored names and shapes with the expected ones and raises one
``ValueError`` listing every missing, unexpected and mis-shaped tensor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx import traversals
from jax.sharding import Mesh

from gqa_jax import model as model_lib
from gqa_jax import sharding
from gqa_jax.config import DTYPES, ModelConfig

Index = tuple[slice, ...]
Reader = Callable[[str, Index], np.ndarray]  # (stored name, index into the stored tensor) -> block


@dataclasses.dataclass(frozen=True)
class Tensor:
    """Where one stored tensor goes: ``path`` in our tree, our ``shape``, and for each stored
    axis the tuple of our axes it holds (merged, outermost first)."""

    path: tuple[Any, ...]
    shape: tuple[int, ...]
    axes: tuple[tuple[int, ...], ...]

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(self.shape[a] for a in group) for group in self.axes)

    def to_stored(self, ours: np.ndarray) -> np.ndarray:
        """Our array in the stored layout (what an exporter writes)."""
        order = [a for group in self.axes for a in group]
        return np.ascontiguousarray(np.transpose(ours, order).reshape(self.stored_shape))


def same(path: tuple[Any, ...], shape: tuple[int, ...]) -> Tensor:
    """A tensor stored exactly as we hold it."""
    return Tensor(path, shape, tuple((i,) for i in range(len(shape))))


def read(tensor: Tensor, read_stored: Callable[[Index], Any], index: Index | None = None) -> np.ndarray:
    """``ours[index]`` of ``tensor`` (all of it when ``index`` is None), reading only the stored
    rows it needs through ``read_stored(stored_index)``."""
    shape = tensor.shape
    bounds = [slice(None).indices(n)[:2] for n in shape] if index is None else _bounds(index, shape)
    stored_index, block_shape, order, after = [], [], [], [slice(None)] * len(shape)
    for outer, *inner in tensor.axes:
        size = math.prod(shape[a] for a in inner)  # the inner axes are read whole
        start, stop = bounds[outer]
        stored_index.append(slice(start * size, stop * size))
        block_shape += [stop - start, *(shape[a] for a in inner)]
        order += [outer, *inner]
        for a in inner:
            after[a] = slice(*bounds[a])
    block = np.asarray(read_stored(tuple(stored_index))).reshape(block_shape)
    block = np.transpose(block, np.argsort(order))  # stored axis order -> ours
    return np.ascontiguousarray(block[tuple(after)])


def _bounds(index: Index, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    bounds = []
    for s, n in zip(index, shape, strict=True):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"a strided slice {s} cannot be read from a checkpoint")
        bounds.append((start, stop))
    return bounds


def stored_dtype(dtypes: Iterable[str]) -> str:
    """The parameter dtype of a checkpoint whose tensors have ``dtypes``: theirs when they all
    share one of ours, else float32."""
    found = set(dtypes)
    return found.pop() if len(found) == 1 and found <= set(DTYPES) else "float32"


def check(
    expected: Mapping[str, Tensor],
    stored: Mapping[str, tuple[int, ...]],
    what: str,
    *,
    optional: Iterable[str] = (),
) -> None:
    """Raise one ValueError naming every missing, unexpected and mis-shaped tensor of ``stored``
    (name -> shape) against ``expected``; names in ``optional`` may be absent or present."""
    optional = set(optional)
    missing = sorted(set(expected) - set(stored) - optional)
    unexpected = sorted(set(stored) - set(expected) - optional)
    misshaped = [
        f"{name}: expected {expected[name].stored_shape}, found {tuple(stored[name])}"
        for name in sorted(set(stored) & set(expected))
        if tuple(stored[name]) != expected[name].stored_shape
    ]
    problems = [
        f"{title} ({len(items)}): {items}"
        for title, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
        if items
    ]
    if problems:
        raise ValueError(f"{what}:\n" + "\n".join(problems))


def materialize(
    tensors: Mapping[str, Tensor],
    reader: Reader,
    config: ModelConfig,
    *,
    mesh: Mesh | None = None,
    extra: Mapping[tuple[Any, ...], tuple[Tensor, str]] | None = None,
) -> dict[str, Any]:
    """Our pure-dict parameter tree, every tensor read through ``reader`` and cast to
    ``config.param_dtype``: on the default device, or (with ``mesh``) sharded by the rule table,
    each device reading only its block. ``extra`` maps further paths to ``(tensor, stored name)``
    (one stored tensor feeding two of ours, e.g. an lm_head copied from the embedding)."""
    dtype = jnp.dtype(config.param_dtype)
    jobs = {t.path: (t, name) for name, t in tensors.items()} | dict(extra or {})
    shardings = {}
    if mesh is not None:
        target = nnx.to_pure_dict(nnx.state(model_lib.abstract(config), nnx.Param))
        shardings = model_lib.flat_params(sharding.param_shardings(target, mesh)[0])

    params = {}
    for path, (tensor, name) in jobs.items():

        def block(index: Index | None, tensor: Tensor = tensor, name: str = name) -> np.ndarray:
            out = read(tensor, lambda i: reader(name, i), index)
            return out.astype(dtype, copy=False)

        if mesh is None:
            params[path] = jnp.asarray(block(None))
        else:
            params[path] = jax.make_array_from_callback(tensor.shape, shardings[path], _once(block))
    return traversals.unflatten_mapping(params)


def _once(block: Callable[[Index], np.ndarray]) -> Callable[[Index], np.ndarray]:
    """``block`` reading each distinct index once (replicas of a block share one read)."""
    done: dict[tuple[tuple[int, int, int], ...], np.ndarray] = {}

    def cached(index: Index) -> np.ndarray:
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key not in done:
            done[key] = block(index)
        return done[key]

    return cached
