"""The CPU decode step's kernels of our own, in C++ called through ``jax.ffi``: its attention over
the cache (``cpu_attention.cc``, :func:`attend`) and its greedy token (``cpu_argmax.cc``,
:func:`argmax`).

XLA:CPU takes a decode step's attention products as a library call per (batch row, K/V head):
hundreds of tiny matrix products a step, at a fraction of the machine's memory bandwidth, slower
still on an int8 cache (docs/results/decoding.md). The attention kernel reads each K/V head's cache
once, in order, for all G query heads of its group, and only the keys the mask shows. Its math is
``attention.grouped_attention``'s for one query position (the tests compare the two). XLA:CPU's
argmax over the step's ``[V, B]`` logits (the out-major output layer's) takes several times as long
as reading them; the argmax kernel reads them once.

They are compiled on first use, into one library, with the C++ compiler ``$CXX`` (else ``g++``)
for this machine (``-march=native``), into ``$GQA_JAX_KERNEL_DIR`` (else
``$XDG_CACHE_HOME/gqa_jax``, else ``~/.cache/gqa_jax``), named by a hash of the sources, flags,
jaxlib version and CPU, so a second process loads it. Where it cannot be built (no compiler)
decoding says so once and takes XLA's products and reductions, with the same tokens.

``attention.Attention.attend`` asks :func:`takes` under the ``"cpu"`` decode kernel
(``config.KERNELS``); ``cpu_step.argmax`` asks :func:`argmax_takes`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

from gqa_jax import kv_quant
from gqa_jax.log import log_once

Array = jax.Array

HERE = Path(__file__).parent
SOURCES = (HERE / "cpu_attention.cc", HERE / "cpu_argmax.cc")  # one library
HEADERS = (HERE / "cpu_vectors.h",)
FLAGS = ("-O3", "-march=native", "-ffast-math", "-std=c++17", "-shared", "-fPIC", "-w")
HEAD_DIM_MULTIPLE, HEAD_DIM_MAX = 16, 128  # the head dims the kernel takes: 16, 32, ..., 128
TARGETS = {"float32": "gqa_jax_cpu_attention_f32", "int8": "gqa_jax_cpu_attention_s8"}  # the attention's
ARGMAX_TARGET = "gqa_jax_cpu_argmax"
KERNEL_DIR_ENV = "GQA_JAX_KERNEL_DIR"  # where the compiled library goes (default: the user's cache)


class BuildError(RuntimeError):
    """The kernels could not be compiled or loaded; the message says why in one line."""


def _cpu_id() -> str:
    """What ``-march=native`` compiles for: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor() or platform.machine()


def library_path(directory: str | os.PathLike | None = None) -> Path:
    """Where the compiled kernels for these sources, compiler flags, jaxlib and CPU live: in
    ``directory``, else ``$GQA_JAX_KERNEL_DIR``, else ``$XDG_CACHE_HOME/gqa_jax`` (``~/.cache/gqa_jax``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = directory or os.environ.get(KERNEL_DIR_ENV) or os.path.join(cache, "gqa_jax")
    texts = [f.read_text() for f in (*SOURCES, *HEADERS)]
    what = [*texts, " ".join(FLAGS), importlib.metadata.version("jaxlib"), _cpu_id()]
    key = hashlib.sha256("\0".join(what).encode()).hexdigest()[:16]
    return Path(directory) / f"cpu_kernels-{key}.so"


def build(cxx: str | None = None, directory: str | os.PathLike | None = None) -> Path:
    """The compiled library's path, compiling it first if no process has (written under a temporary
    name, then renamed: two processes building at once each get a whole library)."""
    out = library_path(directory)
    if out.is_file():
        return out
    cxx = cxx or os.environ.get("CXX") or "g++"
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.stem, suffix=".so.tmp", dir=out.parent)
    os.close(fd)
    cmd = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", tmp]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        os.unlink(tmp)
        raise BuildError(f"{cxx} could not run ({e})") from None
    if done.returncode:
        os.unlink(tmp)
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BuildError(f"{cxx} failed (exit {done.returncode}): {last}")
    os.replace(tmp, out)
    return out


@functools.cache
def available() -> bool:
    """Whether the kernels are built and registered with XLA in this process (once; a failure is
    logged once, and decoding takes XLA's products and reductions)."""
    try:
        lib = ctypes.cdll.LoadLibrary(str(build()))
        symbols = {
            TARGETS["float32"]: lib.GqaAttendF32,
            TARGETS["int8"]: lib.GqaAttendS8,
            ARGMAX_TARGET: lib.GqaArgmax,
        }
        for target, symbol in symbols.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol), platform="cpu")
    except (BuildError, OSError, AttributeError) as e:
        log_once(
            "cpu_kernels",
            f"gqa_jax: the CPU decode kernels are not available ({e}); decoding takes XLA's "
            "products (set CXX to a C++17 compiler to build them)",
        )
        return False
    return True


def _require() -> None:
    """:class:`BuildError` unless the kernels are built (their build failure is logged once)."""
    if not available():
        raise BuildError("the CPU decode kernels are not available (their build failure is logged above)")


def _cache_dtype(k: Array | kv_quant.QuantizedKV) -> str:
    return (k.values if isinstance(k, kv_quant.QuantizedKV) else k).dtype.name


def takes(q: Array, k: Array | kv_quant.QuantizedKV) -> bool:
    """Whether :func:`attend` takes this attention: one query position (a decode step), float32
    queries, a float32 or int8 cache, a head dim of 16, 32, ..., 128, and the kernels built."""
    T, H = q.shape[1], q.shape[-1]
    return (
        T == 1
        and q.dtype == jnp.float32
        and _cache_dtype(k) in TARGETS
        and H % HEAD_DIM_MULTIPLE == 0
        and H <= HEAD_DIM_MAX
        and available()
    )


def attend(
    q: Array,
    k: Array | kv_quant.QuantizedKV,
    v: Array | kv_quant.QuantizedKV,
    *,
    bias: Array | None = None,
    mask: Array | None = None,
) -> Array:
    """``grouped_attention(q, k, v, bias=bias, mask=mask)`` for one query position, by the kernel.

    Args:
      q: ``[B, 1, N, H]`` float32 queries.
      k, v: ``[B, K, S, H]`` float32, or int8 ``kv_quant.QuantizedKV`` (scales ``[B, K, S, 1]``).
      bias: ``[N, 1, S]`` or ``[B, N, 1, S]`` additive logit bias per query head.
      mask: boolean, broadcastable to ``[B, 1, S]``; False hides the key.
    Returns:
      ``[B, 1, N, H]`` float32.
    """
    _require()
    B, T, N, H = q.shape
    S = k.shape[2]
    if isinstance(k, kv_quant.QuantizedKV):  # scales [B, K, S, 1] -> [B, K, S]
        k, ks, v, vs = k.values, k.scale[..., 0], v.values, v.scale[..., 0]
    else:
        ks = vs = jnp.zeros((0,), jnp.float32)
    b = jnp.zeros((0, N, S), jnp.float32) if bias is None else bias.astype(jnp.float32).reshape(-1, N, S)
    m = jnp.zeros((0, S), bool) if mask is None else jnp.broadcast_to(mask, (B, T, S)).reshape(B, S)
    call = jax.ffi.ffi_call(
        TARGETS[k.dtype.name], jax.ShapeDtypeStruct((B, N, H), jnp.float32), vmap_method="sequential"
    )
    return call(q.reshape(B, N, H), k, v, ks, vs, b, m).reshape(B, T, N, H)


def argmax_takes(by_token: Array) -> bool:
    """Whether :func:`argmax` takes these ``[V, B]`` logits: float32, ``B`` a multiple of 16 or a
    divisor of 16 (whole vectors of 16 lanes; other batches' last rows go one at a time, no faster
    than XLA's reductions), and the kernels built."""
    B = by_token.shape[1]
    return by_token.dtype == jnp.float32 and (B % 16 == 0 or 16 % B == 0) and available()


def argmax(by_token: Array) -> Array:
    """``jnp.argmax(by_token, 0)`` by the kernel: for each column of ``[V, B]`` float32 logits, the
    first index of its largest value, or of its first NaN; ``[B]`` int32."""
    _require()
    call = jax.ffi.ffi_call(
        ARGMAX_TARGET, jax.ShapeDtypeStruct(by_token.shape[1:], jnp.int32), vmap_method="sequential"
    )
    return call(by_token)
