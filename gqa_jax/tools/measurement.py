"""What every benchmark shares: the one timing rule, the machine probes, the machine's description,
the JSON file and the Markdown tables.

Timing rule (:func:`measure`): the first call (compile + run) is the warm-up and is excluded; a
timing is the median of ``runs`` later calls, each ended by ``jax.block_until_ready``; compile
time = first call - that median.

Probes, measured in the run that uses them:

- :func:`matmul_rate`: jitted ``[n, n] x [n, n]`` products, GFLOP/s = 2 n^3 / median time, the
  best over the sizes tried (the FLOP side of ``bench decode``'s floor, the MFU denominator of
  ``bench train``);
- :func:`measure_read_bandwidth`: ``[B, D] x [D, V]`` products, GB/s = matrix bytes / median time
  (the byte side of the floor);
- :func:`read_rate`: a jitted sum over a buffer, GB/s = its bytes / median time: what this machine
  streams from a buffer of a decode step's size and from one larger than the CPU caches
  (``bench step``'s roofline and its "share of the machine's").
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

BIG_MATRIX = 16 * 2**20  # a bandwidth probe must not fit in the CPU caches (bytes)
BIG_MATRIX_ACCELERATOR = 256 * 2**20  # nor in a GPU's L2 (60 MB on an H200) or a TPU's VMEM
BEYOND_CACHES = 256 * 2**20  # a buffer several times any CPU's last-level cache (bytes)


# ---------------------------------------------------------------------------------- timing
def measure(
    fn: Callable[..., Any], runs: int, prepare: Callable[[], Any] | None = None
) -> tuple[dict[str, Any], Any]:
    """Call ``fn`` once (compile + warm-up, excluded), then ``runs`` times; block on each result.
    With ``prepare``, each call is ``fn(prepare())``, its argument made and blocked on before the
    clock starts (a fresh input for a program that donates it).

    Returns ``({"median_s", "times_s", "first_s", "compile_s", "runs"}, first result)``.
    """

    def call() -> tuple[float, Any]:
        args = () if prepare is None else (jax.block_until_ready(prepare()),)
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        return time.perf_counter() - start, out

    first_s, first = call()
    times = [call()[0] for _ in range(runs)]
    median = statistics.median(times)
    timing = {"median_s": median, "times_s": times, "first_s": first_s, "runs": runs}
    timing["compile_s"] = max(first_s - median, 0.0)
    return timing, first


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


# ---------------------------------------------------------------------------------- the machine
def on_accelerator() -> bool:
    """True when JAX runs on a GPU or TPU (the probes grow, HF follows onto the GPU)."""
    return jax.default_backend() != "cpu"


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d.device_kind) for d in jax.devices()],
        "device_count": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": _cpu_model() or platform.processor() or platform.machine(),
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    return info


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


# ---------------------------------------------------------------------------------- the probes
def probe_sizes(d_model: int, vocab: int) -> dict[str, Any]:
    """Bandwidth probe shapes, the least bytes a probe must have to count, and the matmul size:
    the output layer's [D, V] and a 4096^2 matrix; on an accelerator also a 16384^2 one (the
    others fit in an H200's 60 MB L2) and an 8192^3 matmul (2048^3 is over in microseconds)."""
    if on_accelerator():
        return {
            "shapes": [(d_model, vocab), (4096, 4096), (16384, 16384)],
            "big": BIG_MATRIX_ACCELERATOR,
            "n": 8192,
        }
    return {"shapes": [(d_model, vocab), (4096, 4096)], "big": BIG_MATRIX, "n": 2048}


def measure_read_bandwidth(
    batch: int, shapes: list[tuple[int, int]], dtype: Any, runs: int, big: int = BIG_MATRIX
) -> dict:
    """``[B, D] x [D, V]`` products: GB/s = matrix bytes / median time, per shape and per weight
    layout: ``[D, V]`` contracted as stored (``in_out``) and ``[V, D]`` contracted out-major as the
    CPU decode step does (``out_in``, ``layers.project`` under the ``"cpu"`` kernel). The reference
    is the fastest product on a matrix of at least ``big`` bytes (a smaller one would measure the
    caches)."""
    products = {
        "in_out": jax.jit(lambda x, w: x @ w),  # w [D, V]
        "out_in": jax.jit(lambda x, wt: jax.lax.optimization_barrier(wt @ x.T).T),  # wt [V, D]
    }
    results = []
    for d, v in shapes:
        w = jax.random.normal(jax.random.key(1), (d, v), jnp.float32).astype(dtype)
        x = jnp.ones((batch, d), dtype)
        nbytes = int(w.nbytes)
        for layout, product in products.items():
            weight = w if layout == "in_out" else w.T  # eager: a [V, D] array of its own
            timing, _ = measure(lambda x=x, w=weight, f=product: f(x, w), runs)
            results.append(
                {"shape": [batch, d, v], "layout": layout, "bytes": nbytes, "median_s": timing["median_s"]}
                | {"gb_s": nbytes / timing["median_s"] / 1e9}
            )
            del weight
    counted = [r for r in results if r["bytes"] >= big] or results
    return {"probes": results, "reference": max(counted, key=lambda r: r["gb_s"]), "big_bytes": big}


def read_rate(nbytes: int, runs: int) -> dict[str, Any]:
    """A jitted ``jnp.sum`` over a float32 buffer of ``nbytes``: ``{"bytes", "median_s", "gb_s"}``,
    the rate XLA streams a buffer of that size (one held in the CPU caches reads faster than one
    that is not)."""
    x = jnp.ones((max(nbytes // 4, 1),), jnp.float32)
    total = jax.jit(jnp.sum)
    timing, _ = measure(lambda: total(x), runs)
    return {
        "bytes": int(x.nbytes),
        "median_s": timing["median_s"],
        "gb_s": x.nbytes / timing["median_s"] / 1e9,
    }


def matmul_rate(dtype: Any, sizes: Sequence[int], runs: int) -> dict[str, Any]:
    """Jitted ``[n, n] x [n, n]`` products for each ``n`` in ``sizes``: GFLOP/s = 2 n^3 / median
    time; the best size's ``{"gflop_s", "shape", "median_s", "dtype"}``, and every size's under
    ``"probes"``."""
    probes = []
    for n in sizes:
        a = jax.random.normal(jax.random.key(2), (n, n), jnp.float32).astype(dtype)
        matmul = jax.jit(jnp.matmul)
        timing, _ = measure(lambda a=a, mm=matmul: mm(a, a), runs)
        probes.append(
            {
                "shape": [n, n, n],
                "median_s": timing["median_s"],
                "gflop_s": 2 * n**3 / timing["median_s"] / 1e9,
            }
        )
    best = max(probes, key=lambda p: p["gflop_s"])
    return {**best, "dtype": jnp.dtype(dtype).name, "probes": probes}


# ---------------------------------------------------------------------------------- results
def write_json(obj: Any, path: str | os.PathLike) -> None:
    """``obj`` (a benchmark's result) as indented JSON (:func:`to_json`) at ``path``."""
    with open(path, "w") as f:
        json.dump(to_json(obj), f, indent=1)
        f.write("\n")


def to_json(res: Any) -> Any:
    """``res`` with numpy scalars / arrays turned into Python numbers and lists, keys into strings,
    non-finite floats into None."""
    if isinstance(res, dict):
        return {str(k): to_json(v) for k, v in res.items()}
    if isinstance(res, list | tuple):
        return [to_json(v) for v in res]
    if isinstance(res, np.ndarray):
        return res.tolist()
    if isinstance(res, np.generic):
        return res.item()
    if isinstance(res, float) and not math.isfinite(res):
        return None
    return res


Column = tuple[str, Callable[[Any], str]]  # (header, item -> cell)


def md_table(columns: Sequence[Column], items: Sequence[Any]) -> list[str]:
    """A Markdown table, one line per entry: the header, the separator, one row per item."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(cell(item) for _, cell in columns) + " |" for item in items]
