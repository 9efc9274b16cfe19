"""Device meshes and the one logical-axis rule table every array takes its sharding from.

Mesh axes: ``data`` (batch) and ``model`` (heads, MLP hidden, vocab). Every parameter has
logical axis names (``logical_axes``); ``RULES`` maps logical axes to mesh axes; ``spec`` turns a
shape's logical axes into a ``PartitionSpec``. A dimension whose size the mesh axis does not
divide is replicated instead, and recorded: for K/V heads this is the paper's section 2.2 waste
(MQA on 8-way model parallelism keeps 8 copies of its one K/V head; GQA-8 keeps none), which
``replication_report`` states in bytes per device.

    mesh = make_mesh("2x4")                                 # data 2 x model 4
    state, shardings, replicated = init_sharded_state(config, optimizer, mesh, seed=0)
    print(replication_report(replicated))
    step = make_sharded_train_step(graphdef, optimizer, mesh, shardings)
    tokens = decoding.greedy_decode((graphdef, state.params), ids, 64, mesh=mesh).tokens

Activations and the KV cache take their specs from the same table: the model calls
``constrain(x, logical_axes)`` at its layer boundaries, which is a no-op unless a trace runs
inside ``activation_sharding(mesh)`` (the sharded train step and the decode loops do that).
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
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "model")

# logical axis -> mesh axis (None: replicated). The one table params, optimizer state,
# activations and the KV cache take their specs from.
RULES: dict[str, str | None] = {
    "batch": "data",
    "heads": "model",
    "kv_heads": "model",
    "mlp": "model",
    "vocab": "model",
    "embed": None,
    "head_dim": None,
    "length": None,
    "buckets": None,
}

# the logical axes of activations and the cache (the model's ``constrain`` calls use these)
ACTIVATION_AXES: dict[str, tuple[str, ...]] = {
    "hidden": ("batch", "length", "embed"),  # residual stream [B, T, D]
    "queries": ("batch", "length", "heads", "head_dim"),  # [B, T, N, H]
    "kv": ("batch", "kv_heads", "length", "head_dim"),  # keys / values and the cache [B, K, T, H]
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
    """A ``(data, model)`` mesh. With all devices, ``jax.make_mesh`` orders them by topology."""
    data, model = parse_mesh_shape(shape)
    available = list(devices) if devices is not None else jax.devices()
    if data * model > len(available):
        raise ValueError(
            f"mesh {data}x{model} needs {data * model} devices, but {len(available)} are available "
            "(on CPU, simulate more with XLA_FLAGS=--xla_force_host_platform_device_count=N)"
        )
    if devices is None and data * model == len(available):
        # Auto axes: shardings of intermediates are propagated by the compiler (GSPMD), constrained
        # where we say so; explicit-sharding mode would demand an out_sharding on every gather.
        auto = (jax.sharding.AxisType.Auto,) * 2
        return jax.make_mesh((data, model), MESH_AXES, axis_types=auto)
    return Mesh(np.asarray(available[: data * model]).reshape(data, model), MESH_AXES)


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
    rules: Mapping[str, str | None] = RULES,
    *,
    name: str = "",
    itemsize: int = 4,
    replicated: list[Replication] | None = None,
) -> PartitionSpec:
    """The ``PartitionSpec`` of an array with these logical axes on ``mesh``."""
    out: list[str | None] = []
    used: set[str] = set()
    for axis, size in zip(logical, shape, strict=True):
        if axis is None:
            out.append(None)
            continue
        if axis not in rules:
            raise ValueError(
                f"unknown logical axis {axis!r} (of {name or 'an array'}); rules: {', '.join(rules)}"
            )
        mesh_axis = rules[axis]
        if mesh_axis is not None and mesh_axis not in mesh.shape:
            raise ValueError(
                f"rule {axis!r} -> {mesh_axis!r}: no such mesh axis (mesh axes: {mesh.axis_names})"
            )
        mesh_size = mesh.shape[mesh_axis] if mesh_axis else 1
        if mesh_axis is None or mesh_size == 1 or mesh_axis in used:
            out.append(None)
        elif size % mesh_size:
            out.append(None)  # cannot split: every device on this axis keeps the whole dimension
            if replicated is not None:
                nbytes = itemsize * math.prod(shape)
                replicated.append(Replication(name, axis, size, mesh_axis, mesh_size, nbytes))
        else:
            out.append(mesh_axis)
            used.add(mesh_axis)
    return PartitionSpec(*out)


def param_shardings(
    params: Any, mesh: Mesh, rules: Mapping[str, str | None] = RULES
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
def activation_sharding(mesh: Mesh, rules: Mapping[str, str | None] = RULES):
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


def check_rules(rules: Mapping[str, str | None], mesh: Mesh) -> None:
    """Every rule maps to an axis of ``mesh`` (or None), and every logical axis the model uses has a rule."""
    for logical, mesh_axis in rules.items():
        if mesh_axis is not None and mesh_axis not in mesh.shape:
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


def shards(pspec: PartitionSpec, mesh: Mesh) -> int:
    """Into how many distinct slices ``pspec`` cuts an array on ``mesh``."""
    n = 1
    for entry in pspec:
        for axis in (entry,) if isinstance(entry, str) else (entry or ()):
            n *= mesh.shape[axis]
    return n


def cache_layout(
    config: Any,
    mesh: Mesh,
    batch: int,
    input_len: int,
    output_len: int,
    dtype: Any,
    rules: Mapping[str, str | None] = RULES,
) -> tuple[dict[str, Any], list[Replication]]:
    """How a decode cache ``[B, K, length, H]`` per layer lies on ``mesh``: per kind (``self``,
    ``cross``) its ``PartitionSpec``, the formula's total bytes, the shards, and the bytes each
    device holds (``total / shards``; a replicated K/V-head axis is not divided). Also the
    replicated K/V-head axes (``replication_report`` states the waste)."""
    from gqa_jax import cache as kvcache

    size = np.dtype(dtype).itemsize
    total = kvcache.expected_cache_bytes(config, batch, input_len, output_len, dtype)
    out: dict[str, Any] = {}
    replicated: list[Replication] = []
    for kind, attn, length in (("self", "decoder_self", output_len), ("cross", "cross", input_len)):
        shape = (batch, config.kv_heads(attn), length, config.head_dim)
        found: list[Replication] = []
        ps = spec(
            ACTIVATION_AXES["kv"], shape, mesh, rules, name=f"cache.{kind}", itemsize=size, replicated=found
        )
        n = shards(ps, mesh)
        per_device = total[kind] // n
        for r in found:  # the bytes a device holds of this kind's cache, over all layers, K and V
            replicated.append(dataclasses.replace(r, bytes_per_device=per_device))
        out[kind] = {"spec": ps, "total_bytes": total[kind], "shards": n, "bytes_per_device": per_device}
    return out, replicated


_LOGGED: set[Any] = set()


def log_once(key: Any, msg: str) -> None:
    """Print ``msg`` to stderr once per ``key``, on process 0 only."""
    import sys

    if key in _LOGGED or jax.process_index() != 0:
        return
    _LOGGED.add(key)
    print(msg, file=sys.stderr, flush=True)


def rules_key(rules: Mapping[str, str | None] | None) -> tuple[tuple[str, str | None], ...] | None:
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


def state_shardings(state: Any, mesh: Mesh, rules: Mapping[str, str | None] = RULES) -> Any:
    """Shardings of a ``TrainState`` (concrete or abstract, e.g. from ``jax.eval_shape``): params by
    the rules; optimizer leaves shaped like their parameter take its sharding, other leaves
    (factored moments, counters) are replicated."""
    from gqa_jax.training import TrainState

    p_shard, _ = param_shardings(state.params, mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    by_shape: dict[tuple[int, ...], list[NamedSharding]] = {}
    for x, s in zip(jax.tree.leaves(state.params), jax.tree.leaves(p_shard), strict=True):
        by_shape.setdefault(tuple(x.shape), []).append(s)

    def opt_sharding(x: Any) -> NamedSharding:
        cands = by_shape.get(tuple(np.shape(x)), [])
        # same-shape params may differ in spec only where one dim was replicated; take the first
        return cands[0] if cands and len({c.spec for c in cands}) == 1 else replicated

    return TrainState(
        step=replicated,
        params=p_shard,
        opt_state=jax.tree.map(opt_sharding, state.opt_state),
        rng=replicated,
    )


def shard_state(state: Any, mesh: Mesh, rules: Mapping[str, str | None] = RULES) -> tuple[Any, Any]:
    """Place a host ``TrainState`` on ``mesh``. Returns ``(placed state, its shardings)``."""
    shardings = state_shardings(state, mesh, rules)
    return jax.device_put(state, shardings), shardings


def shard_params(params: Any, mesh: Mesh, rules: Mapping[str, str | None] = RULES) -> Any:
    """Place a pure-dict param tree on ``mesh`` by the rules (already placed leaves are resharded)."""
    shardings, _ = param_shardings(params, mesh, rules)
    return jax.device_put(params, shardings)


def init_sharded_state(
    config: Any, optimizer: Any, mesh: Mesh, seed: int, rules: Mapping[str, str | None] = RULES
) -> tuple[Any, Any, Any, list[Replication]]:
    """A fresh ``TrainState`` created already sharded: the initializers run under ``jax.jit`` with
    the state's shardings as ``out_shardings``, so no host ever holds the whole model (each device
    computes its own slices). The values equal ``training.init_state(T5(config, rngs=nnx.Rngs(seed)),
    ...)`` on one device. Returns ``(state, shardings, graphdef, replicated)``."""
    from flax import nnx

    from gqa_jax import training
    from gqa_jax.model import T5

    def init() -> Any:
        return training.init_state(T5(config, rngs=nnx.Rngs(seed)), optimizer, seed)

    graphdef, _ = training.split_model(nnx.eval_shape(lambda: T5(config, rngs=nnx.Rngs(seed))))
    abstract = jax.eval_shape(init)
    shardings = state_shardings(abstract, mesh, rules)
    _, replicated = param_shardings(abstract.params, mesh, rules)
    state = jax.jit(init, out_shardings=shardings)()
    return state, shardings, graphdef, replicated


def make_sharded_train_step(
    graphdef: Any,
    optimizer: Any,
    mesh: Mesh,
    state_shardings: Any,
    *,
    num_microbatches: int = 1,
    z_loss: float | None = None,
    dropout: bool = False,
    rules: Mapping[str, str | None] = RULES,
) -> Any:
    """``training.make_train_step`` jitted with explicit in/out shardings on ``mesh``."""
    import functools

    from gqa_jax import training

    step_fn = functools.partial(
        training._train_step, graphdef, optimizer, num_microbatches=num_microbatches,
        z_loss=training.Z_LOSS if z_loss is None else z_loss, dropout=dropout,
    )  # fmt: skip

    def fn(state: Any, batch: Any) -> Any:
        with activation_sharding(mesh, rules):  # traced here: the model's constraints apply
            return step_fn(state, batch)

    batch = batch_sharding(mesh)
    scalar = NamedSharding(mesh, PartitionSpec())
    jitted = jax.jit(
        fn,
        in_shardings=(state_shardings, batch),
        out_shardings=(state_shardings, scalar),
        donate_argnums=(0,),
    )

    def step(state: Any, batch_arrays: Mapping[str, Any]) -> Any:
        check_batch(batch_arrays, mesh)
        return jitted(state, batch_arrays)

    return step


# ------------------------------------------------------------------------------ multi-host
def initialize_distributed(
    coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> bool:
    """Join a multi-process run when the arguments or the environment say so; returns whether
    this is a multi-process run.

    - ``GQA_JAX_COORDINATOR=host:port GQA_JAX_NUM_PROCESSES=n GQA_JAX_PROCESS_ID=i``: explicit
      (GPU nodes, or several local processes on one CPU machine);
    - ``GQA_JAX_DISTRIBUTED=auto``: ``jax.distributed.initialize()`` finds the cluster itself
      (TPU VM pods, SLURM, Open MPI);
    - neither: one process, nothing to do.
    On CPU the collectives go through gloo. Call it before anything else touches JAX devices.
    """
    import os

    coordinator = coordinator or os.environ.get("GQA_JAX_COORDINATOR")
    if num_processes is None and os.environ.get("GQA_JAX_NUM_PROCESSES"):
        num_processes = int(os.environ["GQA_JAX_NUM_PROCESSES"])
    if process_id is None and os.environ.get("GQA_JAX_PROCESS_ID"):
        process_id = int(os.environ["GQA_JAX_PROCESS_ID"])
    auto = os.environ.get("GQA_JAX_DISTRIBUTED", "").lower() == "auto"
    if coordinator is None and not auto:
        return False
    if coordinator is not None and (num_processes is None or process_id is None):
        raise ValueError(
            f"coordinator {coordinator!r} given without the number of processes and this process's id: "
            "set GQA_JAX_NUM_PROCESSES and GQA_JAX_PROCESS_ID (or pass them)"
        )
    if coordinator is not None and not 0 <= process_id < num_processes:
        raise ValueError(f"process id {process_id} is not in [0, {num_processes})")
    if jax.distributed.is_initialized():
        return jax.process_count() > 1
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms.startswith("cpu") or (not platforms and _cpu_only()):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if coordinator is None:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)
    return jax.process_count() > 1


def _cpu_only() -> bool:
    import importlib.util

    # No accelerator plugin installed: the CPU backend will be used.
    return not any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin", "libtpu"))


def process_data_slice(mesh: Mesh) -> tuple[int, int]:
    """``(index, count)``: which of the batch's distinct row slices this process feeds.

    Processes whose devices sit at the same ``data`` coordinates are replicas of each other and
    feed identical rows (e.g. a 1x8 mesh over two hosts: both feed the whole batch); a 2x4 mesh
    over two hosts gives each host its own half."""
    rows = {}
    for idx, device in np.ndenumerate(mesh.devices):
        rows.setdefault(device.process_index, set()).add(idx[mesh.axis_names.index("data")])
    slices = sorted({frozenset(v) for v in rows.values()}, key=min)
    return slices.index(frozenset(rows[jax.process_index()])), len(slices)


def global_batch(local: Mapping[str, Any], mesh: Mesh, *, identical: bool = False) -> dict[str, jax.Array]:
    """Arrays from this process's rows (its ``process_data_slice``) -> global arrays with rows
    over ``data``. ``identical=True``: every process passes the same whole batch (evaluation).
    In one process this is a ``device_put``."""
    out = {}
    for key, value in local.items():
        value = np.asarray(value)
        sharding = batch_sharding(mesh, value.ndim)
        if jax.process_count() == 1:
            out[key] = jax.device_put(value, sharding)
        else:
            shape = value.shape if identical else None
            out[key] = jax.make_array_from_process_local_data(sharding, value, shape)
    return out


def to_host(tree: Any) -> Any:
    """Numpy copies of (possibly multi-process) global arrays, on every process."""
    from jax.experimental import multihost_utils

    def one(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(one, tree)


def allgather_json(obj: Any) -> list[Any]:
    """Every process's JSON-able ``obj``, in process order (a collective: all processes call it)."""
    import json

    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int32))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [json.loads(row[:n].tobytes().decode()) for row, n in zip(rows, sizes, strict=True)]


def all_data_states(local: Any) -> Any:
    """What a checkpoint stores of the input pipelines: this process's iterator state, or, in a
    multi-process run, every process's (each reads its own slice of the data, so each resumes
    from its own position; orbax writes the JSON from process 0 only)."""
    if jax.process_count() == 1:
        return local
    return {"processes": allgather_json(local)}


def own_data_state(saved: Any) -> Any:
    """This process's iterator state from what ``all_data_states`` stored (None: start fresh)."""
    if saved is None or "processes" not in saved:
        if saved is not None and jax.process_count() > 1:
            raise ValueError(
                "this checkpoint's data position was written by one process; resuming it on "
                f"{jax.process_count()} processes would re-read data: resume with one process"
            )
        return saved
    states = saved["processes"]
    if len(states) != jax.process_count():
        raise ValueError(
            f"this checkpoint's data positions were written by {len(states)} processes, but this run "
            f"has {jax.process_count()}: resume with {len(states)} processes"
        )
    return states[jax.process_index()]
