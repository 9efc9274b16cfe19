"""The sweep runner's fork server: a forked run leads a session of its own, writes its log, reports
its exit code or the signal that ended it, and dies with the server."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from gqa_jax.experiments import forks, scheduler
from gqa_jax.experiments import runs as R

REPO = Path(__file__).resolve().parents[1]


def _ended(child: forks.Forked, timeout: float = 60.0) -> int:
    deadline = time.time() + timeout
    while child.poll() is None:
        assert time.time() < deadline, f"pid {child.pid} still runs"
        time.sleep(0.02)
    return child.returncode


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _session(child: forks.Forked, timeout: float = 60.0) -> None:
    """Until the child leads its own session (it calls setsid first thing)."""
    deadline = time.time() + timeout
    while os.getsid(child.pid) != child.pid:
        assert time.time() < deadline, f"pid {child.pid} never left the server's session"
        time.sleep(0.01)


def test_a_forked_run_logs_its_exit_code_takes_its_groups_signal_and_dies_with_the_server(tmp_path):
    server = forks.Server(dict(os.environ), REPO)
    slow = R.time("u", "tiny", 1, 16, 4, batch=2, runs=100_000)  # runs until signalled
    try:
        failing = [sys.executable, "-m", "gqa_jax", "convert", "--src", str(tmp_path / "none"), "--dst",
                   str(tmp_path / "c" / "model"), "--num-kv-heads", "1", "--method", "mean"]  # fmt: skip
        assert server.serves(failing) and not server.serves(["python3.0", *failing[1:]])
        bad = server.start(failing, str(tmp_path / "bad.txt"))
        assert _ended(bad) == 2
        assert "python -m gqa_jax convert: error: " in (tmp_path / "bad.txt").read_text()

        for signum in (signal.SIGTERM, signal.SIGKILL):  # to the process group, as the runner sends
            child = server.start(scheduler.full_command(slow, tmp_path), str(tmp_path / f"{signum}.txt"))
            _session(child)
            os.killpg(child.pid, signum)
            assert _ended(child) == -signum

        orphan = server.start(scheduler.full_command(slow, tmp_path), str(tmp_path / "orphan.txt"))
        _session(orphan)
        server._proc.kill()  # the server dies (as it does when the runner dies): so does its child
        assert _ended(orphan) == -signal.SIGKILL
        deadline = time.time() + 30
        while _alive(orphan.pid) and time.time() < deadline:
            time.sleep(0.02)
        assert not _alive(orphan.pid)
    finally:
        server.close()
