"""Run a sweep: every run's command in dependency order, locally one after another or through
``scripts/launch_tpu.sh`` on every worker of a TPU VM pod.

Locally each run is a ``python -m gqa_jax ...`` subprocess writing ``ROOT/<name>/log.txt``; on exit
0 the runner writes ``ROOT/<name>/run.json`` with status ``done``. A rerun skips done runs and
starts the others again: an interrupted training run resumes from its checkpoints (its own
command does that), an interrupted convert / evaluate / time run is redone in its own directory.
A failed run stops its branch: every run that depends on it (directly or not) is not started, and
the runner prints the failing command and its log; the other branches go on. Killing the runner
kills the run it is waiting for (the child gets SIGKILL when its parent dies, on Linux).
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gqa_jax.experiments.paper import REPO
from gqa_jax.experiments.sweep import Run, Sweep, command, order

RUN_FILE = "run.json"
LOG_FILE = "log.txt"
LAUNCHERS = ("local", "tpu")


def status(root: Path, name: str) -> str | None:
    """A run's recorded status (``done`` / ``failed`` / ``running``), None when never started."""
    file = root / name / RUN_FILE
    try:
        return json.loads(file.read_text()).get("status")
    except (OSError, ValueError):
        return None


def full_command(run: Run, root: Path, launcher: str = "local", tpu: Sequence[str] = ()) -> list[str]:
    """The complete argv of ``run``: ``python -m gqa_jax ...`` locally; on a TPU pod the same
    command behind ``scripts/launch_tpu.sh [TPU OPTIONS] --``."""
    argv = [sys.executable if launcher == "local" else "python", "-m", "gqa_jax", *command(run, root)]
    if launcher == "tpu":
        return [str(REPO / "scripts" / "launch_tpu.sh"), *tpu, "--", *argv]
    return argv


def _write_status(root: Path, run: Run, argv: list[str], state: str, **fields: Any) -> None:
    directory = root / run.name
    directory.mkdir(parents=True, exist_ok=True)
    record = {"name": run.name, "stage": run.stage, "command": argv, "tags": dict(run.tags),
              "status": state, **fields}  # fmt: skip
    tmp = directory / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    tmp.replace(directory / RUN_FILE)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the runner dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _eta(seconds: list[float], left: int) -> str:
    if not seconds or not left:
        return ""
    eta = sum(seconds) / len(seconds) * left
    return f", ETA {eta / 60:.1f} min for {left} more"


def run_sweep(
    sweep: Sweep,
    root: str | os.PathLike,
    *,
    only: str | None = None,
    dry_run: bool = False,
    launcher: str = "local",
    tpu: Sequence[str] = (),
    log: Callable[[str], None] = print,
    out: Callable[[str], None] = print,
) -> int:
    """Run (or with ``dry_run`` print) ``sweep``'s runs under ``root``; returns 0 when every
    selected run is done, 1 when one failed or was blocked by a failure."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; choose from {', '.join(LAUNCHERS)}")
    root = Path(root).expanduser().absolute()
    if root.exists() and not root.is_dir():
        raise ValueError(f"--root {root} is a file, not a directory")
    runs = order(sweep, only)
    if dry_run:
        for r in runs:
            mark = "  # done" if status(root, r.name) == "done" else ""
            out(shlex.join(full_command(r, root, launcher, tpu)) + mark)
        return 0
    failed: dict[str, str] = {}  # run -> the failed run that stops it
    seconds: list[float] = []
    for i, r in enumerate(runs, 1):
        head = f"[{i}/{len(runs)}] {r.name} ({r.stage})"
        if status(root, r.name) == "done":
            log(f"{head}: done before, skipped")
            continue
        blocked = [failed[d] for d in r.deps if d in failed]
        if blocked:
            failed[r.name] = blocked[0]
            log(f"{head}: not run, its dependency {blocked[0]} failed")
            continue
        argv = full_command(r, root, launcher, tpu)
        (root / r.name).mkdir(parents=True, exist_ok=True)
        log_path = root / r.name / LOG_FILE
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        _write_status(root, r, argv, "running", started=started)
        log(f"{head}: running ... (log {log_path})")
        t0 = time.time()
        with open(log_path, "a") as f:
            f.write(f"\n$ {shlex.join(argv)}\n")
            f.flush()
            rc = subprocess.call(
                argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, preexec_fn=_die_with_parent
            )
        took = time.time() - t0
        if rc == 0:
            seconds.append(took)
            finished = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            _write_status(root, r, argv, "done", started=started, seconds=took, finished=finished)
            left = sum(1 for x in runs[i:] if status(root, x.name) != "done")
            log(f"{head}: done in {took:.0f} s{_eta(seconds, left)}")
        else:
            failed[r.name] = r.name
            _write_status(root, r, argv, "failed", started=started, seconds=took, returncode=rc,
                          log=str(log_path))  # fmt: skip
            log(f"{head}: FAILED (exit {rc}) after {took:.0f} s")
            log(f"  command: {shlex.join(argv)}\n  log: {log_path}")
    if failed:
        roots = sorted(set(failed.values()))
        log(f"sweep {sweep.name}: {len(failed)} run(s) not done because of {', '.join(roots)}; fix and rerun")
        return 1
    log(f"sweep {sweep.name}: every selected run is done ({len(runs)})")
    return 0
