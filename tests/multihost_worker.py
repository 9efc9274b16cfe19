"""The processes of a simulated two-host run (tests/test_multihost.py starts process 0).

Environment: GQA_JAX_COORDINATOR / GQA_JAX_NUM_PROCESSES / GQA_JAX_PROCESS_ID and
XLA_FLAGS=--xla_force_host_platform_device_count=4 (4 CPU devices per process, 8 in all); with
GQA_JAX_FORK_PEER=PATH, process 0 forks process 1 once their imports are done (paid once, not
twice; no JAX backend has started yet), process 1's output to PATH, and exits 1 if it failed.
Usage: multihost_worker.py OUT_DIR MESH:K [MESH:K ...] [-- TRAIN ARGUMENTS]

Per case: sharded init, one train step on a global batch fed half by each process (or whole by
both when the data axis does not span the processes), greedy decoding, and an orbax checkpoint
of the updated state written by both processes and restored into the same shardings.
Process 0 writes the results to OUT_DIR/<mesh>_<k>.npz. Then a T5X checkpoint written by process 0
is loaded by both onto a 1x8 mesh, each reading only its devices' blocks (OUT_DIR/t5x_load.npz).
With TRAIN ARGUMENTS (``python -m gqa_jax train ...``'s, ``--config.checkpoint_every=2``), the
``train`` command runs in both processes, then checkpoint 4 is set aside and it runs again, resuming
from step 2 (``train_twice``).
"""

import gc
import json
import os
import shutil
import sys
from pathlib import Path

gc.disable()  # its imports' objects live as long as it does: frozen below, never walked (tests/conftest.py)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from t5x_files import t5x_from_ours, write_legacy  # noqa: E402

from gqa_jax import __main__ as cli  # noqa: E402
from gqa_jax import checkpoints, decoding, distributed, sharding, training  # noqa: E402
from gqa_jax import model as model_lib  # noqa: E402
from gqa_jax.checkpoints import layout  # noqa: E402
from gqa_jax.config import preset  # noqa: E402
from gqa_jax.experiments.forks import die_with_parent  # noqa: E402
from gqa_jax.tools.bench_train import synthetic_batch  # noqa: E402

gc.freeze()
gc.enable()


def load_across_processes(out_dir: Path) -> None:
    """Both processes load one T5X checkpoint onto a 1x8 mesh (each process holds half of every
    sharded parameter) and count the elements they read."""
    cfg = preset("tiny", num_heads=8, head_dim=4, relative_attention_max_distance=128)
    source = model_lib.flat_params(model_lib.build(cfg, seed=3))  # the same weights in both
    path = out_dir / "t5x"
    if jax.process_index() == 0:
        write_legacy(path, t5x_from_ours(model_lib.build(cfg, seed=3)))
    multihost_utils.sync_global_devices("t5x checkpoint written")
    read, plain = [0], layout.read

    def counting(tensor, read_stored, index=None):
        block = plain(tensor, read_stored, index)
        read[0] += block.size
        return block

    layout.read = counting
    model, _ = checkpoints.load_t5x(path, mesh=sharding.make_mesh("1x8"))
    layout.read = plain
    equal = all(
        np.array_equal(np.asarray(s.data), np.asarray(source[p])[s.index])
        for p, x in model_lib.flat_params(model).items()
        for s in x.addressable_shards
    )
    counts = multihost_utils.process_allgather(np.asarray([read[0], int(equal)]))  # [processes, 2]
    if jax.process_index() == 0:
        total = sum(int(np.size(v)) for v in source.values())
        np.savez(out_dir / "t5x_load.npz", counts=counts, total=np.asarray(total))


def main(out_dir: Path, cases: list[tuple[str, int]]) -> None:
    assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4
    for mesh_text, k in cases:
        cfg = preset(
            "tiny", num_heads=8, head_dim=4, num_kv_heads=k, num_encoder_layers=1, num_decoder_layers=1
        )
        opt = training.make_optimizer(training.OptimizerConfig("constant", learning_rate=1e-2))
        mesh = sharding.make_mesh(mesh_text)
        state, shardings, graphdef, _ = training.create_state(cfg, opt, mesh, seed=0)

        # Every process builds the same global batch and feeds only its own slice of rows.
        full = synthetic_batch(cfg, 8, 8, 4, seed=1)
        ids = np.random.default_rng(2).integers(2, cfg.vocab_size, (8, 12))
        ids[3, 5:] = 0
        index, count = distributed.process_data_slice(mesh)
        rows = slice(index * 8 // count, (index + 1) * 8 // count)
        batch = distributed.global_batch({k_: v[rows] for k_, v in full.items()}, mesh)
        global_ids = distributed.global_batch({"ids": ids[rows]}, mesh)["ids"]

        step = training.make_train_step(graphdef, opt, mesh=mesh, state_shardings=shardings, dropout=False)
        new, metrics = step(state, batch)
        greedy = decoding.greedy_decode((graphdef, new.params), global_ids, 10, mesh=mesh, return_cache=True)

        # Checkpoint: each process writes its shards; restore into the same shardings.
        ckpt_dir = out_dir / f"ckpt_{mesh_text}_{k}"
        with ocp.CheckpointManager(ckpt_dir, options=ocp.CheckpointManagerOptions(create=True)) as mgr:
            mgr.save(1, args=ocp.args.StandardSave(new))
            mgr.wait_until_finished()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, new)
        with ocp.CheckpointManager(ckpt_dir) as mgr:
            restored = mgr.restore(1, args=ocp.args.StandardRestore(abstract))
        same = all(
            a.sharding == b.sharding
            and all(
                np.array_equal(np.asarray(x.data), np.asarray(y.data))
                for x, y in zip(a.addressable_shards, b.addressable_shards, strict=True)
            )
            for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(restored), strict=True)
        )
        all_same = multihost_utils.process_allgather(np.asarray(same))  # [processes]

        host = distributed.to_host({"params": new.params, "tokens": greedy.tokens, "lengths": greedy.lengths})
        key = new.params["decoder"]["layers"][0]["self_attn"]["key"]
        if jax.process_index() == 0:
            flat = {
                "/".join(str(getattr(p, "key", p)) for p in path): leaf
                for path, leaf in jax.tree_util.tree_leaves_with_path(host["params"])
            }
            np.savez(
                out_dir / f"{mesh_text}_{k}.npz",
                loss=np.asarray(float(metrics["loss"])),
                tokens=host["tokens"],
                lengths=host["lengths"],
                restored_equal=np.asarray(bool(np.all(all_same))),
                cache_spec=np.asarray([str(a) for a in greedy.cache.self_k[0].sharding.spec]),
                key_spec=np.asarray([str(a) for a in key.sharding.spec]),
                **{f"param/{name}": value for name, value in flat.items()},
            )  # fmt: skip
        loss = float(metrics["loss"])
        print(f"process {jax.process_index()}: {mesh_text} K={k} loss {loss:.6f}", flush=True)


def train_twice(out_dir: Path, argv: list[str]) -> None:
    """``train`` in both processes; process 0 keeps what the first run logged and wrote
    (OUT_DIR/first) and sets checkpoint 4 aside (OUT_DIR/step4); then the same command again, without
    its final evaluation (a restart may change eval_every), resumes from checkpoint 2. A line
    ``=== restart`` on stderr separates the two runs' output."""
    workdir = Path(argv[argv.index("--workdir") + 1])
    assert cli.main(argv) == 0
    multihost_utils.sync_global_devices("first train run done")
    if jax.process_index() == 0:
        first = out_dir / "first"
        first.mkdir()
        shutil.copy(workdir / "metrics.jsonl", first / "metrics.jsonl")
        exported = {"model_config": (workdir / "model" / "config.json").is_file(),
                    "summary": (workdir / "summary.json").is_file()}  # fmt: skip
        (first / "exported.json").write_text(json.dumps(exported))
        (workdir / "checkpoints" / "4").rename(out_dir / "step4")
    multihost_utils.sync_global_devices("checkpoint 4 set aside")
    print("=== restart", file=sys.stderr, flush=True)
    assert cli.main([a if a != "--config.eval_every=0" else "--config.eval_every=-1" for a in argv]) == 0


def fork_peer(path: str) -> int:
    """Process 1 forked from this one, its output to ``path``: its pid here, 0 in it."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        die_with_parent()  # SIGKILL when process 0 ends (the test's timeout kills it)
        os.environ["GQA_JAX_PROCESS_ID"] = "1"
        with open(path, "wb") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
    return pid


if __name__ == "__main__":
    peer = os.environ.pop("GQA_JAX_FORK_PEER", None)
    peer_pid = fork_peer(peer) if peer else 0
    distributed.initialize_distributed()  # before anything touches the devices
    args, train_args = sys.argv[1:], []
    if "--" in args:
        args, train_args = args[: args.index("--")], args[args.index("--") + 1 :]
    main(Path(args[0]), [(m, int(k)) for m, k in (c.split(":") for c in args[1:])])
    load_across_processes(Path(args[0]))
    if train_args:
        train_twice(Path(args[0]), train_args)
    jax.distributed.shutdown()  # both at its barrier before process 0 waits for process 1 to exit
    if peer_pid and os.waitstatus_to_exitcode(os.waitpid(peer_pid, 0)[1]):
        sys.exit(f"process 1 failed: see {peer}")
