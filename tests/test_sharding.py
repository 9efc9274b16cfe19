"""Sharding: the rule table, meshes, and a sharded train step equal to one device (8 simulated
CPU devices, in a subprocess so this process keeps its single device)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from gqa_jax import sharding

HERE = Path(__file__).resolve().parent


# Each mesh once, each K in {1, 2, 8} at least once, sharded and replicated K/V heads both covered.
# The whole 4 x 3 matrix: XLA_FLAGS=--xla_force_host_platform_device_count=8 python
# tests/sharded_equivalence.py 1x8:1 1x8:2 1x8:8 2x4:1 2x4:2 2x4:8 4x2:1 4x2:2 4x2:8 8x1:1 8x1:2 8x1:8
CASES = ("1x8:1", "2x4:2", "4x2:8", "8x1:2")


def test_sharded_train_step_equals_one_device_on_every_mesh():
    cases = list(CASES)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, str(HERE / "sharded_equivalence.py"), *cases],
        env=env, capture_output=True, text=True, timeout=900, cwd=HERE.parent,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(cases)
    for r in rows:
        model = int(r["mesh"].split("x")[1])
        assert r["loss_sharded"] == pytest.approx(r["loss_one"], abs=1e-5), r
        assert r["max_param_diff"] < 1e-5, r
        shards_kv = model > 1 and r["k"] % model == 0
        assert (r["key_spec"][1] == "model") == shards_kv, r  # decoder self-attention K/V heads
        if model > 1 and not shards_kv:
            assert r["replicated_kv"] == ["key", "value"] and f"{model} copies" in r["report"], r
        else:
            assert r["replicated_kv"] == [], r


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
