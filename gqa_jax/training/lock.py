"""One run per workdir: the lock a ``train`` run takes before it writes anything.

The lock is ``<workdir>/lock.json`` (``gqa_jax.file_lock``: the holder named, a stale one taken
over). A second run on the same workdir is refused with a line naming the holder. A multi-host
run locks once, on process 0, and every process learns whether it got the lock.

``gqa_jax.training.journal`` takes this lock and undoes a start that fails before its first step.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from gqa_jax import file_lock
from gqa_jax.errors import RunError
from gqa_jax.file_lock import LOCK_FILE, Lock
from gqa_jax.log import log

__all__ = ["LOCK_FILE", "Lock", "lock_workdir"]


def _acquire(workdir: Any) -> Lock:
    """Take ``workdir``'s lock (this process only); a RunError naming the holder when it is held."""
    file = workdir / LOCK_FILE
    return file_lock.acquire(
        file,
        lambda holder: (
            f"workdir {workdir} is in use by {holder}; wait for that run to end or stop it, or use another "
            f"--workdir (if that process is gone for good, delete {file})"
        ),
        "other runs keep taking it; use another --workdir",
        log,
    )


def lock_workdir(workdir: Any) -> Lock | None:
    """Process 0 takes ``workdir``'s lock (its ``Lock``; None on the other processes); every process
    raises the same RunError when it could not."""
    lock, error = None, None
    if jax.process_index() == 0:
        try:
            lock = _acquire(workdir)
        except RunError as e:
            error = e
    if jax.process_count() > 1:
        ok = np.asarray(multihost_utils.process_allgather(np.asarray(error is None, np.int32)))
        if not ok.all() and error is None:
            error = RunError(f"process 0 could not lock {workdir}: its log says why")
    if error is not None:
        raise error
    return lock
