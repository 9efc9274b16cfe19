"""The MHA -> GQA / MQA conversion methods, one registry: every method the code knows is listed
in :data:`METHODS` below, and everything that names methods derives from it (``convert
--method``'s choices and help, ``uptrain.method``'s validation, the Fig. 4 sweeps' ``methods``
lists, the docs' table, checked by a test). ``gqa_jax.convert`` applies a method to a checkpoint.

Adding a method: one module here defining a :class:`~gqa_jax.conversion.method.Method` (what it
receives and returns is in ``method.py``), its line in :data:`METHODS`, its test, its row in
docs/checkpoints.md.

Variants: a method that ``calibrates`` can be named ``<name>-calibrated`` where a sweep lists
methods: that method calibrated on some batches of data (``gqa_jax.calibration``).
"""

from __future__ import annotations

from gqa_jax.conversion.aligned import ALIGNED
from gqa_jax.conversion.grouped import GROUPED
from gqa_jax.conversion.medoid import MEDOID
from gqa_jax.conversion.method import Merged, Method, Stack
from gqa_jax.conversion.pooling import FIRST, MEAN, RANDOM
from gqa_jax.conversion.svd import SVD

METHODS: tuple[Method, ...] = (MEAN, FIRST, RANDOM, GROUPED, ALIGNED, SVD, MEDOID)
BY_NAME: dict[str, Method] = {m.name: m for m in METHODS}
CALIBRATED_SUFFIX = "-calibrated"

__all__ = ["BY_NAME", "CALIBRATED_SUFFIX", "METHODS", "Merged", "Method", "Stack", "calibrated",
           "check_calibrates", "get", "names", "paper", "variant", "variants"]  # fmt: skip


def names() -> tuple[str, ...]:
    """Every method's name, in the registry's order."""
    return tuple(BY_NAME)


def calibrated() -> tuple[str, ...]:
    """The methods that can use calibration statistics."""
    return tuple(m.name for m in METHODS if m.calibrates)


def paper() -> tuple[str, ...]:
    """The paper's methods (its Fig. 4: mean, first, random)."""
    return tuple(m.name for m in METHODS if m.paper)


def get(name: str) -> Method:
    """The method called ``name``; a ValueError naming the known ones otherwise."""
    if name not in BY_NAME:
        raise ValueError(f"unknown conversion method {name!r}; known: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def check_calibrates(name: str) -> Method:
    """The method ``name`` if it can use calibration statistics, else a ValueError saying which can."""
    method = get(name)
    if not method.calibrates:
        raise ValueError(
            f"calibration is used by method {' and '.join(calibrated())} only, not method={name!r}: choose "
            "one of those methods or drop the calibration"
        )
    return method


def variants() -> tuple[str, ...]:
    """Every name a sweep's method list may hold: each method, then ``<name>-calibrated`` for each
    method that calibrates."""
    return names() + tuple(n + CALIBRATED_SUFFIX for n in calibrated())


def variant(name: str) -> tuple[Method, bool]:
    """A sweep's method name as ``(method, calibrated)``: ``svd-calibrated`` -> ``(SVD, True)``;
    a ValueError for a name that is neither a method nor a calibrated variant of one."""
    if name.endswith(CALIBRATED_SUFFIX):
        return check_calibrates(name[: -len(CALIBRATED_SUFFIX)]), True
    return get(name), False
