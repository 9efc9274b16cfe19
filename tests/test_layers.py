"""Building blocks: relative position buckets (hand-checked), RMS norm, MLP."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gqa_jax.config import preset
from gqa_jax.layers import MLP, RelativePositionBias, RMSNorm, relative_position_bucket

# relative position = key position - query position. Hand-derived for 32 buckets, max distance
# 128. Bidirectional: 16 buckets per direction, 8 exact; keys after the query get +16; a
# distance d >= 8 goes to 8 + floor(log(d / 8) / log(128 / 8) * 8), capped at 15.
#   d=16: 8 + floor(0.25 * 8) = 10;  d=32: 8 + floor(0.5 * 8) = 12;  d=64: 8 + 6 = 14;
#   d=127: 8 + floor(7.88) = 15;     d>=128: capped at 15.
BIDIRECTIONAL = {
    0: 0, -1: 1, -7: 7, -8: 8, -11: 8, -12: 9, -16: 10, -32: 12, -64: 14, -127: 15, -128: 15,
    -1000: 15, 1: 17, 7: 23, 8: 24, 16: 26, 64: 30, 128: 31, 5000: 31,
}  # fmt: skip
# Causal: 32 buckets for the past, 16 exact; future keys (masked anyway) are bucket 0.
# A distance d >= 16 goes to 16 + floor(log(d / 16) / log(128 / 16) * 16), capped at 31.
#   d=32: 16 + floor(16 / 3) = 21;  d=64: 16 + floor(32 / 3) = 26;  d=127: 16 + 15 = 31.
CAUSAL = {
    0: 0, 5: 0, 1000: 0, -1: 1, -15: 15, -16: 16, -23: 18, -32: 21, -64: 26, -127: 31,
    -128: 31, -4096: 31,
}  # fmt: skip


@pytest.mark.parametrize("bidirectional, table", [(True, BIDIRECTIONAL), (False, CAUSAL)])
def test_relative_position_bucket_hand_checked(bidirectional, table):
    rel = jnp.array(list(table))
    got = relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=32, max_distance=128)
    assert dict(zip(table, np.asarray(got).tolist(), strict=True)) == table


def test_relative_position_bias_is_per_query_head_and_shaped_n_t_s():
    cfg = preset("tiny")
    rpb = RelativePositionBias(cfg, bidirectional=True, rngs=nnx.Rngs(0))
    bias = rpb(jnp.arange(5), jnp.arange(7))
    assert bias.shape == (cfg.num_heads, 5, 7)
    table = np.asarray(rpb.embedding[...])
    # Query 2 / key 2 is distance 0: bucket 0 of every head's column.
    np.testing.assert_array_equal(np.asarray(bias[:, 2, 2]), table[0])
    # Query 0 / key 1 is one step in the future: bucket num_buckets // 2 + 1.
    np.testing.assert_array_equal(
        np.asarray(bias[:, 0, 1]), table[cfg.relative_attention_num_buckets // 2 + 1]
    )


def test_rms_norm_matches_formula_in_float32():
    cfg = preset("tiny", dtype="bfloat16")
    norm = RMSNorm(8, cfg)
    norm.scale[...] = jnp.linspace(0.5, 2.0, 8)
    x = jax.random.normal(jax.random.key(0), (2, 3, 8)) * 10
    y = norm(x.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    x32 = np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32))
    want = x32 / np.sqrt(np.mean(x32**2, -1, keepdims=True) + 1e-6) * np.linspace(0.5, 2.0, 8)
    np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=1e-2)


def test_gated_gelu_mlp_matches_formula():
    cfg = preset("tiny")
    mlp = MLP(cfg, rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.key(1), (2, 3, cfg.d_model))
    h = jax.nn.gelu(x @ mlp.wi_0[...], approximate=True) * (x @ mlp.wi_1[...])
    np.testing.assert_allclose(np.asarray(mlp(x)), np.asarray(h @ mlp.wo[...]), atol=1e-5)
    relu = MLP(preset("tiny", mlp_activation="relu"), rngs=nnx.Rngs(1))
    assert not hasattr(relu, "wi_1")
    np.testing.assert_allclose(
        np.asarray(relu(x)), np.asarray(jax.nn.relu(x @ relu.wi_0[...]) @ relu.wo[...]), atol=1e-5
    )
