"""The runner's two locks: one runner per sweep root, and a timed run alone on this machine.

``lock_root``: ``ROOT/lock.json`` (``gqa_jax.file_lock``, as a train run locks its workdir: the
holder's host, pid, boot id, command, start time and heartbeat), taken before the runner reads or
writes anything under the root. A second runner on the same root is refused with a line naming
the holder; a stale lock (its holder gone) is taken over with a message.

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
import os
import socket
from pathlib import Path
from typing import Any

from gqa_jax import file_lock
from gqa_jax.file_lock import LOCK_FILE


def held_by(root: Path) -> str | None:
    """Who holds ``root``'s lock now (``file_lock.holder_text``), None when nobody does (or a stale
    lock)."""
    holder = file_lock.read(root / LOCK_FILE)
    live = holder is not None and file_lock.stale_reason(holder) is None
    return file_lock.holder_text(holder) if live else None


def lock_root(root: Path, log: Any = print) -> file_lock.Lock:
    """Take ``root``'s lock (creating ``root``); a RunError naming the holder when it is held."""
    root.mkdir(parents=True, exist_ok=True)
    file = root / LOCK_FILE
    return file_lock.acquire(
        file,
        lambda holder: (
            f"sweep root {root} is in use by another runner: {holder}; wait for it to end or stop it (if "
            f"that process is gone for good, delete {file})"
        ),
        "other runners keep taking it",
        log,
    )


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
