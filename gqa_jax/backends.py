"""The backends a process starts: with libtpu installed for ``plan --topology`` (the TPU compiler on
a CPU host) but no TPU attached, JAX would still load libtpu to look for one when it starts its
backends, printing libtpu's warnings about the missing TPU environment on every CPU run. Where no
TPU chip and no NVIDIA GPU is on the PCI bus and ``JAX_PLATFORMS`` is unset, :func:`skip_absent_tpu`
sets JAX's platforms to the CPU, the backend JAX would have chosen there anyway. ``plan
--topology`` loads libtpu itself, for its compiler only (``tools.tpu_topology``)."""

from __future__ import annotations

import importlib.util
import os

import jax


def _present(check: str) -> bool:
    """JAX's own PCI checks (``jax._src.hardware_utils``); when they cannot be asked, present."""
    try:
        from jax._src import hardware_utils

        if check == "tpu":
            return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
        return bool(hardware_utils.has_visible_nvidia_gpu())
    except Exception:
        return True


def skip_absent_tpu() -> bool:
    """Start the CPU backend only, when libtpu is installed but no TPU (and no NVIDIA GPU) is
    attached and the user chose no platforms; True when it did."""
    if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms:
        return False
    if importlib.util.find_spec("libtpu") is None or _present("tpu") or _present("gpu"):
        return False
    jax.config.update("jax_platforms", "cpu")
    return True
