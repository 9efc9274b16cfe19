"""Sweep roots a researcher can trust: one runner per root, done means the outputs are there and
readable (and a dependency redone after its dependant makes the dependant changed), a failed
run's own error line, and a Ctrl-C that stops the children cleanly. Fake children (``_popen``
replaced) unless a signal must be delivered."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runner_fakes import chain, mark_done, popen_leaving_outputs, statuses

from gqa_jax import unreadable
from gqa_jax.errors import RunError
from gqa_jax.experiments import locks, outputs, runner, scheduler

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _time_lock_here(tmp_path, monkeypatch):
    """The machine's time lock (``locks.TimeGate``) in this test's directory, not the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _holding(root: Path) -> subprocess.Popen:
    """Another runner: a process that holds ``root``'s lock until it is killed."""
    code = (
        "import sys, time; from pathlib import Path; from gqa_jax.experiments import locks; "
        "locks.lock_root(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_runner_on_the_root_is_refused_naming_the_holder_and_a_dead_ones_lock_taken_over(
    tmp_path, monkeypatch
):
    root, lines, printed, started = tmp_path / "root", [], [], []
    monkeypatch.setattr(scheduler, "_popen", popen_leaving_outputs(started, chain()))
    holder = _holding(root)
    try:
        for only in (None, "u"):  # any selection
            with pytest.raises(RunError, match=f"in use by another runner: pid {holder.pid} on") as refused:
                runner.run_sweep(chain(), root, only=only, log=lines.append)
            assert socket.gethostname() in str(refused.value) and "started " in str(refused.value)
        assert not started and [p.name for p in root.iterdir()] == [locks.LOCK_FILE]  # nothing written
        # a dry run takes no lock: it prints the commands and says who holds the root
        assert runner.run_sweep(chain(), root, dry_run=True, log=lines.append, out=printed.append) == 0
        assert f"is in use by another runner: pid {holder.pid}" in lines[-1] and len(printed) == 4
    finally:
        holder.kill()
        holder.wait()
    # its pid gone, the lock is stale: the next runner takes it over, runs, and releases it
    assert runner.run_sweep(chain(), root, log=lines.append) == 0
    assert any(f"taking over the stale lock {root / locks.LOCK_FILE} (pid {holder.pid} no longer runs)" in x
               for x in lines)  # fmt: skip
    assert len(started) == 4 and not (root / locks.LOCK_FILE).exists()
    # released on an error too
    (root / "t" / "run.json").write_text(json.dumps({**json.loads((root / "t" / "run.json").read_text()),
                                                     "command": ["changed"]}))  # fmt: skip
    with pytest.raises(ValueError, match="another command"):
        runner.run_sweep(chain(), root, log=lines.append)
    assert not (root / locks.LOCK_FILE).exists() and locks.held_by(root) is None


def test_a_done_run_whose_output_is_missing_or_unreadable_is_redone_with_its_dependants(
    tmp_path, monkeypatch
):
    """c's model/ lost its marker (a half-written export), e's results.json is truncated: the dry
    run says so, the rerun moves the unreadable outputs aside (nothing deleted), redoes c in its
    directory, and t and e (begun on c's old model) in fresh ones; u stays done."""
    root, lines, printed, started = tmp_path / "root", [], [], []
    mark_done(root, chain())
    (root / "c" / "model" / unreadable.CHECKPOINT_MARKER).unlink()
    (root / "u" / "timing.json").write_text('{"time_per_sample_s": 0.')
    runner.run_sweep(chain(), root, dry_run=True, out=printed.append)
    assert [line.split("  # ")[1] for line in printed] == [
        "done, redo (model/ is not a complete checkpoint (no checkpoint.json))",
        "done, redo (it depends on c, which is redone)",
        "done, redo (it depends on c, which is redone)",
        "done, redo (timing.json is unreadable (JSONDecodeError))",
    ]
    monkeypatch.setattr(scheduler, "_popen", popen_leaving_outputs(started, chain()))
    assert runner.run_sweep(chain(), root, log=lines.append) == 0
    assert [a[0] for a in started] == ["convert", "time", "evaluate", "time"]  # c, t, e, u in order
    assert statuses(root) == dict.fromkeys("ctue", "done")
    assert sorted(p.name.split("-")[0] for p in root.iterdir() if ".redo-" in p.name) == ["e.redo", "t.redo"]
    kept = [p.name for p in (root / "c").iterdir() if ".unreadable-" in p.name]
    assert len(kept) == 1 and kept[0].startswith("model.unreadable-")
    assert (root / "u" / "timing.json").read_text() == json.dumps({"fake": True})
    assert any(x.startswith("c: done before, but its model/ is not a complete checkpoint") for x in lines)
    assert not runner.changed_runs(runner.order(chain()), root)  # the dependants ran after c


def test_the_outputs_a_done_run_needs_are_its_stages_and_those_others_read():
    from gqa_jax.experiments import runs as R

    up = R.uptrain("up", "{run:convert_it}/model", 1, {}, deps=("convert_it",))  # in a config variant
    runs = (R.convert("convert_it", "/mha/model", 1), up,
            *R.finetune_and_evaluate("mha", "{run:up}/model", "stdlib_calls", {}, deps=("up",)))  # fmt: skip
    assert "source={run:convert_it}/model,kv=1" in up.args["config"]
    assert outputs.needed(runs) == {
        "convert_it": ("model",),
        "up": ("model",),
        "ft_mha_stdlib_calls_s0": ("model", "best_model"),  # its evaluate run scores best_model/
        "eval_mha_stdlib_calls_s0": ("results.json",),
    }


def test_the_output_names_are_the_stages_own():
    from gqa_jax.checkpoints import orbax
    from gqa_jax.experiments import evaluate_stage
    from gqa_jax.tools import t_infer

    assert (unreadable.CHECKPOINT_MARKER, unreadable.CHECKPOINT_FORMAT) == (orbax.MARKER, orbax.FORMAT)
    assert unreadable.CHECKPOINT_FILES == (orbax.CONFIG, orbax.PARAMS)
    assert outputs.STAGE_OUTPUTS["evaluate"] == (evaluate_stage.RESULTS,)
    assert outputs.STAGE_OUTPUTS["time"] == (t_infer.TIMING_FILE,)


def test_a_dependency_that_finished_after_its_dependant_started_makes_it_changed(tmp_path, monkeypatch):
    """c redone (``--only c --redo-changed``) after t and e ran on its old model: they are changed,
    refused without --redo-changed, redone with it."""
    times = {"c": ("2024-05-01T12:00:00+00:00", "2024-05-01T13:00:00+00:00"),
             "t": ("2024-05-01T12:10:00+00:00", "2024-05-01T12:20:00+00:00"),
             "e": ("2024-05-01T12:20:00+00:00", "2024-05-01T12:30:00+00:00")}  # fmt: skip
    root, printed, started = tmp_path / "root", [], []
    mark_done(root, chain(), times=times)
    assert runner.changed_runs(runner.order(chain()), root) == {
        "t": "its dependency c finished after it started",
        "e": "its dependency c finished after it started",
    }
    runner.run_sweep(chain(), root, dry_run=True, out=printed.append)
    assert [line.split("  # ")[1] for line in printed] == [
        "done",
        "done, changed (its dependency c finished after it started)",
        "done, changed (its dependency c finished after it started)",
        "done",
    ]
    with pytest.raises(ValueError, match=r"2 run\(s\) .* older output of a dependency \(t: its dependency c"):
        runner.run_sweep(chain(), root)
    monkeypatch.setattr(scheduler, "_popen", popen_leaving_outputs(started, chain()))
    assert runner.run_sweep(chain(), root, redo_changed=True, log=lambda m: None) == 0
    assert [a[0] for a in started] == ["time", "evaluate"] and statuses(root) == dict.fromkeys("ctue", "done")


def test_a_failed_run_says_its_own_error_line_and_a_dependency_whose_output_went(tmp_path, monkeypatch):
    root, lines, started = tmp_path / "root", [], []
    text = "loading ...\npython -m gqa_jax time: error: --model ROOT/c/model: no checkpoint there\n\nbye"
    failing = popen_leaving_outputs(started, chain(), fail={"t": text})

    def popen(argv, log_file, env, server):
        (root / "c" / "model" / "params").rename(root / "c" / "params.moved")  # lost while the runner runs
        return failing(argv, log_file, env, server)

    monkeypatch.setattr(scheduler, "_popen", popen)
    mark_done(root, chain(), running=("t", "e"))
    assert runner.run_sweep(chain(), root, only="t", log=lines.append) == 1
    failed = [x for x in lines if "FAILED" in x]
    assert failed == ["[2/2] t (time): FAILED (exit 2) after 0 s: python -m gqa_jax time: error: --model "
                      "ROOT/c/model: no checkpoint there"]  # fmt: skip
    assert f"  log: {root / 't' / 'log.txt'}" in "\n".join(lines)
    gone = "its dependency c is recorded done, but its model/ is not a complete checkpoint (no params)"
    assert any(gone in x for x in lines)
    assert json.loads((root / "t" / "run.json").read_text())["error"].startswith(
        "python -m gqa_jax time: error:"
    )


def test_a_run_that_exits_0_without_its_outputs_failed(tmp_path, monkeypatch):
    root, lines = tmp_path / "root", []
    monkeypatch.setattr(
        scheduler, "_popen", lambda argv, log_file, env, server: subprocess.Popen([sys.executable, "-c", ""])
    )
    assert runner.run_sweep(chain(), root, only="u", log=lines.append) == 1
    assert "[1/1] u (time): FAILED (exit 0) after 0 s: exit 0, but timing.json is missing" in lines


def test_a_run_a_signal_killed_says_which(tmp_path, monkeypatch):
    root, lines = tmp_path / "root", []
    code = "import os, signal; print('compiling ...', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    monkeypatch.setattr(
        scheduler,
        "_popen",
        lambda argv, log_file, env, server: subprocess.Popen([sys.executable, "-c", code], stdout=log_file),
    )
    assert runner.run_sweep(chain(), root, only="u", log=lines.append) == 1
    killed = re.compile(r"\[1/1\] u \(time\): FAILED \(killed by SIGKILL\) after \d+ s: compiling \.\.\.")
    assert any(killed.fullmatch(line) for line in lines), lines  # the seconds: 1 where Python starts slowly


def test_the_error_line_is_the_clis_else_the_raised_exception_else_the_last_line():
    cli = "python -m gqa_jax train: error: workdir x is in use"
    assert (
        outputs.error_line(f"step 1\n{cli}\nTraceback (most recent call last):\n  ValueError: y\n\n") == cli
    )
    assert outputs.error_line(
        'Traceback:\n  File "x", line 1\njax.errors.JaxRuntimeError: OOM\nexiting\n'
    ) == ("jax.errors.JaxRuntimeError: OOM")
    assert outputs.error_line("a\nlast words\n\n") == "last words" and outputs.error_line("") == ""


def test_a_timed_run_waits_for_the_other_runners_runs_and_they_for_it(tmp_path):
    """Two runners' gates on one machine: a timed run waits for the other's runs to end, and the
    other starts nothing new meanwhile; once it has timed, the other goes on."""
    a, b = locks.TimeGate(tmp_path), locks.TimeGate(tmp_path)
    try:
        assert a.may_start(False)  # a runs a fine-tuning run
        assert not b.may_start(True) and "runs of other sweep runners" in b.waiting_for
        assert not a.may_start(False) and "timed run of another" in a.waiting_for  # nothing new beside
        a.idle()  # a's run ended
        assert b.may_start(True) and not a.may_start(False) and "timed run" in a.waiting_for
        b.idle()
        assert a.may_start(False) and b.may_start(False)  # shared again
    finally:
        a.close()
        b.close()


CHILD = """
import signal, sys, time
from pathlib import Path
note = Path(sys.argv[1])
def on_int(signum, frame):
    with note.open("a") as f:
        f.write(f"SIGINT pgid={__import__('os').getpgrp()}\\n")
    if note.read_text().count("SIGINT") == 2:
        sys.exit(130)
signal.signal(signal.SIGINT, on_int)
note.write_text("ready\\n")
time.sleep(60)  # a first SIGINT: saving a checkpoint, slowly; a second: abandon it
sys.exit(130)
"""

DRIVER = """
import sys
from gqa_jax import __main__ as cli
from gqa_jax.experiments import scheduler
real = scheduler._popen
note, child = sys.argv[1], sys.argv[2]
scheduler._popen = lambda argv, log, env, server: real([sys.executable, child, note], log, env, server)
sys.exit(cli.main(["sweep", sys.argv[3], "--root", sys.argv[4]]))
"""

SWEEP = """
from gqa_jax.experiments import runs as R
from gqa_jax.experiments.sweep import Sweep
PARAMS = {}
def get_sweep(params):
    return Sweep("one", (R.convert("c", "/src/model", 1), R.time("u", "tiny", 1, 16, 4, deps=("c",))))
"""


def _wait_for(predicate, what: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, f"the runner ended before {what}: {proc.communicate()}"
        assert time.time() < deadline, f"no {what} in {timeout:.0f} s"
        time.sleep(0.05)


def test_ctrl_c_stops_the_children_cleanly_and_a_second_one_leaves_no_traceback(tmp_path):
    """SIGINT to the runner reaches its child (in a process group of its own), which starts saving;
    a second SIGINT is passed on too; the runner waits for the child, records it stopped, releases
    the root and exits 130 with one line and no traceback."""
    root, note = tmp_path / "root", tmp_path / "note.txt"
    files = {name: tmp_path / f"{name}.py" for name in ("child", "driver", "one")}
    for name, text in (("child", CHILD), ("driver", DRIVER), ("one", SWEEP)):
        files[name].write_text(text)
    argv = [
        sys.executable,
        str(files["driver"]),
        str(note),
        str(files["child"]),
        str(files["one"]),
        str(root),
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: note.is_file() and "ready" in note.read_text(), "child", proc)
        proc.send_signal(signal.SIGINT)
        _wait_for(lambda: "SIGINT" in note.read_text(), "SIGINT in the child", proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    got = note.read_text().splitlines()
    assert got[0] == "ready" and len(got) == 3 and got[1] == got[2] != f"SIGINT pgid={os.getpgrp()}"
    assert "Traceback" not in err and "Exception ignored" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("sweep one: stopped by SIGINT; 1 run(s) stopped before done (c)")
    )
    record = json.loads((root / "c" / "run.json").read_text())
    assert (record["status"], record["returncode"]) == ("stopped", 130)
    assert "u" not in statuses(root) and not (root / locks.LOCK_FILE).exists()
