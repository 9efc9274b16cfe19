"""Two local processes with 4 simulated CPU devices each (gloo collectives, coordinator on
127.0.0.1; the second forked from the first after its imports), one pair for every multi-process
check: a train step, greedy decoding and a checkpoint round trip equal the one-process run; both
load one T5X checkpoint onto a 1x8 mesh, each reading only its own devices' blocks; and ``train``
over both resumes exactly."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import xla_env
from flax import nnx
from train_runs import COMPARED, command, restore_state

from gqa_jax import decoding, metric_writers, training
from gqa_jax.config import preset
from gqa_jax.model import T5
from gqa_jax.tools.bench_train import synthetic_batch

HERE = Path(__file__).resolve().parent
# The data axis spans the processes: each feeds half the rows; K = 8 shards over model.
# (Also works for a model axis spanning them, e.g. "1x8:2", where both processes feed all rows
# and K/V heads replicate: `python tests/multihost_worker.py` takes several cases.)
CASES = ("2x4:8",)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reference(k: int) -> dict:
    cfg = preset("tiny", num_heads=8, head_dim=4, num_kv_heads=k, num_encoder_layers=1, num_decoder_layers=1)
    opt = training.make_optimizer(training.OptimizerConfig("constant", learning_rate=1e-2))
    model = T5(cfg, rngs=nnx.Rngs(0))
    graphdef, _ = training.split_model(model)
    state = training.init_state(model, opt, seed=0)
    new, m = training.make_train_step(graphdef, opt, dropout=False, donate=False)(
        state, synthetic_batch(cfg, 8, 8, 4, seed=1)
    )
    ids = np.random.default_rng(2).integers(2, cfg.vocab_size, (8, 12))
    ids[3, 5:] = 0
    greedy = decoding.greedy_decode((graphdef, new.params), ids, 10)
    flat = {
        "/".join(str(getattr(p, "key", p)) for p in path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(new.params)
    }
    return {"loss": float(m["loss"]), "tokens": np.asarray(greedy.tokens), "params": flat}


def two_processes(out_dir, env, train_args=()):
    """tests/multihost_worker.py as two processes x 4 CPU devices (process 1 forked from process 0
    after the imports); returns their outputs."""
    peer = out_dir / "process1.log"
    penv = dict(
        xla_env.cpu_devices(4, env),
        GQA_JAX_COORDINATOR=f"127.0.0.1:{_free_port()}",
        GQA_JAX_NUM_PROCESSES="2",
        GQA_JAX_PROCESS_ID="0",
        GQA_JAX_FORK_PEER=str(peer),
    )
    argv = [sys.executable, str(HERE / "multihost_worker.py"), str(out_dir), *CASES, "--", *train_args]
    proc = subprocess.Popen(argv, env=penv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=HERE.parent)  # fmt: skip
    try:
        out = proc.communicate(timeout=600)[0]
    except subprocess.TimeoutExpired:
        proc.kill()  # and process 1 with it (tests/multihost_worker.py)
        pytest.fail("the two processes did not finish in 600 s")
    outputs = [out, peer.read_text() if peer.exists() else ""]
    assert proc.returncode == 0, outputs[0][-4000:] + "\n--- process 1:\n" + outputs[1][-4000:]
    return outputs


def test_two_processes_equal_one_and_train_over_them_resumes_exactly(suite_subset, small_vocab, tmp_path):
    data, env = suite_subset
    wd = tmp_path / "run"
    args = command(wd, data, small_vocab.path, 4)[3:] + [
        "--config.mesh=2x4", "--config.checkpoint_every=2", "--config.eval_every=0",
        "--config.eval_examples=8", "--config.eval_batch_size=4", "--config.keep_checkpoints=5",
    ]  # fmt: skip
    outputs = two_processes(tmp_path, env, args)
    for case in CASES:
        mesh, k = case.split(":")
        got = np.load(tmp_path / f"{mesh}_{k}.npz")
        ref = reference(int(k))
        assert float(got["loss"]) == pytest.approx(ref["loss"], abs=1e-5)
        for name, value in ref["params"].items():
            np.testing.assert_allclose(got[f"param/{name}"], value, atol=1e-5, err_msg=name)
        np.testing.assert_array_equal(got["tokens"], ref["tokens"])
        assert bool(got["restored_equal"])  # every process restored exactly what it wrote
        model = int(mesh.split("x")[1])
        shards_kv = int(k) % model == 0
        assert (list(got["key_spec"])[1:2] == ["model"]) == shards_kv
        assert (list(got["cache_spec"])[1:2] == ["model"]) == shards_kv
        assert (tmp_path / f"ckpt_{mesh}_{k}" / "1").is_dir()
    # a T5X checkpoint loaded onto 1x8 by both processes: each read only its devices' blocks
    load = np.load(tmp_path / "t5x_load.npz")
    (read0, equal0), (read1, equal1) = load["counts"]
    assert equal0 and equal1  # every shard a process holds equals the checkpoint's slice
    assert read0 == read1 < 0.6 * int(load["total"])  # half of each sharded parameter, all of the rest

    # `train` over the two processes (each feeding its half of the rows, process 0 alone writing
    # logs): 4 steps, then checkpoint 4 is set aside and a restart from 2 recomputes steps 3-4
    # identically (the restart skips the final evaluation: the steps it recomputes are the point)
    first_out, restart_out = outputs[0].split("=== restart")
    assert "mesh {'data': 2, 'model': 4} over 2 process(es)" in first_out
    first = metric_writers.read_metrics(tmp_path / "first")
    train_steps = [m["step"] for m in first if "train/loss" in m]
    assert train_steps == [1, 2, 3, 4]  # logged once: only process 0 writes
    assert [m["step"] for m in first if "eval/loss" in m] == [4]  # evaluated on the sharded params
    exported = json.loads((tmp_path / "first" / "exported.json").read_text())
    assert exported == {"model_config": True, "summary": True}  # model/config.json, summary.json
    assert "from step 2" in restart_out
    again = {m["step"]: m for m in metric_writers.read_metrics(wd) if "train/loss" in m}
    before = {m["step"]: m for m in first if "train/loss" in m}
    assert sorted(again) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in COMPARED:
            assert again[step][f"train/{key}"] == before[step][f"train/{key}"], (step, key)
    sa, sb = restore_state(tmp_path / "step4"), restore_state(wd / "checkpoints" / "4")
    for x, y in zip(jax.tree.leaves(sa), jax.tree.leaves(sb), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
