"""The 8-bit KV cache: quantization error, attention on the scales, bytes = formula, decoding
agreement with the float cache (greedy, sampling, beam search, the CPU step), and its errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gqa_jax import decoding, kv_quant
from gqa_jax.attention import grouped_attention
from gqa_jax.beam_search import beam_search, length_penalty
from gqa_jax.cache import cache_bytes, expected_cache_bytes
from gqa_jax.config import preset
from gqa_jax.model import T5, shift_right

V = 64
ENC = np.array([[5, 6, 7, 8, 9, 10, 11, 12], [11, 12, 13, 3, 0, 0, 0, 0], [14, 15, 0, 0, 0, 0, 0, 0]])


def test_int8_round_trip_is_within_half_a_step_and_zeros_stay_zero():
    x = jax.random.normal(jax.random.key(0), (2, 3, 5, 16)) * jnp.arange(1, 6)[None, None, :, None]
    x = x.at[0, 0, 0].set(0.0)
    q = kv_quant.quantize(x, "int8")
    assert q.values.dtype == jnp.int8 and q.scale.shape == (2, 3, 5, 1) and q.scale.dtype == jnp.float32
    err = jnp.abs(kv_quant.dequantize(q) - x)
    assert bool(jnp.all(err <= q.scale / 2 + 1e-7))
    assert int(jnp.abs(q.values).max()) == 127  # each row's largest entry uses the full range
    assert bool(jnp.all(kv_quant.dequantize(q)[0, 0, 0] == 0.0))
    fp8 = kv_quant.quantize(x, "float8_e4m3fn")
    assert (
        float(jnp.max(jnp.abs(kv_quant.dequantize(fp8) - x) / (jnp.abs(x).max(-1, keepdims=True) + 1e-9)))
        < 0.07
    )


@functools.partial(jax.jit, static_argnums=0)
def attention_both_ways(K: int) -> tuple[jax.Array, jax.Array]:
    """Attention on an int8 cache of K heads: on its scales, and on the cache dequantized (one
    program, not one per eager op)."""
    kq, kk, kv_, kb = jax.random.split(jax.random.key(K), 4)
    B, N, S, H = 2, 4, 7, 8
    q = jax.random.normal(kq, (B, 1, N, H))
    k = kv_quant.quantize(jax.random.normal(kk, (B, K, S, H)), "int8")
    v = kv_quant.quantize(jax.random.normal(kv_, (B, K, S, H)), "int8")
    bias = jax.random.normal(kb, (N, 1, S))
    mask = jnp.arange(S)[None, None, :] < jnp.array([7, 4])[:, None, None]
    got = grouped_attention(q, k, v, bias=bias, mask=mask)
    want = grouped_attention(q, kv_quant.dequantize(k), kv_quant.dequantize(v), bias=bias, mask=mask)
    return got, want


@pytest.mark.parametrize("K", [4, 2, 1])
def test_attention_on_scales_equals_attention_on_the_dequantized_cache(K):
    got, want = attention_both_ways(K)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def tiny(num_kv: int) -> T5:
    """One encoder and one decoder layer: every layer's cache is quantized alike (half the compile)."""
    config = preset("tiny", vocab_size=V, num_kv_heads=num_kv, num_encoder_layers=1, num_decoder_layers=1)
    return T5(config, rngs=nnx.Rngs(0))


@nnx.jit
def logprobs(model: T5, enc: jax.Array, seqs: jax.Array) -> jax.Array:
    """Teacher-forced log-probabilities of ``seqs``: one program, not one per eager op."""
    return jax.nn.log_softmax(model(enc, shift_right(seqs)))


@pytest.fixture(scope="module", params=[4, 2, 1], ids=["mha", "gqa2", "mqa"])
def model(request):
    return tiny(request.param)


@pytest.mark.parametrize("dtype", ["int8", "float8_e4m3fn"])
def test_quantized_cache_decodes_like_the_float_cache_and_its_bytes_are_the_formula(model, dtype):
    base = decoding.greedy_decode(model, ENC, 10, eos_id=-1, return_logits=True, return_cache=True)
    out = decoding.greedy_decode(
        model, ENC, 10, eos_id=-1, return_logits=True, return_cache=True, cache_dtype=dtype
    )
    assert isinstance(out.cache.self_k[0], kv_quant.QuantizedKV)
    assert out.cache.cross_k[0].values.dtype == jnp.dtype(dtype)
    assert cache_bytes(out.cache) == expected_cache_bytes(model.config, 3, 8, 10, dtype)
    H = model.config.head_dim
    ratio = cache_bytes(out.cache)["total"] / cache_bytes(base.cache)["total"]
    assert ratio == pytest.approx((H + 4) / (4 * H))  # against float32
    # until a row's first differing token both decode the same prefix: there the logits stay close
    a, b = np.asarray(out.tokens), np.asarray(base.tokens)
    first_diff = np.where((a != b).any(1), (a != b).argmax(1), a.shape[1])
    scale = float(jnp.abs(base.logits).max())
    tol = 0.02 if dtype == "int8" else 0.1
    for row, upto in enumerate(first_diff):
        diff = jnp.abs(out.logits[row, : upto + 1] - base.logits[row, : upto + 1]).max()
        assert float(diff) <= tol * scale, (row, upto)
    if dtype == "int8":
        assert float(np.mean(a == b)) >= 0.9


@pytest.fixture(scope="module")
def gqa():
    return tiny(2)


def test_quantized_cache_in_sampling_beam_search_and_a_plain_dtype(gqa):
    model = gqa
    key = jax.random.key(3)
    a = decoding.sample_decode(model, ENC, 8, key=key, temperature=0.7, cache_dtype="int8")
    b = decoding.sample_decode(model, ENC, 8, key=key, temperature=0.7, cache_dtype="int8")
    np.testing.assert_array_equal(a.tokens, b.tokens)  # deterministic with the key
    one = beam_search(model, ENC, 8, beam_size=1, alpha=0.0, cache_dtype="int8")
    greedy = decoding.greedy_decode(model, ENC, 8, cache_dtype="int8")
    np.testing.assert_array_equal(one.tokens[:, 0], greedy.tokens)  # one beam is greedy, cache and all
    beams = beam_search(model, ENC, 8, beam_size=2, cache_dtype="int8")  # reorders quantized entries
    # each hypothesis is scored as the float model scores its tokens teacher-forced (the search
    # itself may differ: a near tie can let another candidate finish)
    for w in range(2):
        seqs, lengths = jnp.asarray(beams.tokens[:, w]), np.asarray(beams.lengths[:, w])
        logp = logprobs(model, jnp.asarray(ENC), seqs)
        picked = np.take_along_axis(np.asarray(logp), np.asarray(seqs)[..., None], -1)[..., 0]
        summed = np.array([picked[r, : lengths[r]].sum() for r in range(len(ENC))])
        want = summed / np.asarray(length_penalty(jnp.asarray(lengths), 0.6))
        np.testing.assert_allclose(beams.scores[:, w], want, rtol=0.01)
    half = decoding.greedy_decode(model, ENC, 8, return_cache=True, cache_dtype=jnp.bfloat16)
    assert half.cache.self_k[0].dtype == jnp.bfloat16 and half.cache.cross_v[0].dtype == jnp.bfloat16
    assert cache_bytes(half.cache) == expected_cache_bytes(model.config, 3, 8, 8, "bfloat16")


@pytest.mark.parametrize("bad", ["int4", "uint8", "float64", "int16", "fp8", 3])
def test_unknown_cache_dtypes_are_refused_naming_the_choices(gqa, bad):
    model = gqa
    with pytest.raises(ValueError, match="is not a KV-cache dtype: use one of .*int8"):
        decoding.greedy_decode(model, ENC, 4, cache_dtype=bad)
    with pytest.raises(ValueError, match="is not a KV-cache dtype"):
        beam_search(model, ENC, 4, cache_dtype=bad)


def test_a_backend_that_cannot_compile_the_quantized_cache_is_refused_before_decoding(monkeypatch):
    real = kv_quant.quantize

    def no_fp8(x, cache_dtype):
        if cache_dtype == "float8_e5m2":
            raise TypeError("float8_e5m2 is not supported on this backend")  # as an XLA lowering error
        return real(x, cache_dtype)

    monkeypatch.setattr(kv_quant, "quantize", no_fp8)
    monkeypatch.setattr(kv_quant, "probe_backend", kv_quant.probe_backend.__wrapped__)
    with pytest.raises(
        ValueError, match="the cpu backend cannot hold a float8_e5m2 KV cache .*use cache_dtype='int8'"
    ):
        kv_quant.check_cache_dtype("float8_e5m2")
    assert kv_quant.check_cache_dtype("int8") == "int8"
