"""TPU slices without a TPU: the devices of a named slice, from libtpu's compiler on this host.

``slice_devices("v4:2x4x4")`` asks libtpu for the slice's topology
(``jax.experimental.topologies.get_topology_desc``): its devices can build a ``Mesh``, and
``jax.jit(f).lower(<ShapeDtypeStructs with NamedShardings on that mesh>).compile()`` then runs the
TPU compiler and returns a TPU executable's ``memory_analysis()`` and ``cost_analysis()``, with no
TPU attached. Nothing here runs a program. libtpu is optional (``requirements-tpu.txt``); it writes
warnings about the missing TPU environment (``TPU_ACCELERATOR_TYPE``, ``TPU_WORKER_HOSTNAMES``) when
it loads, kept off the terminal (``log.native_noise_off_the_terminal``), and compiles anyway.

Names are libtpu's, ``GENERATION:AxBxC`` in chips: ``v4:2x2x2`` (8 chips, the paper's timing
setup), ``v4:2x4x4`` (32), ``v4:4x4x4`` (64), ``v5e:2x4`` (8), ``v5p:2x2x1`` (4). A v4 chip has two
TensorCores that JAX drives as one device (megacore), so a v4 slice has one device per chip, as on
a real v4 host; v5e and v5p chips are one device each.

The chips' documented numbers (``CHIPS``, per chip, from Cloud TPU's documentation pages:
``Chip.source``): the HBM a plan compares against, and the bf16 peak and HBM bandwidth.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import re
from typing import Any

from gqa_jax.errors import RunError
from gqa_jax.log import native_noise_off_the_terminal

INSTALL = "pip install -r requirements-tpu.txt"


@dataclasses.dataclass(frozen=True)
class Chip:
    """One chip of a TPU generation, as its documentation gives it."""

    generation: str
    device_kind: str  # what jax calls its devices
    hbm_gib: float
    peak_bf16_flops: float  # per second
    hbm_bytes_per_s: float
    dims: int  # the topology's dimensions: AxB (2) or AxBxC (3)
    source: str


CHIPS: dict[str, Chip] = {
    # 275 teraflops (bf16 or int8); HBM2 32 GiB, 1200 GBps
    "v4": Chip("v4", "TPU v4", 32.0, 275e12, 1200e9, 3, "https://cloud.google.com/tpu/docs/v4"),
    # 197 TFLOPs (bf16); HBM2 16 GB, 819 GBps
    "v5e": Chip("v5e", "TPU v5 lite", 16.0, 197e12, 819e9, 2, "https://cloud.google.com/tpu/docs/v5e"),
    # 459 TFLOPs (bf16); HBM2e 95 GB, 2765 GBps
    "v5p": Chip("v5p", "TPU v5", 95.0, 459e12, 2765e9, 3, "https://cloud.google.com/tpu/docs/v5p"),
}
_MEGACORE = ("v4",)  # two TensorCores driven as one device


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    """A named slice: its chip and its devices (one per chip), in libtpu's order."""

    name: str
    chip: Chip
    shape: tuple[int, ...]
    devices: tuple[Any, ...]

    @property
    def chips(self) -> int:
        return math.prod(self.shape)


def parse_topology(name: str) -> tuple[Chip, tuple[int, ...]]:
    """``"v4:2x4x4"`` -> (the v4 chip, (2, 4, 4)), or one clear error naming what is wrong."""
    found = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+)+)", name.strip().lower())
    example = "e.g. v4:2x2x2 (8 chips), v4:2x4x4 (32), v5e:2x4 (8), v5p:2x2x1 (4)"
    if found is None:
        raise ValueError(f"TPU topology {name!r} is not GENERATION:AxBxC in chips ({example})")
    generation, dims = found.group(1), tuple(int(d) for d in found.group(2).split("x"))
    if generation not in CHIPS:
        raise ValueError(
            f"unknown TPU generation {generation!r} in topology {name!r}: choose from "
            f"{', '.join(CHIPS)} ({example})"
        )
    chip = CHIPS[generation]
    if len(dims) != chip.dims or min(dims) < 1:
        shape = "x".join(["A", "B", "C"][: chip.dims])
        raise ValueError(f"a {generation} topology has {chip.dims} dimensions, {shape} chips; got {name!r}")
    return chip, dims


def libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


@functools.lru_cache(maxsize=8)
def slice_devices(name: str) -> TpuSlice:
    """The devices of the TPU slice ``name``, from libtpu (no TPU needed): one clear error for a
    malformed or unknown name, libtpu missing, or a slice libtpu does not know."""
    chip, shape = parse_topology(name)
    if not libtpu_installed():
        raise RunError(f"--topology needs libtpu, the TPU compiler, which is not installed: {INSTALL}")
    from jax.experimental import topologies

    # it only compiles: several processes at once (the suite's workers) may each load libtpu
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    options = {"chip_config_name": "megacore"} if chip.generation in _MEGACORE else {}
    canonical = f"{chip.generation}:{'x'.join(map(str, shape))}"
    try:
        with native_noise_off_the_terminal():  # libtpu's warnings on load
            topology = topologies.get_topology_desc(topology_name=canonical, platform="tpu", **options)
    except Exception as err:  # libtpu's own error, one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"libtpu does not know the TPU topology {name!r}: {first}") from None
    tpu = TpuSlice(canonical, chip, shape, tuple(topology.devices))
    if len(tpu.devices) != tpu.chips:
        raise ValueError(
            f"libtpu gave {len(tpu.devices)} devices for {name!r}, expected one per chip "
            f"({tpu.chips}): this libtpu counts devices differently"
        )
    return tpu
