"""Grouped attention: K = N is MHA, GQA/MQA equal a repeat-K/V reference, contiguous groups."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gqa_jax.attention import ONE_HEAD_AT_A_TIME_BELOW, Attention, grouped_attention
from gqa_jax.config import preset

B, T, S, N, H = 2, 3, 5, 8, 4


def reference_mha(q, k, v, bias=None, mask=None):
    """Plain multi-head attention, one K/V head per query head. q [B,T,N,H], k/v [B,N,S,H]."""
    logits = jnp.einsum("btnh,bnsh->bnts", q, k)
    if bias is not None:
        logits = logits + bias[None]
    if mask is not None:
        logits = jnp.where(mask[:, None], logits, -1e10)
    return jnp.einsum("bnts,bnsh->btnh", jax.nn.softmax(logits, -1), v)


def repeat_kv(x, groups):
    """[B, K, S, H] -> [B, K * groups, S, H]: K/V head j serves query heads j*G .. j*G+G-1."""
    return jnp.repeat(x, groups, axis=1)


def inputs(num_kv, seed=0):
    kq, kk, kv, kb, km = jax.random.split(jax.random.key(seed), 5)
    q = jax.random.normal(kq, (B, T, N, H))
    k = jax.random.normal(kk, (B, num_kv, S, H))
    v = jax.random.normal(kv, (B, num_kv, S, H))
    bias = jax.random.normal(kb, (N, T, S))
    mask = jax.random.bernoulli(km, 0.7, (B, T, S)).at[:, :, 0].set(True)
    return q, k, v, bias, mask


def test_k_equals_n_is_exactly_mha():
    q, k, v, bias, mask = inputs(N)
    got = grouped_attention(q, k, v, bias=bias, mask=mask)
    want = reference_mha(q, k, v, bias, mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)


@pytest.mark.parametrize("num_kv", [4, 2, 1])
def test_gqa_and_mqa_equal_repeated_kv_reference(num_kv):
    q, k, v, bias, mask = inputs(num_kv, seed=num_kv)
    got = grouped_attention(q, k, v, bias=bias, mask=mask)
    G = N // num_kv
    want = reference_mha(q, repeat_kv(k, G), repeat_kv(v, G), bias, mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)


def test_query_head_n_reads_kv_head_n_div_g():
    # K = 2, N = 8, G = 4: every value of K/V head j equals j, so any attention pattern
    # returns j; query heads 0-3 must see 0 and heads 4-7 must see 1 (contiguous, not strided).
    q, k, _, _, _ = inputs(2)
    v = jnp.broadcast_to(jnp.arange(2.0)[None, :, None, None], (B, 2, S, H))
    out = grouped_attention(q, k, v)
    np.testing.assert_allclose(np.asarray(out[0, 0, :, 0]), [0, 0, 0, 0, 1, 1, 1, 1], atol=1e-6)


def test_bias_is_per_query_head_not_averaged_over_the_group():
    q, k, v, _, _ = inputs(1)
    bias = jnp.zeros((N, T, S)).at[3, :, 2].set(50.0)  # only query head 3 is pushed to key 2
    out = grouped_attention(q, k, v, bias=bias)
    np.testing.assert_allclose(
        np.asarray(out[:, :, 3]), np.asarray(v[:, 0, 2])[:, None].repeat(T, 1), atol=1e-5
    )
    plain = grouped_attention(q, k, v)
    np.testing.assert_array_equal(np.asarray(out[:, :, :3]), np.asarray(plain[:, :, :3]))


def test_masked_keys_have_no_influence():
    q, k, v, bias, _ = inputs(2)
    mask = jnp.ones((B, 1, S), bool).at[:, :, 3:].set(False)
    out = grouped_attention(q, k, v, bias=bias, mask=mask)
    k2 = k.at[:, :, 3:].set(1e3)
    v2 = v.at[:, :, 3:].set(-7.0)
    np.testing.assert_array_equal(
        np.asarray(out), np.asarray(grouped_attention(q, k2, v2, bias=bias, mask=mask))
    )


def test_no_logit_scaling():
    # T5 does not divide logits by sqrt(H): one query against two keys gives softmax(q.k) exactly.
    q = jnp.array([1.0, 2.0, 0.0, 0.0]).reshape(1, 1, 1, 4)
    k = jnp.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]).reshape(1, 1, 2, 4)
    v = jnp.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]).reshape(1, 1, 2, 4)
    out = grouped_attention(q, k, v)
    p = np.exp([1.0, 2.0]) / np.exp([1.0, 2.0]).sum()
    np.testing.assert_allclose(np.asarray(out[0, 0, 0, :2]), p, atol=1e-6)


def test_attention_module_shapes_and_errors():
    cfg = preset("tiny")
    attn = Attention(cfg, 2, rngs=nnx.Rngs(0))
    assert attn.query.shape == (cfg.d_model, 4, cfg.head_dim)
    assert attn.key.shape == attn.value.shape == (cfg.d_model, 2, cfg.head_dim)
    assert attn.out.shape == (4, cfg.head_dim, cfg.d_model)
    x = jnp.ones((B, T, cfg.d_model))
    k, v = attn.project_kv(x)
    assert k.shape == (B, 2, T, cfg.head_dim)  # K/V stay at K heads, never N
    assert attn(x, x).shape == (B, T, cfg.d_model)
    with pytest.raises(ValueError, match="num_heads=4 not divisible by num_kv_heads=3"):
        Attention(cfg, 3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="N=8 not divisible by K/V heads K=3"):
        grouped_attention(jnp.ones((1, 1, 8, 2)), jnp.ones((1, 3, 1, 2)), jnp.ones((1, 3, 1, 2)))


def step_inputs(num_heads, num_kv, seed):
    """One decoded position: q [B, 1, N, H], k / v [B, K, S, H], a per-row bias [B, N, 1, S] and a
    key mask [B, 1, S]."""
    r = np.random.default_rng(seed)
    B, S, H = 3, 10, 8
    q = jnp.asarray(r.standard_normal((B, 1, num_heads, H)), jnp.float32)
    k, v = (jnp.asarray(r.standard_normal((B, num_kv, S, H)), jnp.float32) for _ in range(2))
    bias = jnp.asarray(r.standard_normal((B, num_heads, 1, S)), jnp.float32)
    mask = jnp.asarray(r.random((B, 1, S)) < 0.7).at[:, :, 0].set(True)
    return q, k, v, bias, mask


@pytest.mark.parametrize("num_heads, num_kv", [(6, 3), (6, 2), (6, 1), (16, 1)])
def test_one_decoded_position_gives_the_same_numbers_in_either_loop_order(num_heads, num_kv):
    """One query position (a decode step), a per-row bias [B, N, 1, S] and a key mask [B, 1, S]:
    the group's heads all at once (2 products) or one at a time (2 G products, the CPU decode
    kernel's order) give the numbers of plain MHA over the repeated K/V."""
    q, k, v, bias, mask = step_inputs(num_heads, num_kv, num_heads + num_kv)
    G = num_heads // num_kv
    logits = jnp.einsum("btnh,bnsh->bnts", q, repeat_kv(k, G)) + bias  # [B, N, 1, S]
    probs = jax.nn.softmax(jnp.where(mask[:, None], logits, -1e10), -1)
    want = jnp.einsum("bnts,bnsh->btnh", probs, repeat_kv(v, G))
    for one_at_a_time, products in ((False, 2), (True, 2 * G)):

        def attend(q, k, v, one_at_a_time=one_at_a_time):
            return grouped_attention(q, k, v, bias=bias, mask=mask, one_head_at_a_time=one_at_a_time)

        np.testing.assert_allclose(np.asarray(attend(q, k, v)), np.asarray(want), rtol=1e-5, atol=1e-5)
        assert str(jax.make_jaxpr(attend)(q, k, v)).count("dot_general") == products


def test_the_decode_kernel_is_fixed_when_the_model_is_built():
    """A model's decode kernel is a constructor argument (``T5(kernel=)``), "einsum" by default:
    every module that takes a product holds the one it was built with, and a decode program on
    one CPU device builds its step's model with "cpu" (``decoding.step_model``); ``cpu_step``
    keeps no state."""
    from gqa_jax import cpu_step, decoding
    from gqa_jax.config import DecodeConfig
    from gqa_jax.model import T5

    assert not any(isinstance(v, threading.local) for v in vars(cpu_step).values())
    config = preset("tiny", num_kv_heads=2)

    def kernels(m):
        return {x.kernel for _, x in nnx.iter_modules(m) if "kernel" in vars(x)}

    assert kernels(T5(config, rngs=nnx.Rngs(0))) == {"einsum"}
    assert kernels(T5(config, rngs=nnx.Rngs(0), kernel="cpu")) == {"cpu", "einsum"}  # the encoder's
    graphdef, params = nnx.split(T5(config, rngs=nnx.Rngs(0)))
    for kernel in ("cpu", "einsum"):
        dc = DecodeConfig(max_decode_len=2, kernel=kernel)
        stepping = decoding.step_model(graphdef, decoding.step_weights(graphdef, params, dc), dc)
        assert stepping.kernel == kernel and stepping.decoder.layers[0].self_attn.kernel == kernel
        assert stepping.encoder.layers[0].attn.kernel == "einsum"  # the prefill's: many rows
    with pytest.raises(ValueError, match="kernel='pallas'; choose from einsum, cpu"):
        DecodeConfig(max_decode_len=2, kernel="pallas")
    # the one size that selects a loop order: groups of fewer than ONE_HEAD_AT_A_TIME_BELOW query
    # heads one head at a time under the CPU kernel, larger groups (and the einsum kernel) all at once
    for kernel, G, one in (("cpu", 4, True), ("cpu", 8, False), ("einsum", 4, False), ("cpu", 1, True)):
        attn = Attention(preset("tiny", num_heads=8), 8 // G, rngs=nnx.Rngs(0), kernel=kernel)
        assert attn.one_head_at_a_time == one and (G < ONE_HEAD_AT_A_TIME_BELOW) == (G <= 4), (kernel, G)
