"""Device meshes and the one logical-axis rule table every array takes its sharding from.

The leaf of the mesh world: it imports nothing from gqa_jax, and the model's layers, the cache,
decoding and training all take their specs from here.

Mesh axes: ``data`` (batch) and ``model`` (heads, MLP hidden, vocab); a decode program whose K/V
heads are fewer than the model axis runs on ``decode_mesh``'s split of it (below). Every parameter has
logical axis names (``logical_axes``); ``RULES`` maps logical axes to mesh axes; ``spec`` turns a
shape's logical axes into a ``PartitionSpec``. A dimension whose size the mesh axis does not
divide is replicated instead, and recorded: for K/V heads this is the paper's section 2.2 waste
(MQA on 8-way model parallelism keeps 8 copies of its one K/V head; GQA-8 keeps none), which
``replication_report`` states in bytes per device.

    mesh = make_mesh("2x4")                                 # data 2 x model 4
    shardings, replicated = param_shardings(params, mesh)
    print(replication_report(replicated))

Decoding where K < model (Pope et al. 2022's batch-sharded multiquery; MaxText's ``cache_batch`` ->
``autoregressive``): ``decode_mesh`` splits the model axis into ``model`` (``gcd(K, model)``
devices, over which the K/V heads split) x ``autoregressive`` (the rest, over which the cache's
rows split), on the same devices in the same order. Every rule that named ``model`` then names
both (a weight lies on the devices exactly as before), the cache's heads (``cache_heads``) take
``model`` and its rows (``cache_batch``) ``data`` x ``autoregressive``, so no device holds a copy
of another's cache; the decoder's attentions regroup their queries to the cache's layout
(``cache_queries``) and back.

Activations and the KV cache take their specs from the same table: the model calls
``constrain(x, kind)`` at its layer boundaries, which is a no-op unless a trace runs inside
``activation_sharding(mesh)`` (the train step and the decode loops on a mesh do that). The train
state's shardings and the sharded step live beside the train step (``gqa_jax.training``), the
cache's layout beside the cache (``gqa_jax.cache.cache_layout``), multi-host helpers in
``gqa_jax.distributed``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "model")

MeshAxes = str | tuple[str, ...] | None  # one mesh axis, several (split over their product), or none

# logical axis -> mesh axis (None: replicated). The one table params, optimizer state,
# activations and the KV cache take their specs from.
RULES: dict[str, MeshAxes] = {
    "batch": "data",
    "heads": "model",
    "kv_heads": "model",
    "mlp": "model",
    "vocab": "model",
    "embed": None,
    "head_dim": None,
    "length": None,
    "buckets": None,
    "cache_batch": "data",  # the decode cache's rows (and its queries' in the attention)
    "cache_heads": "model",  # the decode cache's K/V heads
}
DECODE_AXIS = "autoregressive"  # the part of the model axis that splits the cache's rows (MaxText's name)

# FSDP (T5X's 2-D parameter partitioning, MaxText's fsdp axis): parameters and optimizer state
# split their embed dimension over `data` too, and XLA gathers each layer's weights where they are
# used. Activations are unchanged: their batch already takes `data`, and an array never uses one
# mesh axis twice (``spec``).
FSDP_RULES: dict[str, MeshAxes] = {**RULES, "embed": "data"}

# the logical axes of activations and the cache (the model's ``constrain`` calls use these)
ACTIVATION_AXES: dict[str, tuple[str, ...]] = {
    "hidden": ("batch", "length", "embed"),  # residual stream [B, T, D]
    "queries": ("batch", "length", "heads", "head_dim"),  # [B, T, N, H]
    "kv": ("batch", "kv_heads", "length", "head_dim"),  # projected keys / values [B, K, T, H]
    "cache": ("cache_batch", "cache_heads", "length", "head_dim"),  # the decoder's cached K/V [B, K, T, H]
    "cache_queries": ("cache_batch", "length", "cache_heads", "head_dim"),  # [B, T, N, H] as the cache lies
    "mlp": ("batch", "length", "mlp"),  # [B, T, F]
    "logits": ("batch", "length", "vocab"),  # [B, T, V]
    "tokens": ("batch", "length"),  # [B, T]
}

# parameter name (last path element) -> logical axes of its dimensions
_PARAM_AXES: dict[str, tuple[str, ...]] = {
    "query": ("embed", "heads", "head_dim"),
    "key": ("embed", "kv_heads", "head_dim"),
    "value": ("embed", "kv_heads", "head_dim"),
    "out": ("heads", "head_dim", "embed"),
    "wi_0": ("embed", "mlp"),
    "wi_1": ("embed", "mlp"),
    "wo": ("mlp", "embed"),
    "scale": ("embed",),
    "lm_head": ("embed", "vocab"),
}


def parse_mesh_shape(text: str | Sequence[int]) -> tuple[int, int]:
    """``"2x4"`` or ``(2, 4)`` -> ``(data, model)``."""
    if isinstance(text, str):
        parts = text.lower().split("x")
        try:
            shape = tuple(int(p) for p in parts)
        except ValueError:
            raise ValueError(f"mesh {text!r} must look like DATAxMODEL, e.g. 2x4") from None
    else:
        shape = tuple(int(p) for p in text)
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"mesh {text!r} must be two positive sizes DATAxMODEL, e.g. 1x8 or 2x4")
    return shape  # type: ignore[return-value]


def make_mesh(shape: str | Sequence[int], devices: Sequence[Any] | None = None) -> Mesh:
    """A ``(data, model)`` mesh of ``devices`` (None: this host's). With all of them, ordered by
    topology (:func:`device_grid`); with fewer, the first ones in order."""
    data, model = parse_mesh_shape(shape)
    available = list(devices) if devices is not None else jax.devices()
    if data * model > len(available):
        raise ValueError(
            f"mesh {data}x{model} needs {data * model} devices, but {len(available)} are available "
            "(on CPU, simulate more with XLA_FLAGS=--xla_force_host_platform_device_count=N)"
        )
    if data * model == len(available):
        # Auto axes: shardings of intermediates are propagated by the compiler (GSPMD), constrained
        # where we say so; explicit-sharding mode would demand an out_sharding on every gather.
        auto = (jax.sharding.AxisType.Auto,) * 2
        return Mesh(device_grid((data, model), available), MESH_AXES, axis_types=auto)
    return Mesh(np.asarray(available[: data * model]).reshape(data, model), MESH_AXES)


def device_grid(shape: Sequence[int], devices: Sequence[Any]) -> np.ndarray:
    """``devices`` as an array of ``shape``, ordered as ``jax.make_mesh`` orders them (on a TPU
    slice by its physical torus, elsewhere as given), except that a mesh axis may take part of a
    physical axis where no whole ones multiply to its size: ``8x8`` on a 4x4x4 v4 slice, which
    ``jax.make_mesh`` refuses (shown by ``plan --topology v4:4x4x4 --mesh 8x8``)."""
    return mesh_utils.create_device_mesh(tuple(shape), devices=list(devices), allow_split_physical_axes=True)


def logical_axes(path: Sequence[Any], ndim: int) -> tuple[str | None, ...]:
    """Logical axes of the parameter at ``path`` (keys of ``nnx.to_pure_dict``)."""
    names = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
    last = names[-1]
    if last == "embedding":
        axes: tuple[str | None, ...] = ("buckets", "heads") if "relpos" in names else ("vocab", "embed")
    elif last in _PARAM_AXES:
        axes = _PARAM_AXES[last]
    else:
        axes = (None,) * ndim
    if len(axes) != ndim:
        raise ValueError(f"parameter {'.'.join(names)} has {ndim} dims but logical axes {axes}")
    return axes


@dataclasses.dataclass
class Replication:
    """A dimension that could not be sharded: ``copies`` devices hold the same slice."""

    name: str
    logical_axis: str
    size: int
    mesh_axis: str
    mesh_size: int
    bytes_per_device: int

    @property
    def copies(self) -> int:
        return self.mesh_size


def spec(
    logical: Sequence[str | None],
    shape: Sequence[int],
    mesh: Mesh,
    rules: Mapping[str, MeshAxes] = RULES,
    *,
    name: str = "",
    itemsize: int = 4,
    replicated: list[Replication] | None = None,
) -> PartitionSpec:
    """The ``PartitionSpec`` of an array with these logical axes on ``mesh``. A rule of several
    mesh axes splits the dimension over their product; where the dimension does not divide it,
    over the longest leading part that it divides, the rest replicated (and recorded)."""
    out: list[str | tuple[str, ...] | None] = []
    used: set[str] = set()
    for axis, size in zip(logical, shape, strict=True):
        if axis is None:
            out.append(None)
            continue
        if axis not in rules:
            raise ValueError(
                f"unknown logical axis {axis!r} (of {name or 'an array'}); rules: {', '.join(rules)}"
            )
        wanted = _axes(rules[axis])
        for mesh_axis in wanted:
            if mesh_axis not in mesh.shape:
                raise ValueError(
                    f"rule {axis!r} -> {mesh_axis!r}: no such mesh axis (mesh axes: {mesh.axis_names})"
                )
        wanted = tuple(a for a in wanted if mesh.shape[a] > 1 and a not in used)
        taken = wanted
        while taken and size % math.prod(mesh.shape[a] for a in taken):
            taken = taken[:-1]  # cannot split: every device on the dropped axes keeps these slices
        if len(taken) < len(wanted) and replicated is not None:
            rest = wanted[len(taken) :]
            nbytes = itemsize * math.prod(shape)
            mesh_size = math.prod(mesh.shape[a] for a in rest)
            replicated.append(Replication(name, axis, size, "+".join(rest), mesh_size, nbytes))
        out.append(None if not taken else taken[0] if len(taken) == 1 else taken)
        used.update(taken)
    return PartitionSpec(*out)


def heads_only(mesh: Mesh) -> Mesh:
    """``mesh`` with a trivial ``autoregressive`` axis: ``decode_mesh`` then leaves it as it is, so a
    decode program on it holds the cache by K/V heads over ``model`` alone, replicated where K is
    smaller (the layout before ``decode_mesh``; ``plan --cache-layout heads`` compares the two)."""
    if DECODE_AXIS in mesh.shape:
        return mesh
    sizes, names = (*mesh.devices.shape, 1), (*mesh.axis_names, DECODE_AXIS)
    return Mesh(mesh.devices.reshape(sizes), names, axis_types=(jax.sharding.AxisType.Auto,) * len(names))


def _axes(rule: MeshAxes) -> tuple[str, ...]:
    return () if rule is None else (rule,) if isinstance(rule, str) else tuple(rule)


def decode_mesh(
    mesh: Mesh | jax.sharding.AbstractMesh, rules: Mapping[str, MeshAxes], kv_heads: int
) -> tuple[Any, dict[str, MeshAxes]]:
    """The mesh and rules a decode program with ``kv_heads`` K/V heads runs on (module docstring):
    ``mesh`` and ``rules`` themselves when K fills the model axis (or the mesh is split already),
    else the model axis split into ``model`` (``gcd(K, model)``) x ``autoregressive``, every rule
    that named ``model`` naming both but the cache's heads and the K/V projections' (``model``),
    and the cache's rows over ``data`` x ``autoregressive``. A real mesh keeps its devices in
    order (so placed parameters stay where they are); an abstract mesh stays abstract."""
    model = mesh.shape.get("model", 1)
    heads = math.gcd(kv_heads, model)
    if heads == model or DECODE_AXIS in mesh.shape:
        return mesh, dict(rules)
    sizes, names = (mesh.shape["data"], heads, model // heads), ("data", "model", DECODE_AXIS)
    if isinstance(mesh, jax.sharding.AbstractMesh):
        split = jax.sharding.AbstractMesh(sizes, names)
    else:
        split = Mesh(mesh.devices.reshape(sizes), names, axis_types=(jax.sharding.AxisType.Auto,) * 3)
    out: dict[str, MeshAxes] = {}
    for logical, rule in rules.items():
        axes = _axes(rule)
        if logical == "cache_batch":
            out[logical] = (*axes, DECODE_AXIS)
        elif logical in ("kv_heads", "cache_heads") or "model" not in axes:
            out[logical] = rule
        else:  # heads, mlp, vocab: the whole model axis, now two
            out[logical] = tuple(x for a in axes for x in ((a, DECODE_AXIS) if a == "model" else (a,)))
    return split, out


def param_shardings(
    params: Any, mesh: Mesh, rules: Mapping[str, MeshAxes] = RULES
) -> tuple[Any, list[Replication]]:
    """``NamedSharding`` per parameter of a pure-dict param tree, and what had to be replicated."""
    replicated: list[Replication] = []

    def one(path: Any, x: Any) -> NamedSharding:
        name = ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        axes = logical_axes(path, len(x.shape))
        itemsize = np.dtype(x.dtype).itemsize
        return NamedSharding(
            mesh, spec(axes, x.shape, mesh, rules, name=name, itemsize=itemsize, replicated=replicated)
        )

    return jax.tree_util.tree_map_with_path(one, params), replicated


def replication_report(replicated: Sequence[Replication]) -> str:
    """One line per replicated parameter kind: the factor and the extra bytes per device."""
    if not replicated:
        return "no replication: every sharded axis divides its mesh axis"
    kinds: dict[tuple[str, int, str, int], int] = {}
    for r in replicated:
        key = (r.logical_axis, r.size, r.mesh_axis, r.mesh_size)
        kinds[key] = kinds.get(key, 0) + r.bytes_per_device
    lines = []
    for (axis, size, mesh_axis, mesh_size), nbytes in kinds.items():
        extra = nbytes - nbytes // mesh_size
        lines.append(
            f"{axis} ({size}) replicated over {mesh_axis} ({mesh_size}): {mesh_size} copies, "
            f"{extra / 2**20:.3f} MiB extra per device"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------- activations and the cache
_ACTIVE = threading.local()


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Mapping[str, MeshAxes] = RULES):
    """While a function is traced inside this context, ``constrain`` pins activations to the
    specs the rules give on ``mesh``. Outside it ``constrain`` does nothing (one device)."""
    check_rules(rules, mesh)
    stack = getattr(_ACTIVE, "stack", None)
    if stack is None:
        stack = _ACTIVE.stack = []
    stack.append((mesh, dict(rules)))
    try:
        yield
    finally:
        stack.pop()


def constrain(x: Any, kind: str) -> Any:
    """``x`` with a sharding constraint for activation ``kind`` (a key of ``ACTIVATION_AXES``)
    when traced inside ``activation_sharding``; ``x`` itself otherwise."""
    stack = getattr(_ACTIVE, "stack", None)
    if not stack:
        return x
    mesh, rules = stack[-1]
    ps = spec(ACTIVATION_AXES[kind], x.shape, mesh, rules, name=kind)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, ps))


def check_rules(rules: Mapping[str, MeshAxes], mesh: Mesh) -> None:
    """Every rule maps to axes of ``mesh`` (or None), and every logical axis the model uses has a rule."""
    for logical, rule in rules.items():
        for mesh_axis in _axes(rule):
            if mesh_axis not in mesh.shape:
                raise ValueError(
                    f"rule {logical!r} -> {mesh_axis!r}: no such mesh axis (mesh axes: {tuple(mesh.shape)})"
                )
    used = {a for axes in (*ACTIVATION_AXES.values(), *_PARAM_AXES.values()) for a in axes}
    used |= {"buckets", "vocab", "embed"}
    missing = sorted(used - set(rules))
    if missing:
        raise ValueError(
            f"the sharding rules have no entry for logical axes {missing}; add them (None replicates)"
        )


def train_rules(fsdp: bool, d_model: int, mesh: Mesh) -> dict[str, MeshAxes]:
    """The rules of a train run: ``FSDP_RULES`` when ``fsdp`` (checked: ``data`` must divide
    ``d_model``, else nothing would be saved), else ``RULES``."""
    if not fsdp:
        return RULES
    data = mesh.shape["data"]
    if d_model % data:
        raise ValueError(
            f"fsdp: the data axis ({data} devices) does not divide d_model={d_model}, so the parameters "
            f"cannot be split over it; choose a mesh whose data axis divides {d_model}, or fsdp=False"
        )
    return FSDP_RULES


def shards(pspec: PartitionSpec, mesh: Mesh) -> int:
    """Into how many distinct slices ``pspec`` cuts an array on ``mesh``."""
    n = 1
    for entry in pspec:
        for axis in (entry,) if isinstance(entry, str) else (entry or ()):
            n *= mesh.shape[axis]
    return n


def rules_key(rules: Mapping[str, MeshAxes] | None) -> tuple[tuple[str, MeshAxes], ...] | None:
    """Rules as a hashable value (a static argument of ``jax.jit``)."""
    return None if rules is None else tuple(sorted(rules.items()))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Batch arrays: rows over ``data``, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(RULES["batch"], *([None] * (ndim - 1))))


def check_batch(batch: Mapping[str, Any], mesh: Mesh) -> None:
    """Rows must split evenly over the ``data`` axis."""
    data = mesh.shape["data"]
    for key, value in batch.items():
        if np.shape(value)[0] % data:
            raise ValueError(
                f"batch {key} has {np.shape(value)[0]} rows, not divisible by the data axis size {data}: "
                "choose a batch size that is a multiple of it"
            )


def shard_params(params: Any, mesh: Mesh, rules: Mapping[str, MeshAxes] = RULES) -> Any:
    """Place a pure-dict param tree on ``mesh`` by the rules (already placed leaves are resharded)."""
    shardings, _ = param_shardings(params, mesh, rules)
    return jax.device_put(params, shardings)
