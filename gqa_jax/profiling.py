"""Profiles of chosen steps: a ``jax.profiler`` trace that TensorBoard's profile plugin and XProf open.

``StepTrace(logdir, steps)`` traces the steps ``A:B`` (both included) of a loop that calls
``before(step)`` and ``after(step)`` around each step; ``jax.profiler`` writes
``LOGDIR/plugins/profile/<time>/<host>.xplane.pb``, the layout ``tensorboard --logdir LOGDIR``
(with ``tensorboard-plugin-profile`` installed) and ``xprof --logdir LOGDIR`` read. A run's
``LOGDIR`` is its TensorBoard folder, so its trace sits beside its scalars.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax


def parse_steps(spec: str | None, flag: str) -> tuple[int, int] | None:
    """``"A:B"`` -> ``(A, B)`` (``"A"`` alone: that one step); None or ``""``: no trace. A bad spec
    is a one-line error naming ``flag``."""
    if spec is None or spec == "":
        return None
    first, _, last = str(spec).partition(":")
    try:
        steps = (int(first), int(last or first))
    except ValueError:
        raise ValueError(f"{flag}={spec!r}: give the steps to trace as A:B (e.g. 5:7) or A") from None
    if steps[0] < 0 or steps[1] < steps[0]:
        raise ValueError(f"{flag}={spec!r}: steps A:B need 0 <= A <= B")
    return steps


def trace_files(logdir: str | os.PathLike) -> list[Path]:
    """The traces under ``logdir``, oldest first."""
    return sorted(Path(logdir).glob("plugins/profile/*/*.xplane.pb"), key=os.path.getmtime)


class StepTrace:
    """Traces steps ``steps = (A, B)`` of a loop into ``logdir`` (nothing when ``steps`` is None)."""

    def __init__(self, logdir: str | os.PathLike, steps: tuple[int, int] | None):
        self.logdir, self.steps, self.running = Path(logdir), steps, False

    def before(self, step: int) -> None:
        if self.steps is not None and step == self.steps[0] and not self.running:
            self.logdir.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.logdir))
            self.running = True

    def after(self, step: int, result: object = None) -> None:
        """Ends the trace after step B, once ``result`` (the step's output) is computed."""
        if self.running and step >= self.steps[1]:
            jax.block_until_ready(result)
            self.close()

    def close(self) -> None:
        """Ends a trace still running (a loop that stopped before step B, or an error)."""
        if self.running:
            self.running = False
            jax.profiler.stop_trace()
