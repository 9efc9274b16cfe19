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


def test_the_eta_costs_each_run_by_its_own_stages_mean():
    """A 600 s pre-training run done: the convert / time runs left are costed by their stages'
    means, not by it; a started run by what it has left; a stage with nothing done is counted."""
    t1, t2, c = R.time("t1", "tiny", 1, 16, 4), R.time("t2", "tiny", 1, 16, 4), R.convert("c", "src", 1)
    seconds = {"pretrain": [600.0], "convert": [30.0, 90.0], "time": [120.0]}
    assert runner.eta(seconds, [(c, 0.0), (t1, 0.0)]) == ", ETA 3.0 min for 2 more"  # 60 s + 120 s
    assert runner.eta(seconds, [(c, 0.0), (t1, 0.0)], jobs=2) == ", ETA 2.5 min for 2 more"  # time runs alone
    assert runner.eta(seconds, [(c, 50.0), (t2, 200.0)]) == ", ETA 0.2 min for 2 more"  # 10 s + 0 s left
    assert runner.eta({"pretrain": [600.0]}, [(c, 0.0), (t1, 0.0), (t2, 0.0)]) == (
        "; 1 convert, 2 time not timed yet"
    )
    assert (
        runner.eta({"time": [60.0]}, [(t1, 0.0), (c, 0.0)])
        == ", ETA 1.0 min for 1 more, 1 convert not timed yet"
    )
    assert runner.eta(seconds, []) == ""


def test_a_rerun_costs_the_eta_with_the_runs_done_before(tmp_path):
    """run.json's seconds (what the runner wrote when the run was done) seed a rerun's means."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / runner.RUN_FILE).write_text(json.dumps({"status": "done", "seconds": 42.5}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / runner.RUN_FILE).write_text("{not json")
    assert runner.recorded_seconds(tmp_path, "a") == 42.5
    assert runner.recorded_seconds(tmp_path, "b") is None and runner.recorded_seconds(tmp_path, "c") is None


def test_local_runs_share_a_compilation_cache_in_the_root_unless_one_is_set(tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    env = runner.child_env(tmp_path, "local")
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / runner.CACHE_DIR)
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0.5"
    assert "JAX_COMPILATION_CACHE_DIR" not in runner.child_env(tmp_path, "tpu")  # local runs only
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    assert runner.child_env(tmp_path, "local")["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "mine")
