"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/eight_devices.py runs it
for test_sharding.py): for each K and mesh, greedy decoding with the float and the int8 cache on
the decode layout against one device; prints one JSON line per case (MESH:K). ``one_device(k)``
is the model and its one-device decodes, shared with tests/sharded_equivalence.py (same config,
same inputs), so each reference and each program common to both parts is compiled once."""

import functools
import json
import sys

import jax
import numpy as np
from flax import nnx

from gqa_jax import cache as kvcache
from gqa_jax import decoding, sharding, training
from gqa_jax.config import preset
from gqa_jax.model import T5

DECODE_LEN = 10


def config(k: int):
    """The 8-head model of both parts with ``k`` K/V heads (1 encoder, 1 decoder layer)."""
    return preset("tiny", num_heads=8, head_dim=4, num_kv_heads=k, num_encoder_layers=1, num_decoder_layers=1)


def inputs(vocab_size: int) -> np.ndarray:
    """8 rows of 12 input ids, two of them shorter (pad after)."""
    ids = np.random.default_rng(2).integers(2, vocab_size, (8, 12))
    ids[3, 5:] = 0  # rows of different lengths
    ids[6, 2:] = 0
    return ids


@functools.cache
def one_device(k: int) -> tuple:
    """``(config, model, {cache dtype: greedy decode})`` of K = ``k``, all on one device."""
    cfg = config(k)
    ids = inputs(cfg.vocab_size)
    with jax.default_device(jax.devices()[0]):
        model = T5(cfg, rngs=nnx.Rngs(0))
        one = {d: decoding.greedy_decode(model, ids, DECODE_LEN, cache_dtype=d) for d in (None, "int8")}
    return cfg, model, one


def spread(x) -> dict:
    """How an array lies: its spec, and whether every device holds a distinct 1/devices of it."""
    shards = x.addressable_shards
    distinct = len({tuple((s.start, s.stop) for s in shard.index) for shard in shards})
    return {
        "spec": [str(a) for a in x.sharding.spec],
        "per_device": shards[0].data.nbytes,
        "total": x.nbytes,
        "distinct": distinct,
    }


def main(cases):
    assert jax.device_count() == 8, jax.devices()
    for mesh_text, k in cases:
        cfg, model, one = one_device(k)  # each mesh compares to it
        ids = inputs(cfg.vocab_size)
        mesh = sharding.make_mesh(mesh_text)
        # as sharded_equivalence's (graphdef, pure dict): the same decode programs; from the host,
        # so placing it compiles no resharding programs
        graphdef, params = training.split_model(model)
        split = graphdef, jax.tree.map(np.asarray, params)
        row = {"mesh": mesh_text, "k": k}
        for dtype in (None, "int8"):
            out = decoding.greedy_decode(
                split, ids, DECODE_LEN, mesh=mesh, return_cache=True, cache_dtype=dtype
            )
            c = out.cache
            layout, replicated = kvcache.cache_layout(cfg, mesh, 8, 12, DECODE_LEN, dtype or cfg.dtype)
            row[dtype or "float"] = {
                "equal": bool(np.array_equal(one[dtype].tokens, out.tokens))
                and bool(np.array_equal(one[dtype].lengths, out.lengths)),
                "arrays": [spread(x) for x in jax.tree.leaves((c.self_k[0], c.cross_v[0]))],
                "layout_per_device": {kind: layout[kind]["bytes_per_device"] for kind in layout},
                "layout_total": {kind: layout[kind]["total_bytes"] for kind in layout},
                "replicated": sharding.replication_report(replicated) if replicated else "",
            }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main([(c.split(":")[0], int(c.split(":")[1])) for c in sys.argv[1:]])
