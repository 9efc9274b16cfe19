"""Per-device bytes of programs compiled ahead of time on abstract shapes (``plan``'s measuring
side): compiling with the plan's CPU options, one device's bytes of a tree of shaped arrays, and
``memory_analysis()`` with its total."""

from __future__ import annotations

import math
import re
from typing import Any

import jax
import numpy as np

GIB = 2**30

# XLA options on the CPU backend only.
# - LLVM optimizations off: the plan never runs the executables, and LLVM optimizes the generated
#   code after XLA has assigned the buffers (faster compiles, the same buffer sizes).
# - No while-loop invariant code motion: XLA:CPU has no bfloat16 matmul, so it computes every
#   bfloat16 dot in float32, and this pass then hoists the float32 conversions of loop-invariant
#   operands out of the decode loop: a float32 copy of every decoder weight and of the whole
#   cross-attention K/V cache (twice its bytes) held for the whole loop, which a TPU or GPU (native
#   bfloat16 matmuls) never makes. Without the pass the conversions stay per step, transient
#   (docs/sharding.md). The train step has no loop (unless micro-batched).
# Not used: "xla_cpu_use_fusion_emitters": False (faster for tiny models, slower at xxl: docs/sharding.md).
CPU_COMPILE_OPTIONS: dict[str, Any] = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
    "xla_disable_hlo_passes": "while-loop-invariant-code-motion",
}


def compile_lowered(lowered: Any, platform: str | None = None) -> Any:
    """``lowered.compile()``, with ``CPU_COMPILE_OPTIONS`` when it compiles for the CPU
    (``platform``: the devices it was lowered for; None: this host's default backend)."""
    options = CPU_COMPILE_OPTIONS if (platform or jax.default_backend()) == "cpu" else None
    return lowered.compile(compiler_options=options) if options else lowered.compile()


def _itemsize(dtype: Any) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # a typed PRNG key: its key data
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype))
        return math.prod(data.shape) * np.dtype(data.dtype).itemsize
    return np.dtype(dtype).itemsize


def device_bytes(tree: Any) -> int:
    """Bytes one device holds of ``tree`` (``ShapeDtypeStruct``s or arrays with shardings): each
    leaf's shard (``sharding.shard_shape``: a dimension not split is held whole), summed."""
    leaves = jax.tree.leaves(tree)
    return sum(math.prod(x.sharding.shard_shape(tuple(x.shape))) * _itemsize(x.dtype) for x in leaves)


def with_shardings(tree: Any, shardings: Any) -> Any:
    """``tree``'s leaves as ``jax.ShapeDtypeStruct``s carrying ``shardings`` (a matching tree)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def memory(compiled: Any) -> dict[str, int]:
    """``compiled.memory_analysis()`` of one device, and ``total`` = argument + output - alias +
    temp + generated code (host-side sizes added when the backend reports any)."""
    m = compiled.memory_analysis()
    out = {
        "argument": int(m.argument_size_in_bytes),
        "output": int(m.output_size_in_bytes),
        "alias": int(m.alias_size_in_bytes),
        "temp": int(m.temp_size_in_bytes),
        "generated_code": int(m.generated_code_size_in_bytes),
    }
    host = sum(
        int(getattr(m, f"host_{k}_size_in_bytes", 0) or 0)
        for k in ("argument", "output", "temp", "generated_code")
    ) - int(getattr(m, "host_alias_size_in_bytes", 0) or 0)
    out["host"] = host
    out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"] + out["generated_code"] + host
    return out


def argument_bytes(compiled: Any, args: Any) -> dict[str, int]:
    """Per-device bytes of the arguments, all and those the executable keeps: jit drops arguments
    the program never reads (Adafactor's placeholder leaves, greedy decoding's temperature), and
    the compiled argument size counts only the kept ones. Which are kept is ``_kept_var_idx`` of
    jax's executable (private to jax; all are assumed kept when it is missing)."""
    leaves = jax.tree.leaves(args)
    kept = getattr(getattr(compiled, "_executable", None), "_kept_var_idx", None)
    kept = set(range(len(leaves))) if kept is None else set(kept)
    sizes = [device_bytes(x) for x in leaves]
    return {"all": sum(sizes), "kept": sum(n for i, n in enumerate(sizes) if i in kept)}


def cost(compiled: Any) -> dict[str, float]:
    """The executable's own count of one device's work, from ``cost_analysis()``: flops and bytes
    accessed (0 where the backend reports none). XLA counts a while loop's body once, whatever its
    trip count (docs/sharding.md), so a program with a loop (the decode loop, scanned layers,
    micro-batches) counts one pass of it."""
    analysis = compiled.cost_analysis() or {}
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per computation
        analysis = analysis[0] if analysis else {}
    return {
        "flops": float(analysis.get("flops", 0.0)),
        "bytes_accessed": float(analysis.get("bytes accessed", 0.0)),
    }


_OVER_HBM = re.compile(r"HLO temporaries \(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def over_hbm(err: BaseException) -> dict[str, Any] | None:
    """The TPU compiler's refusal of a program whose temporaries exceed the chip's HBM ("Ran out of
    memory on HBM, the total memory required for HLO temporaries (<size>) exceeds available HBM
    (<size>)", each size a number and a K / M / G / T suffix): the bytes it names and its message;
    None for any other error."""
    found = _OVER_HBM.search(str(err))
    if found is None:
        return None
    temp, available = (int(float(found[i]) * _UNITS[found[i + 1]]) for i in (1, 3))
    return {"temp": temp, "available": available, "message": str(err).strip().splitlines()[0]}
