"""Clean stops: SIGINT (Ctrl-C) and SIGTERM (a scheduler's preemption notice) end a run at the
next step boundary, with a checkpoint of that step, instead of killing it mid-write.

``StopSignals`` replaces both handlers while a run trains. The first signal only asks: the loop
finishes the step (or evaluation) it is in, saves a checkpoint, waits for every save in flight
and raises ``Stopped``, which the command line prints as one line ("stopped at step N ... resume
with the same command", exit code 128 + the signal's number). A second SIGINT abandons at once
(``KeyboardInterrupt``; the checkpoints already complete are kept, a half-written one is left as
orbax's temporary directory and removed by the next run). In a multi-host run every process
learns at each step whether any of them was asked to stop, so all of them save the same step.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from gqa_jax.errors import Stopped
from gqa_jax.log import log

__all__ = ["StopSignals", "Stopped"]


class StopSignals:
    """Context manager: while inside, SIGINT / SIGTERM set ``requested()`` instead of killing.

    Outside the main thread (where Python cannot install handlers) it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: abandon now
        if self.signum is None:
            log(f"{signal.Signals(signum).name}: stopping after this step with a checkpoint "
                "(Ctrl-C again to abandon it)")  # fmt: skip
        self.signum = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()

    def requested(self) -> int | None:
        """The signal that asked for a stop (on any process of a multi-host run), or None."""
        mine = self.signum or 0
        if jax.process_count() > 1:
            gathered = np.asarray(multihost_utils.process_allgather(np.asarray(mine, np.int32)))
            mine = int(gathered.max())
        return mine or None
