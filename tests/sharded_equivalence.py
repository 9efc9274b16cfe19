"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8 (by tests/test_sharding.py):
a train step on each (mesh, K) vs one device; prints one JSON line per case."""

import json
import sys

import jax
import numpy as np
from flax import nnx

from gqa_jax import sharding, training
from gqa_jax.bench_train import synthetic_batch
from gqa_jax.config import preset
from gqa_jax.model import T5


def main(cases):
    assert jax.device_count() == 8, jax.devices()
    for mesh_text, k in cases:
        cfg = preset("tiny", num_heads=8, head_dim=4, num_kv_heads=k)
        model = T5(cfg, rngs=nnx.Rngs(0))
        graphdef, _ = training.split_model(model)
        opt = training.make_optimizer(training.OptimizerConfig("constant", learning_rate=1e-2))
        state = training.init_state(model, opt, seed=0)
        batch = synthetic_batch(cfg, 8, 8, 4, seed=1)
        one_state, one_m = training.make_train_step(graphdef, opt, dropout=False, donate=False)(state, batch)
        mesh = sharding.make_mesh(mesh_text)
        placed, shardings = sharding.shard_state(state, mesh)
        _, replicated = sharding.param_shardings(state.params, mesh)
        step = sharding.make_sharded_train_step(graphdef, opt, mesh, shardings)
        new, m = step(placed, batch)
        diff = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            for a, b in zip(jax.tree.leaves(one_state.params), jax.tree.leaves(new.params), strict=True)
        )
        key = new.params["decoder"]["layers"][0]["self_attn"]["key"]
        kv = sorted({r.name.rsplit(".", 1)[-1] for r in replicated if r.logical_axis == "kv_heads"})
        print(json.dumps({
            "mesh": mesh_text, "k": k, "loss_one": float(one_m["loss"]), "loss_sharded": float(m["loss"]),
            "max_param_diff": diff, "key_spec": [str(a) for a in key.sharding.spec],
            "replicated_kv": kv,
            "report": sharding.replication_report(replicated),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main([(m, int(k)) for m, k in (c.split(":") for c in sys.argv[1:])])
