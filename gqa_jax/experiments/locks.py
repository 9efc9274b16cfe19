"""The runner's two locks: one runner per sweep root, and a timed run alone on this machine.

``RootLock``: ``ROOT/lock.json`` (the runner's host, pid, boot id, command, start time and a
heartbeat it refreshes every ``HEARTBEAT_S`` seconds), created atomically (``O_EXCL``) before the
runner reads or writes anything under the root. A second runner on the same root is refused with
a line naming the holder. A lock is stale, and is taken over with a message, when its holder is
gone: on this host, when its pid no longer runs (or the host has rebooted since); from another
host, when its heartbeat is older than ``STALE_AFTER_S``.

``TimeGate``: runners on this machine (on any roots) share a reader-writer lock, two
``flock`` files under the user's cache directory (``$XDG_CACHE_HOME/gqa_jax``, else
``~/.cache/gqa_jax``; one pair per host name, so a home shared between machines does not couple
them). A runner holds the lock shared while it runs anything, and a timed run holds it alone: it
waits until the other runners' runs have ended, and they start nothing new until it has ended.
The kernel drops a ``flock`` when its process dies, so a killed runner leaves no stale lock.
Processes that no runner started (a ``train`` by hand) are not covered.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gqa_jax.errors import RunError

LOCK_FILE = "lock.json"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
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


def _read(file: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return None


def holder_text(holder: dict[str, Any]) -> str:
    """``pid 123 on host (started 2024-05-01 12:00:00: python -m gqa_jax sweep ...)``."""
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started", 0))))
    pid, host = holder.get("pid"), holder.get("host")
    return f"pid {pid} on {host} (started {started}: {holder.get('command', '?')})"


def _stale_reason(holder: Any) -> str | None:
    """Why the lock ``holder`` (the parsed lock file) no longer holds, or None while it does."""
    if not isinstance(holder, dict) or not {"host", "pid", "heartbeat"} <= set(holder):
        return "the lock file is unreadable (its writer was killed while writing it)"
    if holder["host"] == socket.gethostname():
        if holder.get("boot_id") and holder["boot_id"] != _boot_id():
            return "this host has rebooted since"
        return None if _pid_runs(int(holder["pid"])) else f"pid {holder['pid']} no longer runs"
    age = time.time() - float(holder["heartbeat"])
    return f"its heartbeat is {age:.0f} s old" if age > STALE_AFTER_S else None


def held_by(root: Path) -> str | None:
    """Who holds ``root``'s lock now (``holder_text``), None when nobody does (or a stale lock)."""
    holder = _read(root / LOCK_FILE)
    return holder_text(holder) if holder is not None and _stale_reason(holder) is None else None


class RootLock:
    """A held ``ROOT/lock.json``; ``release()`` removes it (only while it is still this runner's)."""

    def __init__(self, file: Path, record: dict[str, Any]) -> None:
        self.file, self.record = file, record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="gqa_jax-root-lock", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(cls, root: Path, log: Any = print) -> RootLock:
        """Take ``root``'s lock (creating ``root``); a RunError naming the holder when it is held."""
        root.mkdir(parents=True, exist_ok=True)
        file, now = root / LOCK_FILE, time.time()
        record = {"host": socket.gethostname(), "pid": os.getpid(), "boot_id": _boot_id(),
                  "command": " ".join(sys.argv), "started": now, "heartbeat": now}  # fmt: skip
        for _ in range(3):
            if _create(file, record):
                return cls(file, record)
            holder = _read(file)
            if holder is None and time.time() - now < 2:
                time.sleep(0.2)  # a lock being written right now: read it again
                holder = _read(file)
            why = _stale_reason(holder)
            if why is None:
                raise RunError(
                    f"sweep root {root} is in use by another runner: {holder_text(holder)}; wait for it to "
                    f"end or stop it (if that process is gone for good, delete {file})"
                )
            log(f"taking over the stale lock {file} ({why})")
            aside = file.with_name(f"{file.name}.stale-{os.getpid()}")
            try:
                os.replace(file, aside)  # one of several runners that see the same stale lock moves it
                aside.unlink()
            except OSError:
                pass
        raise RunError(f"could not take the lock {file}: other runners keep taking it")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if _read(self.file) != self.record:
                    return  # no longer ours (removed by hand): never write over someone else's
                beat = self.record | {"heartbeat": time.time()}
                tmp = self.file.with_name(f"{self.file.name}.tmp-{os.getpid()}")
                tmp.write_text(json.dumps(beat) + "\n")
                os.replace(tmp, self.file)
                self.record = beat
            except OSError:
                continue  # a missed heartbeat; the next one tries again

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if _read(self.file) == self.record:
            try:
                self.file.unlink()
            except OSError:  # left behind it is stale (its pid is gone): the next runner takes it over
                pass


def _create(file: Path, record: dict[str, Any]) -> bool:
    """Create ``file`` holding ``record`` unless it exists; whether this call created it."""
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record) + "\n")
    return True


def time_lock_dir() -> Path:
    """Where this machine's runners keep their time lock: ``$XDG_CACHE_HOME/gqa_jax``, else
    ``~/.cache/gqa_jax``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "gqa_jax"


class TimeGate:
    """This runner's side of the machine's time lock (see the module docstring).

    ``may_start(exclusive)`` takes what a run needs to start now (shared, or alone for a timed
    run) and says whether it did; ``idle()`` gives it back once the runner runs nothing;
    ``waiting_for`` says what a refusal waits for."""

    def __init__(self, directory: Path | None = None) -> None:
        directory = directory or time_lock_dir()
        directory.mkdir(parents=True, exist_ok=True)
        stem = directory / f"time-{socket.gethostname()}"
        # room: shared by every runner that runs something, held alone by a timed run; want: held
        # by a runner waiting to time, so that the others start nothing new meanwhile.
        self._room = os.open(f"{stem}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        self._want = os.open(f"{stem}.want", os.O_RDWR | os.O_CREAT, 0o644)
        self._held: int | None = None  # fcntl.LOCK_SH / LOCK_EX on the room, None when not held
        self._wanting = False
        self.waiting_for = ""

    def may_start(self, exclusive: bool) -> bool:
        if exclusive:
            return self._start_alone()
        if self._held == fcntl.LOCK_EX:
            return False  # a timed run of ours runs: nothing beside it
        if not _try(self._want, fcntl.LOCK_SH):
            self.waiting_for = "a timed run of another sweep runner on this machine (it runs alone)"
            return False
        fcntl.flock(self._want, fcntl.LOCK_UN)
        if self._held is None and not _try(self._room, fcntl.LOCK_SH):
            self.waiting_for = "a timed run of another sweep runner on this machine (it runs alone)"
            return False
        self._held = fcntl.LOCK_SH
        return True

    def _start_alone(self) -> bool:
        if not self._wanting:
            if not _try(self._want, fcntl.LOCK_EX):
                self.waiting_for = "another sweep runner on this machine, which times a run first"
                return False
            self._wanting = True
        if self._held is not None:
            fcntl.flock(self._room, fcntl.LOCK_UN)  # ours is idle here: the caller runs nothing
            self._held = None
        if not _try(self._room, fcntl.LOCK_EX):
            self.waiting_for = "the runs of other sweep runners on this machine (a timed run runs alone)"
            return False
        self._held = fcntl.LOCK_EX
        return True

    def idle(self) -> None:
        """This runner runs nothing now: let the others' runs (or timed runs) start."""
        for fd, held in ((self._room, self._held is not None), (self._want, self._wanting)):
            if held:
                fcntl.flock(fd, fcntl.LOCK_UN)
        self._held, self._wanting = None, False

    def close(self) -> None:
        self.idle()
        os.close(self._room)
        os.close(self._want)


def _try(fd: int, how: int) -> bool:
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
