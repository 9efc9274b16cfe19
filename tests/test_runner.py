"""The sweep runner (its runs in subprocesses): a failed dependency stops only its branch, with one
or two runs at a time. Every stage kind, SIGKILL and rerun: tests/test_mini.py (the mini sweep)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runner_fakes import mark_done, popen_leaving_outputs

from gqa_jax import __main__ as cli
from gqa_jax.experiments import runner, scheduler
from gqa_jax.experiments import runs as R
from gqa_jax.experiments.sweep import Sweep, load_sweep

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _time_lock_here(tmp_path, monkeypatch):
    """The machine's time lock (``locks.TimeGate``) in this test's directory, not the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


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


def statuses(root: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text())["status"] for p in root.glob("*/run.json")}


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failed_dependency_stops_only_its_branch(tmp_path, jobs, capsys, monkeypatch):
    file = tmp_path / "failing.py"
    file.write_text(FAILING_SWEEP)
    root = tmp_path / "root"
    if jobs == 2:  # fake children: the real ones ran with jobs=1 (the failing one prints its line)
        fail = {"bad": "python -m gqa_jax convert: error: source /no/such/checkpoint does not exist"}
        monkeypatch.setattr(scheduler, "_popen", popen_leaving_outputs([], load_sweep(file), fail=fail))
    # `python -m gqa_jax sweep` in this process (its runs in their own, as ever)
    assert cli.main(["sweep", str(file), "--root", str(root), "--jobs", str(jobs)]) == 1
    log = capsys.readouterr().err
    failed = next(line for line in log.splitlines() if "bad (convert): FAILED (exit 2)" in line)
    assert failed.split(" s: ", 1)[1].startswith("python -m gqa_jax convert: error: ")  # the child's own line
    assert (
        f"log: {root / 'bad' / 'log.txt'}" in log
        and "command: " in log
        and "--src /no/such/checkpoint" in log
    )
    assert "/no/such/checkpoint" in (root / "bad" / "log.txt").read_text().split("\n$ ")[-1].split("\n", 1)[1]
    assert "after_bad (time): not run, its dependency bad failed" in log
    assert statuses(root) == {"bad": "failed", "ok": "done"}
    assert json.loads((root / "bad" / "run.json").read_text())["error"] == failed.split(" s: ", 1)[1]
    assert not (root / "lock.json").exists() and list((tmp_path / "cache" / "gqa_jax").glob("time-*.lock"))


def test_progress_counts_the_runs_done_per_stage():
    runs = [R.time("t1", "tiny", 1, 16, 4), R.convert("c", "src", 1), R.time("t2", "tiny", 1, 16, 4)]
    assert scheduler.stage_progress(runs, {"t1"}) == "convert 0/1, time 1/2"


def test_the_eta_costs_each_run_by_its_own_stages_mean():
    """A 600 s pre-training run done: the convert / time runs left are costed by their stages'
    means, not by it; a started run by what it has left; a stage with nothing done is counted."""
    t1, t2, c = R.time("t1", "tiny", 1, 16, 4), R.time("t2", "tiny", 1, 16, 4), R.convert("c", "src", 1)
    seconds = {"pretrain": [600.0], "convert": [30.0, 90.0], "time": [120.0]}
    assert scheduler.eta(seconds, [(c, 0.0), (t1, 0.0)]) == ", ETA 3.0 min for 2 more"  # 60 s + 120 s
    assert (
        scheduler.eta(seconds, [(c, 0.0), (t1, 0.0)], jobs=2) == ", ETA 2.5 min for 2 more"
    )  # time runs alone
    assert scheduler.eta(seconds, [(c, 50.0), (t2, 200.0)]) == ", ETA 0.2 min for 2 more"  # 10 s + 0 s left
    assert scheduler.eta({"pretrain": [600.0]}, [(c, 0.0), (t1, 0.0), (t2, 0.0)]) == (
        "; 1 convert, 2 time not timed yet"
    )
    assert (
        scheduler.eta({"time": [60.0]}, [(t1, 0.0), (c, 0.0)])
        == ", ETA 1.0 min for 1 more, 1 convert not timed yet"
    )
    assert scheduler.eta(seconds, []) == ""


def test_a_rerun_costs_the_eta_with_the_runs_done_before(tmp_path):
    """run.json's seconds (what the runner wrote when the run was done) seed a rerun's means."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / scheduler.RUN_FILE).write_text(json.dumps({"status": "done", "seconds": 42.5}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / scheduler.RUN_FILE).write_text("{not json")
    assert scheduler.recorded_seconds(tmp_path, "a") == 42.5
    assert (
        scheduler.recorded_seconds(tmp_path, "b") is None
        and scheduler.recorded_seconds(tmp_path, "c") is None
    )


def test_local_runs_share_a_compilation_cache_in_the_root_unless_one_is_set(tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    env = scheduler.child_env(tmp_path, "local")
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / scheduler.CACHE_DIR)
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0.5"
    assert "JAX_COMPILATION_CACHE_DIR" not in scheduler.child_env(tmp_path, "tpu")  # local runs only
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    assert scheduler.child_env(tmp_path, "local")["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "mine")


def _changing_sweep(kv: int = 2) -> Sweep:
    """c (convert) -> t and v (time, their model c's) and a time run u on its own."""
    return Sweep("changing", (
        R.convert("c", "/src/model", kv),
        R.time("t", "tiny", None, 16, 4, batch=2, model="{run:c}/model", deps=("c",)),
        R.time("u", "tiny", 1, 16, 4, batch=2),
        R.time("v", "tiny", None, 16, 8, batch=2, model="{run:c}/model", deps=("c",)),
    ), {})  # fmt: skip


def test_a_done_run_whose_command_changed_is_refused_and_redone_only_when_asked(tmp_path, monkeypatch):
    """A changed --set (here c's K/V heads) would let a rerun skip c and t, which depends on it
    (and resume v, begun on c's old model), and the report mix settings: the rerun refuses, naming
    them; --dry-run marks them; with redo_changed they are moved aside (not deleted) and run
    again, u is skipped."""
    root, lines, started = tmp_path / "root", [], []
    mark_done(root, _changing_sweep(kv=2), running=("v",))  # v: killed midway
    (root / "c" / "kept.txt").write_text("the old run's file")
    with pytest.raises(ValueError, match=r"3 run\(s\) under .* another command") as refused:
        runner.run_sweep(_changing_sweep(kv=1), root, log=lines.append)
    why = str(refused.value)  # the flag with its values
    assert "c: now --num-kv-heads 1, was --num-kv-heads 2" in why
    assert "t: it depends on c, which changed" in why
    assert "--redo-changed" in str(refused.value) and not lines and (root / "c" / "kept.txt").is_file()
    printed = []
    runner.run_sweep(_changing_sweep(kv=1), root, dry_run=True, out=printed.append)
    assert [line.split("  # ")[-1] if "  # " in line else "" for line in printed] == [
        "done, changed (now --num-kv-heads 1, was --num-kv-heads 2)",
        "done, changed (it depends on c, which changed)",
        "done",
        "changed (it depends on c, which changed)",
    ]

    monkeypatch.setattr(scheduler, "_popen", popen_leaving_outputs(started, _changing_sweep(kv=1)))
    assert runner.run_sweep(_changing_sweep(kv=1), root, redo_changed=True, log=lines.append) == 0
    assert [a[0] for a in started] == ["convert", "time", "time"] and "1" in started[0]  # c, t, v; not u
    aside = sorted(p.name for p in root.iterdir() if ".changed-" in p.name)
    assert [n.split(".changed-")[0] for n in aside] == ["c", "t", "v"]
    assert (root / aside[0] / "kept.txt").read_text() == "the old run's file"
    assert any("c: changed (now --num-kv-heads 1, was --num-kv-heads 2); moved to" in line for line in lines)
    assert "u (time): done before, skipped" in "\n".join(lines)
    assert not runner.changed_runs(runner.order(_changing_sweep(kv=1)), root)  # done now, as asked


def test_another_checkout_interpreter_or_place_of_the_root_is_no_change(tmp_path):
    sweep = _changing_sweep()
    sweep = Sweep(
        "changing", (*sweep.runs, R.finetune("f", "{run:c}/model", "stdlib_calls", {}, deps=("c",))), {}
    )
    old_root, root = tmp_path / "before_the_move", tmp_path / "root"
    mark_done(root, sweep, record_root=old_root, python="/other/venv/bin/python", running=("v",))
    for name in ("c", "t", "f"):  # made from another checkout: its configs/ elsewhere
        record = json.loads((root / name / scheduler.RUN_FILE).read_text())
        record["command"] = [a.replace(str(REPO), "/elsewhere/gqa_jax") for a in record["command"]]
        (root / name / scheduler.RUN_FILE).write_text(json.dumps(record))
    assert "/elsewhere/gqa_jax/configs/finetune.py" in (root / "f" / scheduler.RUN_FILE).read_text()
    assert runner.changed_runs(runner.order(sweep), root) == {}
