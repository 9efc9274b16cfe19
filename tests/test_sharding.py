"""Sharding: the rule table, meshes, and a sharded train step equal to one device (8 simulated
CPU devices, in the subprocess of the ``eight_devices`` fixture, so this process keeps its single
device)."""

import math
from pathlib import Path

import jax
import numpy as np
import pytest
from eight_devices import DECODE_CASES, EQUIVALENCE_CASES

from gqa_jax import distributed, sharding


def test_sharded_init_train_step_and_decoding_equal_one_device_on_every_mesh(eight_devices):
    """tests/sharded_equivalence.py at eight_devices.EQUIVALENCE_CASES (8 simulated devices)."""
    cases = list(EQUIVALENCE_CASES)
    rows = eight_devices("equivalence")
    assert len(rows) == len(cases)
    for r in rows:
        model = int(r["mesh"].split("x")[1])
        data = int(r["mesh"].split("x")[0])
        # created sharded, same values as the one-device init (jit vs eager: float32 rounding)
        assert r["init_diff"] < 1e-6 and r["init_specs_ok"], r
        assert r["loss_sharded"] == pytest.approx(r["loss_one"], abs=1e-5), r
        assert r["max_param_diff"] < 1e-5, r
        assert r["greedy_equal"] and r["greedy_lengths_equal"], r
        if r["beam_equal"] is not None:
            assert r["beam_equal"] and r["beam_score_diff"] < 1e-5, r
        shards_kv = model > 1 and r["k"] % model == 0
        assert (r["key_spec"][1:2] == ["model"]) == shards_kv, r  # decoder self-attention K/V heads
        # the cache [B, K, T, H]: K/V heads over model as far as K allows, rows over data and the
        # rest of the model axis (the decode layout, test_every_k_decodes_on_the_decode_layout)
        assert r["int8_equal"], r  # the int8 cache (values and scales) sharded like the float one
        rows = [a for a in ("data", "autoregressive" if not shards_kv else "") if a]
        for cache_spec in (r["cache_self_spec"], r["cache_cross_spec"], *r["int8_specs"]):
            padded = cache_spec + ["None"] * (4 - len(cache_spec))
            want = [a for a in rows if a != "data" or data > 1]
            assert padded[0] == (str(tuple(want)) if len(want) > 1 else want[0] if want else "None"), r
        assert r["cache_report"] == "", r  # no cache is replicated
        if model > 1 and not shards_kv:  # the K/V projections still are (small): logged with their bytes
            assert r["replicated_kv"] == ["key", "value"] and f"{model} copies" in r["report"], r
        else:
            assert r["replicated_kv"] == [] and r["report"].startswith("no replication"), r


def test_every_k_decodes_on_the_decode_layout_as_on_one_device(eight_devices):
    """On 8 simulated devices, meshes 1x8 and 2x4, K = 1, 2, 4, 8 (N = 8), the float and the int8
    cache (tests/sharded_decode.py at eight_devices.DECODE_CASES): the greedy tokens equal one
    device's, and no cache is replicated: every device holds a distinct 1/8 of each cache array
    (heads over model as far as K allows, rows over the rest), which ``cache.cache_layout`` states
    as the formula's total / 8."""
    rows = eight_devices("decode")
    assert [f"{r['mesh']}:{r['k']}" for r in rows] == list(DECODE_CASES)
    for r in rows:
        data, model = map(int, r["mesh"].split("x"))
        heads = math.gcd(r["k"], model)  # the K/V heads' share of the model axis, the rows take the rest
        for cache in ("float", "int8"):
            c = r[cache]
            assert c["equal"], r
            for a in c["arrays"]:  # self K and cross V of layer 0 (an int8 entry: values and scales)
                assert a["distinct"] == 8 and a["per_device"] * 8 == a["total"], r
                rows_spec = a["spec"][0]
                assert ("autoregressive" in rows_spec) == (heads < model), r
                assert (a["spec"][1:2] == ["model"]) == (heads > 1), r
            assert c["replicated"] == "", r
            for kind in ("self", "cross"):
                assert c["layout_per_device"][kind] * 8 == c["layout_total"][kind], r


def test_decoding_on_a_one_device_mesh_equals_plain_decoding():
    from flax import nnx

    from gqa_jax import decoding
    from gqa_jax.config import preset
    from gqa_jax.model import T5

    model = T5(preset("tiny", num_kv_heads=2), rngs=nnx.Rngs(0))
    ids = np.random.default_rng(0).integers(2, model.config.vocab_size, (3, 7))
    mesh = sharding.make_mesh("1x1")
    plain = decoding.greedy_decode(model, ids, 5)
    meshed = decoding.greedy_decode(model, ids, 5, mesh=mesh, return_cache=True)
    np.testing.assert_array_equal(plain.tokens, meshed.tokens)
    assert meshed.cache.self_k[0].shape[1] == 2
    with pytest.raises(ValueError, match="no such mesh axis"):
        decoding.greedy_decode(model, ids, 5, mesh=mesh, rules=dict(sharding.RULES, heads="tensor"))
    with pytest.raises(ValueError, match="no entry for logical axes \\['kv_heads'\\]"):
        rules = {k: v for k, v in sharding.RULES.items() if k != "kv_heads"}
        decoding.greedy_decode(model, ids, 5, mesh=mesh, rules=rules)


def test_cache_layout_divides_the_formula_by_the_shards():
    """On 2x4, every K: heads over model as far as K allows, rows over data and the rest, so 8
    shards at batch 8; at batch 4, K = 1 cannot split its rows 8 ways: they split over data and
    the 4 copies over ``autoregressive`` are reported."""
    from gqa_jax import cache
    from gqa_jax.config import preset

    mesh = jax.sharding.AbstractMesh((2, 4), ("data", "model"))
    for k, batch, shards in ((8, 8, 8), (4, 8, 8), (2, 8, 8), (1, 8, 8), (2, 4, 8), (1, 4, 2)):
        cfg = preset("tiny", num_heads=8, num_kv_heads=k, grouped_attentions=("decoder_self", "cross"))
        layout, replicated = cache.cache_layout(cfg, mesh, batch, 16, 8, "bfloat16")
        total = cache.expected_cache_bytes(cfg, batch, 16, 8, "bfloat16")
        for kind in ("self", "cross"):
            assert layout[kind]["total_bytes"] == total[kind]
            assert layout[kind]["shards"] == shards
            assert layout[kind]["bytes_per_device"] == total[kind] // shards
        assert bool(replicated) == (shards < 8)
        if replicated:
            report = sharding.replication_report(replicated)
            assert "cache_batch (4) replicated over autoregressive (4): 4 copies" in report


def test_spec_follows_the_rules():
    mesh = sharding.make_mesh("1x1")
    assert sharding.spec(("embed", "heads", "head_dim"), (8, 4, 2), mesh) == jax.sharding.PartitionSpec(
        None, None, None
    )
    fake = type("M", (), {"shape": {"data": 2, "model": 4}, "axis_names": ("data", "model")})()
    replicated = []
    ps = sharding.spec(("embed", "kv_heads", "head_dim"), (8, 2, 4), fake, replicated=replicated, name="k")
    assert tuple(ps) == (None, None, None) and replicated[0].copies == 4
    assert tuple(sharding.spec(("embed", "kv_heads", "head_dim"), (8, 8, 4), fake)) == (None, "model", None)
    assert tuple(sharding.spec(("batch", "length"), (6, 3), fake)) == ("data", None)
    assert tuple(sharding.spec(("vocab", "embed"), (12, 4), fake)) == ("model", None)


def test_fsdp_rules_split_parameters_over_data_but_not_activations_twice():
    fake = type("M", (), {"shape": {"data": 2, "model": 4}, "axis_names": ("data", "model")})()
    rules = sharding.train_rules(True, 8, fake)
    assert rules["embed"] == "data" and sharding.train_rules(False, 8, fake) is sharding.RULES
    assert tuple(sharding.spec(("embed", "mlp"), (8, 16), fake, rules)) == ("data", "model")
    # the residual stream [B, T, D]: its rows already take data, so D stays whole
    assert tuple(sharding.spec(("batch", "length", "embed"), (4, 3, 8), fake, rules)) == ("data", None, None)
    with pytest.raises(ValueError, match=r"fsdp: the data axis \(2 devices\) does not divide d_model=7"):
        sharding.train_rules(True, 7, fake)


def test_bad_input():
    with pytest.raises(ValueError, match="needs 16 devices"):
        sharding.make_mesh("2x8")
    with pytest.raises(ValueError, match="DATAxMODEL"):
        sharding.make_mesh("2by4")
    mesh = sharding.make_mesh("1x1")
    with pytest.raises(ValueError, match="unknown logical axis 'experts'"):
        sharding.spec(("experts",), (4,), mesh)
    with pytest.raises(ValueError, match="no such mesh axis"):
        sharding.spec(("batch",), (4,), mesh, {"batch": "replica"})
    fake = type("M", (), {"shape": {"data": 2, "model": 1}})()
    with pytest.raises(ValueError, match="not divisible by the data axis size 2"):
        sharding.check_batch({"encoder_input_tokens": np.zeros((3, 4))}, fake)
    with pytest.raises(ValueError, match="rule 'heads' -> 'tensor': no such mesh axis"):
        sharding.check_rules(dict(sharding.RULES, heads="tensor"), mesh)
    with pytest.raises(ValueError, match="no entry for logical axes"):
        sharding.check_rules({"batch": "data"}, mesh)
    with pytest.raises(ValueError, match="without the number of processes"):
        distributed.initialize_distributed("127.0.0.1:1234")


def test_train_config_mesh_errors():
    from gqa_jax import run_config, training

    config = run_config.load(Path(__file__).resolve().parents[1] / "configs" / "base.py")
    config.mesh = "2x4"
    config.batch_size = 7
    with pytest.raises(ValueError, match="batch_size=7 is not divisible by the data axis \\(2\\)"):
        training.check_config(config)
    config.batch_size, config.num_microbatches = 8, 8
    with pytest.raises(ValueError, match="micro-batches of 1 rows do not split"):
        training.check_config(config)
    config.mesh = "2by4"
    with pytest.raises(ValueError, match="DATAxMODEL"):
        training.check_config(config)
