"""Multi-host runs: joining ``jax.distributed``, which rows each process feeds, global batches,
and gathering results and data positions across processes.

One process (the usual CPU or one-GPU case) makes every function here a plain local operation.
Several processes (TPU VM pods, GPU nodes, or local processes on one CPU machine with gloo
collectives) each feed their own slice of every batch: ``process_data_slice`` says which, and
``global_batch`` assembles the global arrays.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from gqa_jax.errors import RunError
from gqa_jax.sharding import batch_sharding


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

    def one(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(one, tree)


def allgather_json(obj: Any) -> list[Any]:
    """Every process's JSON-able ``obj``, in process order (a collective: all processes call it)."""
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
    """This process's iterator state from what ``all_data_states`` stored (None: start fresh); a
    RunError when another number of processes stored it."""
    if saved is None or "processes" not in saved:
        if saved is not None and jax.process_count() > 1:
            raise RunError(
                "this checkpoint's data position was written by one process; resuming it on "
                f"{jax.process_count()} processes would re-read data: resume with one process"
            )
        return saved
    states = saved["processes"]
    if len(states) != jax.process_count():
        raise RunError(
            f"this checkpoint's data positions were written by {len(states)} processes, but this run "
            f"has {jax.process_count()}: resume with {len(states)} processes"
        )
    return states[jax.process_index()]
