"""One run per workdir: the lock a ``train`` run takes before it writes anything.

The lock is ``<workdir>/lock.json``: the holder's host, pid, boot id, command, start time and a
heartbeat it refreshes every ``HEARTBEAT_S`` seconds. A second run on the same workdir is refused
with a line naming the holder. A lock is stale, and is taken over with a message, when its
holder is gone: on this host, when its pid no longer runs (or the host has rebooted since); from
another host, when its heartbeat is older than ``STALE_AFTER_S``. A multi-host run locks once, on
process 0, and every process learns whether it got the lock. On a local disk the lock file is
created atomically (``O_EXCL``); on gs:// it is checked and then written (an object store has no
exclusive create here), so two starts within the same second could both pass.

``gqa_jax.training.journal`` takes this lock and undoes a start that fails before its first step.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from gqa_jax import paths
from gqa_jax.errors import RunError
from gqa_jax.log import log

LOCK_FILE = "lock.json"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _holder_text(holder: dict[str, Any]) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started", 0))))
    return (
        f"pid {holder.get('pid')} on {holder.get('host')} (started {started}: {holder.get('command', '?')})"
    )


def _stale_reason(holder: Any, now: float | None = None) -> str | None:
    """Why the lock ``holder`` (the parsed lock file) no longer holds, or None while it does."""
    now = time.time() if now is None else now
    if not isinstance(holder, dict) or not {"host", "pid", "heartbeat"} <= set(holder):
        return "the lock file is unreadable (its writer was killed while writing it)"
    if holder["host"] == socket.gethostname():
        if holder.get("boot_id") and holder["boot_id"] != _boot_id():
            return "this host has rebooted since"
        if holder["pid"] == os.getpid():
            return None  # this process: another train() on the same workdir is still running
        return None if _pid_runs(int(holder["pid"])) else f"pid {holder['pid']} no longer runs"
    age = now - float(holder["heartbeat"])
    if age > STALE_AFTER_S:
        return f"its heartbeat is {age:.0f} s old (more than {STALE_AFTER_S:.0f} s)"
    return None


class Lock:
    """A held ``lock.json``: ``release()`` removes it (only if it is still this run's)."""

    def __init__(self, file: Any, record: dict[str, Any]) -> None:
        self.file, self.record = file, record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="gqa_jax-lock-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if _read(self.file) != self.record:
                    return  # no longer ours (removed by hand): never write over someone else's
                beat = self.record | {"heartbeat": time.time()}
                _write(self.file, beat)
                self.record = beat  # only once the file holds it
            except OSError:
                continue  # a missed heartbeat; the next one tries again

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            if _read(self.file) == self.record:
                self.file.unlink()
        except OSError:  # left behind, the lock is stale (its pid is gone): the next run takes it over
            return


def _read(file: Any) -> Any:
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _write(file: Any, record: dict[str, Any]) -> None:
    paths.write_text_atomic(file, json.dumps(record) + "\n")


def _create(file: Any, record: dict[str, Any]) -> bool:
    """Create ``file`` holding ``record`` unless it exists; whether this call created it."""
    text = json.dumps(record) + "\n"
    if paths.is_remote(file):
        if file.exists():
            return False
        file.write_text(text)
        return _read(file) == record
    try:
        fd = os.open(os.fspath(file), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


def _acquire(workdir: Any) -> Lock:
    """Take ``workdir``'s lock (this process only); a RunError naming the holder when it is held."""
    file = workdir / LOCK_FILE
    now = time.time()
    record = {
        "host": socket.gethostname(), "pid": os.getpid(), "boot_id": _boot_id(),
        "command": " ".join(sys.argv), "started": now, "heartbeat": now,
    }  # fmt: skip
    for _ in range(3):
        if _create(file, record):
            return Lock(file, record)
        holder = _read(file)
        if holder is None and time.time() - now < 2:
            time.sleep(0.2)  # a lock being written right now: read it again
            holder = _read(file)
        why = _stale_reason(holder)
        if why is None:
            raise RunError(
                f"workdir {workdir} is in use by {_holder_text(holder)}; wait for that run to end or stop "
                f"it, or use another --workdir (if that process is gone for good, delete {file})"
            )
        log(f"taking over the stale lock {file} ({why})")
        aside = file.with_name(f"{file.name}.stale-{os.getpid()}")
        try:
            paths.move(file, aside)  # one of several starts that see the same stale lock moves it
            aside.unlink()
        except OSError:
            pass
    raise RunError(f"could not take the lock {file}: other runs keep taking it; use another --workdir")


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
