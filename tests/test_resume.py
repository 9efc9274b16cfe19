"""Exact resume after SIGKILL: the end-to-end test of ``train`` killed in real processes.

A run killed at any point (before its first checkpoint, while a checkpoint is committed, while
the final model is exported; each kill a process of its own, forked from one that imported the
package once) and restarted ends with the metrics and the state of an uninterrupted run, bit for
bit (CPU): parameters, optimizer state and every logged step. The uninterrupted run and the
restart run in this process (``gqa_jax.__main__.main``: a process start costs seconds of imports,
and they are not what is killed)."""

import json
import select
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
from train_runs import COMPARED, N, command, restore_state

from gqa_jax import __main__ as cli
from gqa_jax import metric_writers
from gqa_jax.data import stdlib_extract

REPO = Path(__file__).resolve().parents[1]


class KillPoints:
    """``tests/kill_points.py serve``: each run a process forked from one that imported the package
    once (a process start per run cost 2.7 s of CPU in imports)."""

    def __init__(self, env):
        self.proc = subprocess.Popen([sys.executable, "tests/kill_points.py", "serve"], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip

    def killed_at(self, point, step, workdir, data, vocab, steps):
        """Run ``train`` in a process that SIGKILLs itself at ``point``; its stderr."""
        argv = command(workdir, data, vocab, steps)[3:]  # the arguments after `python -m gqa_jax`
        err = workdir.parent / f"{point}.err"
        request = {"point": point, "step": step, "argv": argv, "stderr": str(err)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        assert select.select([self.proc.stdout], [], [], 600)[0], f"the run killed at {point} ran 600 s"
        answer = self.proc.stdout.readline()
        assert answer and json.loads(answer)["rc"] == -signal.SIGKILL, err.read_text()[-3000:]
        return err.read_text()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def names(directory):
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def test_sigkill_anywhere_then_restart_continue_bitwise(suite_subset, small_vocab, tmp_path, capfd,
                                                        monkeypatch):  # fmt: skip
    data, env = suite_subset
    monkeypatch.setenv(stdlib_extract.MAX_FILES_ENV, "16")  # the subset, for the runs in this process
    full, killed = tmp_path / "full", tmp_path / "killed"
    total = 3 * N
    kills = KillPoints(env)  # its imports beside the uninterrupted run
    assert cli.main(command(full, data, small_vocab.path, total)[3:]) == 0  # the uninterrupted run
    # 1. before the first checkpoint (step 0's, written before anything trains)
    kills.killed_at("save-start", 0, killed, data, small_vocab.path, total)
    assert names(killed / "checkpoints") == [] and not metric_writers.read_metrics(killed)
    # 2. while checkpoint 2N is committed: its files are written, it is not renamed into place
    err = kills.killed_at("save-commit", 2 * N, killed, data, small_vocab.path, total)
    assert "taking over the stale lock" in err and "no longer runs" in err  # the killed run's lock
    ckpts = names(killed / "checkpoints")
    assert (
        ckpts[:2] == ["0", str(N)]
        and len(ckpts) == 3
        and ckpts[2].startswith(f"{2 * N}.orbax-checkpoint-tmp")
    )
    # 3. during the final export, after the last checkpoint: resumed from N, it trains to the end
    kills.killed_at("export", 0, killed, data, small_vocab.path, total)
    kills.close()
    assert str(total) in names(killed / "checkpoints") and not (killed / "model").exists()
    assert any(n.startswith("model.tmp-") for n in names(killed))
    # 4. the restart resumes at the end, removes what the kills left, and exports
    capfd.readouterr()
    code = cli.main(command(killed, data, small_vocab.path, total)[3:])
    err = capfd.readouterr().err
    assert code == 0, err[-3000:]
    assert f"resuming {killed} from step {total}" in err and "removed" in err
    assert not any("tmp" in n for n in names(killed) + names(killed / "checkpoints"))
    assert not (killed / "lock.json").exists()

    a = {m["step"]: m for m in metric_writers.read_metrics(full)}
    steps = [m["step"] for m in metric_writers.read_metrics(killed)]
    assert steps == list(range(1, total + 1))  # strictly increasing, complete, each step once
    b = {m["step"]: m for m in metric_writers.read_metrics(killed)}
    for step in range(1, total + 1):
        for key in (*COMPARED, "examples_seen"):
            assert a[step][f"train/{key}"] == b[step][f"train/{key}"], (step, key)
    last = f"checkpoints/{total}"
    for item, sub in ((last, "state"), ("model", "params")):  # the final state, and the exported model
        sa, sb = restore_state(full / item, sub), restore_state(killed / item, sub)
        leaves_a, tree_a = jax.tree.flatten(sa)
        leaves_b, tree_b = jax.tree.flatten(sb)
        assert tree_a == tree_b and len(leaves_a) > 10
        for x, y in zip(leaves_a, leaves_b, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
