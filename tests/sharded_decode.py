"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/eight_devices.py runs it
for test_sharding.py): for each K and mesh, greedy decoding with the float and the int8 cache on
the decode layout against one device; prints one JSON line per case (MESH:K)."""

import json
import sys

import jax
import numpy as np
from flax import nnx

from gqa_jax import cache as kvcache
from gqa_jax import decoding, sharding
from gqa_jax.config import preset
from gqa_jax.model import T5


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
    ids = np.random.default_rng(2).integers(2, 64, (8, 12))
    ids[3, 5:] = 0  # rows of different lengths
    ids[6, 2:] = 0
    references = {}  # K -> (config, model, one device's tokens per cache dtype): each mesh compares to it
    for mesh_text, k in cases:
        if k not in references:
            cfg = preset(
                "tiny",
                num_heads=8,
                head_dim=4,
                num_kv_heads=k,
                vocab_size=64,
                num_encoder_layers=1,
                num_decoder_layers=1,
            )
            with jax.default_device(jax.devices()[0]):
                model = T5(cfg, rngs=nnx.Rngs(0))
                one = {d: decoding.greedy_decode(model, ids, 10, cache_dtype=d) for d in (None, "int8")}
            references[k] = cfg, model, one
        cfg, model, one = references[k]
        mesh = sharding.make_mesh(mesh_text)
        split = nnx.split(model)
        row = {"mesh": mesh_text, "k": k}
        for dtype in (None, "int8"):
            out = decoding.greedy_decode(split, ids, 10, mesh=mesh, return_cache=True, cache_dtype=dtype)
            c = out.cache
            layout, replicated = kvcache.cache_layout(cfg, mesh, 8, 12, 10, dtype or cfg.dtype)
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
