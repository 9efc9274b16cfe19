"""The undo of a ``train`` start that fails before its first step.

``WorkdirJournal`` takes the workdir's lock (``gqa_jax.training.lock``) and remembers what the
workdir held when the run started. A start that fails before its first step (a bad checkpoint, out
of memory while compiling, a data error) is undone: the files and directories this start created
are removed, what it moved aside (an earlier run's metrics, an unreadable file) is moved back, the
config.json it replaced is restored and a workdir it created is removed again, so the corrected
command starts as if the failed one had never run. Nothing that was there before is deleted.
"""

from __future__ import annotations

import shutil
from typing import Any

import jax

from gqa_jax import paths
from gqa_jax.errors import RunError
from gqa_jax.training.lock import lock_workdir

# What a start may create at the top of a workdir (and so may remove again when it fails).
STARTED_FILES = frozenset(
    {"config.json", "model_config.json", "conversion.json", "calibration.npz", "checkpoints", "tensorboard",
     "metrics.jsonl", "decodes"}
)  # fmt: skip


def _names(directory: Any) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


class WorkdirJournal:
    """The workdir as this start found it, and its lock (taken here, dropped by ``release()``);
    ``rollback()`` puts the workdir back (process 0 writes)."""

    def __init__(self, workdir: Any) -> None:
        self.workdir = workdir
        self.is_main = jax.process_index() == 0
        if workdir.exists() and not workdir.is_dir():
            raise RunError(f"workdir {workdir} is a file, not a directory: give a directory path")
        self.created = not workdir.exists()
        if self.is_main:
            workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.held = lock_workdir(workdir)
        except BaseException:
            self.held, self.committed = None, False
            self.release()  # a workdir made just now is removed again
            raise
        self.before = _names(workdir)
        self.checkpoints_before = _names(workdir / "checkpoints")
        config = workdir / "config.json"
        self.config_bytes = config.read_bytes() if config.is_file() else None
        self.moved: list[tuple[Any, Any]] = []  # (from, to): moved aside by this start
        self.committed = False

    def move_aside(self, src: Any, dst: Any) -> None:
        """Move ``src`` to ``dst`` (moved back by ``rollback``); process 0 moves, the others wait."""
        if not self.is_main:
            return
        dst.parent.mkdir(parents=True, exist_ok=True)
        paths.move(src, dst)
        self.moved.append((src, dst))

    def rollback(self) -> None:
        """Undo this start: remove what it created, move back what it moved (over what it wrote in
        its place), restore config.json."""
        if not self.is_main or self.committed:
            return
        for src, dst in reversed(self.moved):
            if dst.exists():
                _remove(src)  # written by this start after the move
                paths.move(dst, src)
        for name in sorted(_names(self.workdir) - self.before):
            if name in STARTED_FILES:
                _remove(self.workdir / name)
        if "checkpoints" in self.before:
            for name in _names(self.workdir / "checkpoints") - self.checkpoints_before:
                _remove(self.workdir / "checkpoints" / name)
        if self.config_bytes is not None:
            paths.write_bytes_atomic(self.workdir / "config.json", self.config_bytes)
        for _src, dst in self.moved:  # the folders inside the workdir that held what was moved, now empty
            parent = dst.parent
            while parent != self.workdir and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent

    def release(self) -> None:
        """Drop the lock; a workdir this start created and left empty is removed."""
        if self.held is not None:
            self.held.release()
        if self.is_main and self.created and not self.committed and self.workdir.is_dir():
            if not any(self.workdir.iterdir()):
                self.workdir.rmdir()


def _remove(path: Any) -> None:
    if path.is_dir():
        if paths.is_remote(path):
            path.rmtree()
        else:
            shutil.rmtree(path)
    elif path.exists():
        path.unlink()
