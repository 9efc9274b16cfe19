"""Exact resume after SIGKILL: the end-to-end tests of `python -m gqa_jax train` (subprocesses).

A run killed at any point (before its first checkpoint, while a checkpoint is committed, while
the final model is exported) and restarted ends with the metrics and the state of an
uninterrupted run, bit for bit (CPU): parameters, optimizer state and every logged step."""

import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import xla_env

from gqa_jax import metric_writers

REPO = Path(__file__).resolve().parents[1]
N = 2
COMPARED = ("loss", "z_loss", "accuracy", "grad_norm", "param_norm", "tokens", "learning_rate")


def command(workdir, data, vocab, steps):
    return [
        sys.executable, "-m", "gqa_jax", "train", "--config", "configs/pretrain.py",
        "--workdir", str(workdir),
        f"--config.data_dir={data}", f"--config.vocab={vocab}", "--config.batch_size=4",
        "--config.input_length=128", f"--config.num_train_steps={steps}", f"--config.checkpoint_every={N}",
        "--config.log_every=1", "--config.eval_every=-1", "--config.progress=False",
    ]  # fmt: skip


def restore_state(path, item="state"):
    """A checkpoint's TrainState (or a saved model's params) as numpy arrays (whatever devices or
    mesh wrote it)."""
    with ocp.PyTreeCheckpointer() as ckpt:
        meta = ckpt.metadata(path / item)
        tree = getattr(meta, "item_metadata", meta)
        tree = getattr(tree, "tree", tree)
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        return ckpt.restore(path / item, restore_args=args)


def killed_at(point, step, workdir, data, vocab, steps, env):
    """Run ``train`` in a process that SIGKILLs itself at ``point`` (tests/kill_points.py)."""
    argv = command(workdir, data, vocab, steps)[3:]  # the arguments after `python -m gqa_jax`
    run = subprocess.run([sys.executable, "tests/kill_points.py", point, str(step), "--", *argv], cwd=REPO,
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)  # fmt: skip
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()[-3000:]
    return run.stderr.decode()


def names(directory):
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def test_sigkill_anywhere_then_restart_continue_bitwise(suite_subset, small_vocab, tmp_path):
    data, env = suite_subset
    full, killed = tmp_path / "full", tmp_path / "killed"
    total = 3 * N
    # The uninterrupted run, side by side with the first killed one (compilation is mostly
    # single-threaded, so the two share 2 cores well).
    uninterrupted = subprocess.Popen(command(full, data, small_vocab.path, total), cwd=REPO, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    # 1. before the first checkpoint (step 0's, written before anything trains)
    killed_at("save-start", 0, killed, data, small_vocab.path, total, env)
    assert names(killed / "checkpoints") == [] and not metric_writers.read_metrics(killed)
    _, err = uninterrupted.communicate(timeout=600)
    assert uninterrupted.returncode == 0, err.decode()[-3000:]
    # 2. while checkpoint 2N is committed: its files are written, it is not renamed into place
    err = killed_at("save-commit", 2 * N, killed, data, small_vocab.path, total, env)
    assert "taking over the stale lock" in err and "no longer runs" in err  # the killed run's lock
    ckpts = names(killed / "checkpoints")
    assert (
        ckpts[:2] == ["0", str(N)]
        and len(ckpts) == 3
        and ckpts[2].startswith(f"{2 * N}.orbax-checkpoint-tmp")
    )
    # 3. during the final export, after the last checkpoint: resumed from N, it trains to the end
    killed_at("export", 0, killed, data, small_vocab.path, total, env)
    assert str(total) in names(killed / "checkpoints") and not (killed / "model").exists()
    assert any(n.startswith("model.tmp-") for n in names(killed))
    # 4. the restart resumes at the end, removes what the kills left, and exports
    run = subprocess.run(command(killed, data, small_vocab.path, total), cwd=REPO, env=env, timeout=600,
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"resuming {killed} from step {total}" in run.stderr and "removed" in run.stderr
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


def two_processes(args, env, timeout=600):
    """Run ``python -m gqa_jax ARGS`` as two processes x 4 CPU devices; returns their outputs."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for pid in range(2):
        penv = dict(
            xla_env.cpu_devices(4, env), GQA_JAX_COORDINATOR=f"127.0.0.1:{port}", GQA_JAX_NUM_PROCESSES="2",
            GQA_JAX_PROCESS_ID=str(pid),
        )  # fmt: skip
        procs.append(
            subprocess.Popen(args, cwd=REPO, env=penv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0].decode())
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-4000:]
    return outs


def test_two_process_train_on_a_2x4_mesh_resumes_exactly(suite_subset, small_vocab, tmp_path):
    """`train` over two processes (each feeding its half of the rows, process 0 alone writing logs):
    4 steps, then checkpoint 4 is set aside and a restart from 2 recomputes steps 3-4 identically."""
    data, env = suite_subset
    wd = tmp_path / "run"
    args = command(wd, data, small_vocab.path, 4) + [
        "--config.mesh=2x4", "--config.checkpoint_every=2", "--config.eval_every=0",
        "--config.eval_examples=8", "--config.eval_batch_size=4", "--config.keep_checkpoints=5",
    ]  # fmt: skip
    outs = two_processes(args, env)
    assert "mesh {'data': 2, 'model': 4} over 2 process(es)" in outs[0]
    first = metric_writers.read_metrics(wd)
    train_steps = [m["step"] for m in first if "train/loss" in m]
    assert train_steps == [1, 2, 3, 4]  # logged once: only process 0 writes
    assert [m["step"] for m in first if "eval/loss" in m] == [4]  # evaluated on the sharded params
    assert (wd / "model" / "config.json").is_file() and (wd / "summary.json").is_file()
    aside = tmp_path / "step4"
    (wd / "checkpoints" / "4").rename(aside)

    # the restart skips the final evaluation (eval_every may change on restart): the steps it
    # recomputes are the point, and a second sharded decode compile costs a minute of CI
    outs = two_processes([a if a != "--config.eval_every=0" else "--config.eval_every=-1" for a in args], env)
    assert "from step 2" in outs[0]
    again = {m["step"]: m for m in metric_writers.read_metrics(wd) if "train/loss" in m}
    before = {m["step"]: m for m in first if "train/loss" in m}
    assert sorted(again) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in COMPARED:
            assert again[step][f"train/{key}"] == before[step][f"train/{key}"], (step, key)
    sa, sb = restore_state(aside), restore_state(wd / "checkpoints" / "4")
    for x, y in zip(jax.tree.leaves(sa), jax.tree.leaves(sb), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
