"""A lock file one process holds: ``lock.json`` with the holder's host, pid, boot id, command,
start time and a heartbeat it refreshes every ``HEARTBEAT_S`` seconds, for a train run's workdir
(``training.lock``) and a sweep runner's root (``experiments.locks``).

A lock is stale, and is taken over with a message, when its holder is gone: on this host, when
its pid no longer runs (or the host has rebooted since); from another host, when its heartbeat
is older than ``STALE_AFTER_S``. An unreadable one is stale too, and is kept beside the new one
as ``lock.json.unreadable-<time>`` (``gqa_jax.unreadable``). On a local disk the file is created
atomically (``O_EXCL``); on gs:// it is checked and then written (an object store has no
exclusive create here), so two starts within the same second could both pass.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gqa_jax import paths, unreadable
from gqa_jax.errors import RunError

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


def holder_text(holder: dict[str, Any]) -> str:
    """``pid 123 on host (started 2026-12-06 12:00:00: python -m gqa_jax ...)``."""
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started", 0))))
    return (
        f"pid {holder.get('pid')} on {holder.get('host')} (started {started}: {holder.get('command', '?')})"
    )


def _readable(holder: Any) -> bool:
    return isinstance(holder, dict) and {"host", "pid", "heartbeat"} <= set(holder)


def stale_reason(holder: Any, now: float | None = None) -> str | None:
    """Why the lock ``holder`` (the parsed lock file) no longer holds, or None while it does."""
    now = time.time() if now is None else now
    if not _readable(holder):
        return "the lock file is unreadable"
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
                if read(self.file) != self.record:
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
            if read(self.file) == self.record:
                self.file.unlink()
        except OSError:  # left behind, the lock is stale (its pid is gone): the next run takes it over
            return


def read(file: Any) -> Any:
    """The parsed lock file; None when it cannot be parsed (being written, or cut short)."""
    try:
        return json.loads(file.read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):  # gone, or cut short
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
        return read(file) == record
    try:
        fd = os.open(os.fspath(file), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


def acquire(
    file: Any, in_use: Callable[[str], str], contended: str, log: Callable[[str], Any] = print
) -> Lock:
    """Take the lock ``file`` (this process only). Held by a live holder: a RunError
    ``in_use(holder_text)``; taken by others on every try: a RunError ending ``contended``."""
    now = time.time()
    record = {
        "host": socket.gethostname(), "pid": os.getpid(), "boot_id": _boot_id(),
        "command": " ".join(sys.argv), "started": now, "heartbeat": now,
    }  # fmt: skip
    for _ in range(3):
        if _create(file, record):
            return Lock(file, record)
        holder = read(file)
        if holder is None and time.time() - now < 2:
            time.sleep(0.2)  # a lock being written right now: read it again
            holder = read(file)
        why = stale_reason(holder)
        if why is None:
            raise RunError(in_use(holder_text(holder)))
        try:  # one of several starts that see the same stale lock moves it
            if _readable(holder):
                log(f"taking over the stale lock {file} ({why})")
                aside = file.with_name(f"{file.name}.stale-{os.getpid()}")
                paths.move(file, aside)
                aside.unlink()
            else:  # kept, as every unreadable file is
                kept = unreadable.set_aside(file)
                log(f"taking over the stale lock {file} ({why}): set it aside as {kept.name}")
        except OSError:
            pass
    raise RunError(f"could not take the lock {file}: {contended}")
