"""The sweep runner (subprocesses): a failed dependency stops only its branch, with one or two runs
at a time. Every stage kind, SIGKILL and rerun: tests/test_mini.py (the mini sweep)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gqa_jax.experiments import runner
from gqa_jax.experiments import runs as R

REPO = Path(__file__).resolve().parents[1]

FAILING_SWEEP = """
from gqa_jax.experiments import runs as R
from gqa_jax.experiments.sweep import Sweep

PARAMS = {}


def get_sweep(params):
    return Sweep("failing", (
        R.convert("bad", "/no/such/checkpoint", 1),
        R.time("after_bad", "tiny", 1, 16, 4, batch=2, runs=1, deps=("bad",)),
        R.time("ok", "tiny", 1, 16, 4, batch=2, runs=1),
    ))
"""


def sweep_command(file: Path, root: Path, jobs: int = 1) -> list[str]:
    return [sys.executable, "-m", "gqa_jax", "sweep", str(file), "--root", str(root), "--jobs", str(jobs)]


def statuses(root: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text())["status"] for p in root.glob("*/run.json")}


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failed_dependency_stops_only_its_branch(tmp_path, jobs):
    file = tmp_path / "failing.py"
    file.write_text(FAILING_SWEEP)
    root = tmp_path / "root"
    out = subprocess.run(
        sweep_command(file, root, jobs), cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 1
    log = out.stderr
    assert "bad (convert): FAILED (exit" in log
    assert (
        f"log: {root / 'bad' / 'log.txt'}" in log
        and "command: " in log
        and "--src /no/such/checkpoint" in log
    )
    assert "/no/such/checkpoint" in (root / "bad" / "log.txt").read_text().split("\n$ ")[-1].split("\n", 1)[1]
    assert "after_bad (time): not run, its dependency bad failed" in log
    assert statuses(root) == {"bad": "failed", "ok": "done"}


def test_progress_counts_the_runs_done_per_stage():
    runs = [R.time("t1", "tiny", 1, 16, 4), R.convert("c", "src", 1), R.time("t2", "tiny", 1, 16, 4)]
    assert runner.stage_progress(runs, {"t1"}) == "convert 0/1, time 1/2"


def test_local_runs_share_a_compilation_cache_in_the_root_unless_one_is_set(tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    env = runner.child_env(tmp_path, "local")
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / runner.CACHE_DIR)
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0.5"
    assert "JAX_COMPILATION_CACHE_DIR" not in runner.child_env(tmp_path, "tpu")  # local runs only
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    assert runner.child_env(tmp_path, "local")["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "mine")
