"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/eight_devices.py runs it
for test_sharding.py): for each (mesh, K): sharded init, a train step, greedy decoding and beam
search vs one device; prints one JSON line per case. Cases are MESH:K, or MESH:K:nobeam to skip
beam search. The model, inputs and one-device decodes are tests/sharded_decode.py's."""

import json
import sys

import jax
import numpy as np
from sharded_decode import DECODE_LEN, inputs, one_device

from gqa_jax import cache as kvcache
from gqa_jax import decoding, sharding, training
from gqa_jax.beam_search import beam_search
from gqa_jax.tools.bench_train import synthetic_batch


def max_diff(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def main(cases):
    assert jax.device_count() == 8, jax.devices()
    for mesh_text, k, beam in cases:
        # The reference: everything on one device (the decodes shared with sharded_decode.py).
        cfg, model, one = one_device(k)
        one_greedy, one_int8 = one[None], one["int8"]
        opt = training.make_optimizer(training.OptimizerConfig("constant", learning_rate=1e-2))
        batch = synthetic_batch(cfg, 8, 8, 4, seed=1)
        ids = inputs(cfg.vocab_size)
        with jax.default_device(jax.devices()[0]):
            graphdef, _ = training.split_model(model)
            state = training.init_state(model, opt, seed=0)
            one_state, one_m = training.make_train_step(graphdef, opt, dropout=False, donate=False)(
                state, batch
            )
            one_beam = beam_search(model, ids, 6, beam_size=2) if beam else None

        mesh = sharding.make_mesh(mesh_text)
        placed, shardings, graphdef_s, replicated = training.create_state(cfg, opt, mesh, seed=0)
        init_diff = max_diff(state, placed)
        init_specs_ok = all(
            x.sharding.is_equivalent_to(s, x.ndim)
            for x, s in zip(jax.tree.leaves(placed), jax.tree.leaves(shardings), strict=True)
        )
        params = placed.params  # the decode runs on the sharded initial params
        greedy = decoding.greedy_decode((graphdef_s, params), ids, DECODE_LEN, mesh=mesh, return_cache=True)
        int8 = decoding.greedy_decode(
            (graphdef_s, params), ids, DECODE_LEN, mesh=mesh, return_cache=True, cache_dtype="int8"
        )
        beam_out = beam_search((graphdef_s, params), ids, 6, beam_size=2, mesh=mesh) if beam else None
        c = int8.cache
        int8_entries = (c.self_k[0].values, c.self_k[0].scale, c.cross_v[0].values, c.cross_v[0].scale)
        step = training.make_train_step(graphdef_s, opt, mesh=mesh, state_shardings=shardings, dropout=False)
        new, m = step(placed, batch)
        key = new.params["decoder"]["layers"][0]["self_attn"]["key"]
        kv = sorted({r.name.rsplit(".", 1)[-1] for r in replicated if r.logical_axis == "kv_heads"})
        _, cache_replicated = kvcache.cache_layout(cfg, mesh, 8, 12, DECODE_LEN, "float32")
        print(json.dumps({
            "mesh": mesh_text, "k": k, "loss_one": float(one_m["loss"]), "loss_sharded": float(m["loss"]),
            "max_param_diff": max_diff(one_state.params, new.params), "init_diff": init_diff,
            "init_specs_ok": init_specs_ok, "key_spec": [str(a) for a in key.sharding.spec],
            "replicated_kv": kv, "report": sharding.replication_report(replicated),
            "greedy_equal": bool(np.array_equal(one_greedy.tokens, greedy.tokens)),
            "greedy_lengths_equal": bool(np.array_equal(one_greedy.lengths, greedy.lengths)),
            "beam_equal": bool(np.array_equal(one_beam.tokens, beam_out.tokens)) if beam else None,
            "beam_score_diff": max_diff(one_beam.scores, beam_out.scores) if beam else None,
            "cache_self_spec": [str(a) for a in greedy.cache.self_k[0].sharding.spec],
            "cache_cross_spec": [str(a) for a in greedy.cache.cross_k[0].sharding.spec],
            "int8_equal": bool(np.array_equal(one_int8.tokens, int8.tokens)),
            "int8_specs": [[str(a) for a in x.sharding.spec] for x in int8_entries],
            "cache_report": sharding.replication_report(cache_replicated) if cache_replicated else "",
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    parts = [c.split(":") for c in sys.argv[1:]]
    main([(p[0], int(p[1]), p[2:] != ["nobeam"]) for p in parts])
