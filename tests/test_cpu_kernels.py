"""The CPU decode step's kernels (``gqa_jax.cpu_kernels``): the attention gives grouped_attention's
numbers for one query position, float32 and int8 caches, every group size; the greedy token is
jnp.argmax's, by the kernel and by the reductions; where each is taken and where not; a compiler
that fails is one line and XLA's products."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gqa_jax import cpu_kernels, cpu_step, decoding, kv_quant
from gqa_jax.attention import Attention, grouped_attention
from gqa_jax.config import preset
from gqa_jax.model import T5


def inputs(B, N, K, S, H, seed=0):
    r = np.random.default_rng(seed)
    q = jnp.asarray(r.standard_normal((B, 1, N, H)), jnp.float32)
    k, v = (jnp.asarray(r.standard_normal((B, K, S, H)), jnp.float32) for _ in range(2))
    return q, k, v


SHAPES = [(8, 8, 40, 16), (8, 4, 37, 32), (8, 2, 16, 16), (8, 1, 45, 16), (16, 2, 70, 64), (6, 2, 33, 128)]


@pytest.mark.parametrize("N, K, S, H", SHAPES)
@pytest.mark.parametrize("cache_dtype", ["float32", "int8"])
def test_the_kernel_gives_grouped_attentions_numbers(N, K, S, H, cache_dtype):
    """Groups of 1, 2, 3, 4 and 8 query heads (the values weighed 8, 4, 2 and 1 rows at a time),
    head dims 16, 32, 64 and 128, key lengths off the kernel's 16-key blocks, a shared and a
    per-row bias, a prefix mask (a self cache), a padding mask, and a row with every key hidden
    (uniform)."""
    B = 3
    q, k, v = inputs(B, N, K, S, H)
    if cache_dtype == "int8":
        k, v = kv_quant.quantize(k, "int8"), kv_quant.quantize(v, "int8")
    r = np.random.default_rng(1)
    shared = jnp.asarray(r.standard_normal((N, 1, S)), jnp.float32)
    per_row = jnp.asarray(r.standard_normal((B, N, 1, S)), jnp.float32)
    prefix = jnp.arange(S)[None, None, :] <= 5  # [1, 1, S]: positions 0..5 written
    padding = jnp.asarray(r.random((B, 1, S)) < 0.6).at[0, 0, 0].set(True).at[2].set(False)  # row 2: none
    for bias, mask in ((shared, prefix), (per_row, padding), (None, padding), (None, None)):
        want = jax.jit(grouped_attention)(q, k, v, bias=bias, mask=mask)
        got = jax.jit(cpu_kernels.attend)(q, k, v, bias=bias, mask=mask)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


def test_a_cpu_decode_takes_the_kernel_and_gives_the_einsum_kernels_tokens():
    """A head dim of 16: under the "cpu" decode kernel each cached attention of the step is the
    kernel's call (float32 and int8 caches, one and two K/V heads), and so is the greedy token; the
    self cache keeps its head axis, and the tokens and logits are the "einsum" kernel's."""
    enc = jnp.asarray([[5, 6, 7, 8, 9, 10], [11, 12, 3, 0, 0, 0]], jnp.int32)
    for K, cache_dtype in ((1, None), (2, "int8")):
        model = T5(preset("tiny", vocab_size=16, num_kv_heads=K, head_dim=16), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model)
        out = {}
        for kernel in ("einsum", "cpu"):
            config = decoding.decode_config(6, return_logits=True, cache_dtype=cache_dtype)
            config = dataclasses.replace(config, kernel=kernel)

            def run(params, config=config, graphdef=graphdef):
                return decoding.prefill_and_decode(
                    graphdef,
                    params,
                    enc,
                    jax.random.key(0),
                    jnp.float32(0.0),
                    config=config,
                    mesh=None,
                    rules=None,
                )

            text = jax.jit(run).lower(params).as_text()
            assert ("gqa_jax_cpu_attention" in text) == (kernel == "cpu"), kernel
            assert ("gqa_jax_cpu_argmax" in text) == (kernel == "cpu"), kernel
            out[kernel] = run(params)
        assert out["cpu"].cache.self_k[0].shape[:2] == (2, K)  # [B, K, T, H]: no flat one-head form
        np.testing.assert_array_equal(np.asarray(out["cpu"].tokens), np.asarray(out["einsum"].tokens))
        np.testing.assert_allclose(np.asarray(out["cpu"].logits), np.asarray(out["einsum"].logits), atol=1e-5)


def greedy_cases():
    """``[B, V]`` logits: ties, a row of -inf, a row with two NaNs, a constant row; 16 rows at a
    time, rows beyond a multiple of 16 (one at a time), fewer rows that divide 16 (several tokens
    a vector, and tokens past the last whole vector), vocabularies shorter than the kernel's 4 runs."""
    r = np.random.default_rng(0)
    shapes = ((32, 8000), (3, 7), (17, 100), (16, 1), (48, 33), (1, 5), (2, 2), (8, 100), (4, 33), (1, 40))
    for B, V in shapes:
        x = r.standard_normal((B, V)).astype(np.float32)
        x[r.integers(0, B, 8), r.integers(0, V, 8)] = x.max()  # ties with the largest
        if B > 3:
            x[1] = -np.inf
            x[2, V // 2] = x[2, V - 1] = np.nan
            x[3] = 3.0
        elif V > 30:
            x[-1, 20] = x[-1, 35] = np.nan
        yield x


def test_the_greedy_token_is_jnp_argmax_by_the_kernel_and_by_the_reductions(monkeypatch):
    assert cpu_kernels.available()  # built and registered
    for x in greedy_cases():
        B, want = x.shape[0], np.asarray(jnp.argmax(jnp.asarray(x), axis=-1))
        by_kernel = jax.jit(cpu_kernels.argmax)(jnp.asarray(x.T))  # every batch, the last rows too
        np.testing.assert_array_equal(np.asarray(by_kernel), want, err_msg=str(x.shape))
        np.testing.assert_array_equal(np.asarray(jax.jit(cpu_step.argmax)(x)), want, err_msg=str(x.shape))
        taken = "ffi_call" in str(jax.make_jaxpr(cpu_step.argmax)(x))
        assert taken == (B % 16 == 0 or 16 % B == 0), x.shape  # else the reductions
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)  # the kernels not built: the reductions
    greedy = jax.jit(lambda x: cpu_step.argmax(x))  # a new function: traced again, not cached
    for x in greedy_cases():
        want = np.asarray(jnp.argmax(jnp.asarray(x), axis=-1))
        np.testing.assert_array_equal(np.asarray(greedy(x)), want, err_msg=f"{x.shape}, no kernels")
        assert "ffi_call" not in str(jax.make_jaxpr(lambda x: cpu_step.argmax(x))(x))


def test_the_kernel_is_taken_for_one_float32_query_position_and_a_head_dim_it_holds():
    q, k, _ = inputs(2, 4, 2, 8, 16)
    assert cpu_kernels.takes(q, k)
    assert cpu_kernels.takes(q, kv_quant.quantize(k, "int8"))
    assert not cpu_kernels.takes(jnp.concatenate([q, q], 1), k)  # two positions: a prefill, not a step
    assert not cpu_kernels.takes(q.astype(jnp.bfloat16), k)
    assert not cpu_kernels.takes(q, k.astype(jnp.bfloat16))
    q8, k8, _ = inputs(2, 4, 2, 8, 8)  # head dim 8: not a multiple of 16
    assert not cpu_kernels.takes(q8, k8)
    # the attention module asks it only for a cached attention under the "cpu" decode kernel
    config = preset("tiny", num_heads=4, head_dim=16)
    for kernel, cached, taken in (("cpu", True, True), ("cpu", False, False), ("einsum", True, False)):
        attn = Attention(config, 2, rngs=nnx.Rngs(0), cached=cached, kernel=kernel)
        jaxpr = str(jax.make_jaxpr(lambda q, k, v, attn=attn: attn.attend(q, k, v))(q, k, k))
        assert ("ffi_call" in jaxpr) == taken, (kernel, cached)


def test_a_compiler_that_cannot_build_it_is_one_line_and_decoding_takes_xlas_products(
    tmp_path, monkeypatch, capsys
):
    with pytest.raises(cpu_kernels.BuildError, match=r"^/nonexistent/c\+\+ could not run"):
        cpu_kernels.build(cxx="/nonexistent/c++", directory=tmp_path)
    with pytest.raises(cpu_kernels.BuildError, match=r"^false failed \(exit 1\)"):
        cpu_kernels.build(cxx="false", directory=tmp_path)
    assert not list(tmp_path.iterdir())  # no half-written library left behind
    assert cpu_kernels.available()  # this machine's compiler built it (once per machine and source)
    built = cpu_kernels.library_path()
    assert built.stat().st_size > 0 and cpu_kernels.build(cxx="false") == built  # not compiled again

    # no compiler: said once, and the attention takes XLA's products
    def no_compiler(*args, **kwargs):
        raise cpu_kernels.BuildError("g++ could not run (no such file)")

    monkeypatch.setattr(cpu_kernels, "build", no_compiler)
    monkeypatch.setattr(cpu_kernels, "available", functools.cache(cpu_kernels.available.__wrapped__))
    q, k, _ = inputs(2, 4, 2, 8, 16)
    assert not cpu_kernels.available() and not cpu_kernels.takes(q, k)
    assert "the CPU decode kernels are not available (g++ could not run (no such file)); decoding takes " in (
        capsys.readouterr().err
    )
    attn = Attention(preset("tiny", num_heads=4, head_dim=16), 2, rngs=nnx.Rngs(0), cached=True, kernel="cpu")
    assert "ffi_call" not in str(jax.make_jaxpr(lambda q, k, v: attn.attend(q, k, v))(q, k, k))
