"""KV-cached decoding: cached == uncached, batch == alone, HF parity, beam search, sampling."""

from __future__ import annotations

import dataclasses
import itertools
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gqa_jax import cpu_step, decoding
from gqa_jax import uncached as uncached_lib
from gqa_jax.beam_search import beam_search
from gqa_jax.cache import cache_bytes, expected_cache_bytes
from gqa_jax.config import DecodeConfig, preset
from gqa_jax.model import T5, shift_right

V = 16  # a small vocabulary, so EOS (id 1) comes up and rows finish at different steps
MAX = 10
ENC = np.array(
    [
        [5, 6, 7, 8, 9, 10, 11, 12],
        [11, 12, 13, 3, 0, 0, 0, 0],
        [14, 15, 0, 0, 0, 0, 0, 0],
        [2, 4, 6, 8, 10, 12, 0, 0],
    ]
)


def tiny(num_kv: int, seed: int = 0, **overrides) -> T5:
    """Two encoder and two decoder layers: each layer's cache is its own."""
    model = T5(preset("tiny", vocab_size=V, num_kv_heads=num_kv, **overrides), rngs=nnx.Rngs(seed))
    # Make EOS likely enough that rows finish at different steps.
    model.lm_head[...] = model.lm_head[...].at[:, 1].multiply(2.0)
    return model


def shallow(num_kv: int, **overrides) -> T5:
    """One encoder and one decoder layer, for the tests whose behaviour does not depend on the
    depth (the kernels' layouts, sampling, beam search, chunked prefill): half the compile."""
    return tiny(num_kv, num_encoder_layers=1, num_decoder_layers=1, **overrides)


@pytest.fixture(scope="module", params=[4, 2, 1], ids=["mha", "gqa2", "mqa"])
def model(request) -> T5:
    return tiny(request.param)


def test_cached_equals_uncached_tokens_and_step_logits(model):
    cached = decoding.greedy_decode(model, ENC, MAX, return_logits=True)
    uncached = uncached_lib.greedy_decode(model, ENC, MAX)
    np.testing.assert_array_equal(np.asarray(cached.tokens), np.asarray(uncached.tokens))
    np.testing.assert_array_equal(np.asarray(cached.lengths), np.asarray(uncached.lengths))
    np.testing.assert_allclose(np.asarray(cached.logits), np.asarray(uncached.logits), atol=1e-5, rtol=0)
    lengths = np.asarray(cached.lengths)
    assert len(set(lengths.tolist())) > 1, f"rows should finish at different steps: {lengths}"


def output_layer_products(hlo: str) -> set[str]:
    """How compiled HLO takes the output layer's product: "out-major" where a dot gives ``[V, B]``
    (``W [V, D] @ X.T``), "as stored" where one gives ``[B, V]``."""
    import re

    found = set()
    if re.search(rf"f32\[{V},{len(ENC)}\]\S* dot\(", hlo):
        found.add("out-major")
    if re.search(rf"f32\[{len(ENC)},{V}\]\S* dot\(", hlo):
        found.add("as stored")
    return found


def test_the_cpu_kernel_lays_the_step_weights_out_major_and_the_einsum_kernel_does_not():
    """Under ``DecodeConfig.kernel="cpu"`` the steps take the output layer out-major (``W [V, D] @
    X.T``, the weight laid out once outside the step loop), under "einsum" as stored, in the fused
    loop, in ``step`` and in ``finish``. ``kernel_for`` (what decode_config chooses by) gives
    "cpu" for one CPU device only."""
    model = shallow(2)
    graphdef, params = nnx.split(model)
    ids, key, greedy = jnp.asarray(ENC, jnp.int32), jax.random.key(0), jnp.float32(0.0)
    for kernel, contracts in (("cpu", {"out-major"}), ("einsum", {"as stored"})):
        config = DecodeConfig(max_decode_len=MAX, eos_id=1, kernel=kernel)
        hlo = decoding.prefill_and_decode.lower(graphdef, params, ids, key, greedy, config=config)
        assert output_layer_products(hlo.compile().as_text()) == contracts
        state = decoding.start(graphdef, params, ids, key, config=config)
        weights = decoding.step_weights(graphdef, params, config)
        for program in (decoding.step, decoding.finish):
            hlo = program.lower(graphdef, weights, state, greedy, config=config).compile().as_text()
            assert output_layer_products(hlo) == contracts
    assert DecodeConfig(max_decode_len=MAX).kernel == "einsum"
    cpu, tpu = jax.devices()[0], SimpleNamespace(platform="tpu")

    def mesh(shape, device):
        return SimpleNamespace(devices=np.full(shape, device))

    assert cpu_step.kernel_for(None) == "cpu" == cpu_step.kernel_for(mesh((1, 1), cpu))
    assert cpu_step.kernel_for(mesh((2, 4), cpu)) == "einsum"  # a mesh of 8 devices
    assert cpu_step.kernel_for(mesh((1, 1), tpu)) == "einsum"  # one chip of a TPU slice
    assert decoding.decode_config(MAX).kernel == "cpu"  # one CPU device here


def test_the_decode_entry_points_choose_the_kernel_on_the_host(monkeypatch):
    """greedy_decode / sample_decode / beam_search take the kernel ``cpu_step.kernel_for(mesh)``
    gives (through ``decode_config``) before calling the jitted loop (a static argument of it)."""

    class Called(Exception):
        pass

    seen = {}

    def spy(name):
        def record(*args, **kwargs):
            seen[name] = kwargs["config"].kernel
            raise Called

        return record

    import gqa_jax.beam_search as beam_lib

    monkeypatch.setattr(decoding, "prefill_and_decode", spy("greedy"))
    monkeypatch.setattr(beam_lib, "_beam_loop", spy("beam"))
    for kernel in ("cpu", "einsum"):
        monkeypatch.setattr(cpu_step, "kernel_for", lambda mesh, kernel=kernel: kernel)
        for run in (lambda m: decoding.greedy_decode(m, ENC, MAX), lambda m: beam_search(m, ENC, MAX)):
            with pytest.raises(Called):
                run(tiny(2))
        assert seen == {"greedy": kernel, "beam": kernel}


def test_both_kernels_and_every_program_give_the_same_tokens(model):
    """prefill_and_decode under the "einsum" and the "cpu" kernel, and start + finish / start + steps
    on weights from ``step_weights``: the same tokens and lengths, logits equal to float rounding.
    The step programs refuse parameters that ``step_weights`` did not lay out."""
    graphdef, params = nnx.split(model)
    ids, key, greedy = jnp.asarray(ENC, jnp.int32), jax.random.key(0), jnp.float32(0.0)
    args, out = (graphdef, params, ids, key, greedy), {}
    # "cpu": greedy_decode's program (cached == uncached above), called as greedy_decode calls it
    # (mesh and rules given: jit keys a program on the keywords passed)
    for kernel in ("einsum", "cpu"):
        config = dataclasses.replace(decoding.decode_config(MAX, return_logits=True), kernel=kernel)
        out[kernel] = decoding.prefill_and_decode(*args, config=config, mesh=None, rules=None)
        weights = decoding.step_weights(graphdef, params, config)
        state = decoding.start(graphdef, params, ids, key, config=config)
        out[f"{kernel} finish"] = decoding.finish(graphdef, weights, state, greedy, config=config)
        state = decoding.start(graphdef, params, ids, key, config=config)
        for _ in range(int(out[kernel].step)):  # the steps the loop ran (it stops when all rows are done)
            state = decoding.step(graphdef, weights, state, greedy, config=config)
        out[f"{kernel} steps"] = state
        with pytest.raises(ValueError, match="lay the parameters out with decoding.step_weights"):
            decoding.step(graphdef, params, state, greedy, config=config)
    plain = out["einsum"]
    for name, got in out.items():
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(plain.tokens), err_msg=name)
        np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(plain.lengths), err_msg=name)
        np.testing.assert_allclose(np.asarray(got.logits), np.asarray(plain.logits), atol=1e-5, rtol=0)
    B, K, H = ENC.shape[0], model.config.num_kv_heads, model.config.head_dim
    for name, got in out.items():  # either kernel's self cache [B, K, T, H]
        assert got.cache.self_k[0].shape == (B, K, MAX, H), name


def test_cpu_prefill_encodes_in_row_chunks_with_the_batched_numbers(monkeypatch):
    """Rows per chunk: the largest divisor of the batch within ENCODE_CHUNK_TOKENS tokens. The
    chunked encoder gives the batched cache, and the CPU loop (which chunks) still gives the
    cache-free path's tokens and logits."""
    assert cpu_step.ENCODE_CHUNK_TOKENS == 1024
    rows = {(8, 512): 2, (32, 128): 8, (6, 300): 3, (8, 2048): 1}  # (batch, input length): rows
    assert {bs: cpu_step.encode_chunk_rows(*bs) for bs in rows} == rows
    assert cpu_step.encode_chunk_rows(*ENC.shape) == ENC.shape[0]  # the other tests: no chunks
    model = shallow(2)
    ids = jnp.asarray(ENC, jnp.int32)
    graphdef, params = nnx.split(model)
    args = (graphdef, params, ids, jax.random.key(0), jnp.float32(0.0))

    def loops(n: int) -> int:  # while loops of the CPU decode loop's program at length n
        config = DecodeConfig(max_decode_len=n, return_logits=True, kernel="cpu")
        return decoding.prefill_and_decode.lower(*args, config=config).as_text().count("stablehlo.while")

    unchunked = loops(MAX - 2)  # lengths no other test traces: fresh traces
    monkeypatch.setattr(cpu_step, "ENCODE_CHUNK_TOKENS", ENC.shape[1])  # from here: one row per chunk
    n = MAX - 1
    assert loops(n) == unchunked + 1  # the encoder's map over chunks
    graphdef, params = nnx.split(model)
    rows = {
        k: decoding.prefill_chunk_rows(DecodeConfig(MAX, kernel=k), *ids.shape) for k in ("einsum", "cpu")
    }
    assert rows == {"einsum": ids.shape[0], "cpu": 1}  # and a TPU compiler's limit, given, on either:
    assert decoding.prefill_chunk_rows(DecodeConfig(MAX, kernel="cpu", prefill_rows=2), *ids.shape) == 2
    batched, chunked = (decoding.prefill(model, ids, MAX, rows=r) for r in rows.values())
    for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(chunked), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0)
    cached = decoding.greedy_decode(model, ENC, n, return_logits=True)
    uncached = uncached_lib.greedy_decode(model, ENC, n)
    np.testing.assert_array_equal(np.asarray(cached.tokens), np.asarray(uncached.tokens))
    np.testing.assert_allclose(np.asarray(cached.logits), np.asarray(uncached.logits), atol=1e-5, rtol=0)


def test_finished_rows_emit_pad_and_loop_stops_early(model):
    result = decoding.greedy_decode(model, ENC, MAX, return_logits=True)  # the cached test's program
    tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
    for row, n in zip(tokens, lengths, strict=True):
        if n < MAX:
            assert row[n - 1] == 1 and 1 not in row[: n - 1]  # EOS ends the row ...
        assert (row[n:] == 0).all()  # ... and only pad follows
    if (lengths < MAX).all():  # the while_loop ran max(lengths) steps, not MAX
        graphdef, params = nnx.split(model)
        state = decoding.prefill_and_decode(
            graphdef,
            params,
            jnp.asarray(ENC),
            jax.random.key(0),
            jnp.float32(0.0),
            config=decoding.decode_config(MAX, return_logits=True),  # greedy_decode's, called as it calls it
            mesh=None,
            rules=None,
        )
        assert int(state.step) == lengths.max()


def test_row_alone_equals_row_in_batch(model):
    batch = np.asarray(decoding.greedy_decode(model, ENC, MAX, return_logits=True).tokens)  # compiled above
    for i, row in enumerate(ENC):  # a batch of one (same width: one compile for all rows)
        alone = decoding.greedy_decode(model, row[None], MAX)
        np.testing.assert_array_equal(np.asarray(alone.tokens)[0], batch[i])
    unpadded = decoding.greedy_decode(model, ENC[2:3, :2], MAX)  # and without any padding
    np.testing.assert_array_equal(np.asarray(unpadded.tokens)[0], batch[2])


def test_cache_bytes_match_the_formula_and_scale_with_k():
    measured = {}
    for num_kv in (4, 2, 1):
        m = tiny(num_kv)
        for S, T in ((8, 10), (16, 10), (8, 20)) if num_kv == 4 else ((8, 10),):
            cache = decoding.prefill(m, jnp.asarray(np.pad(ENC, ((0, 0), (0, S - 8)))), T)
            got = cache_bytes(cache)
            assert got == expected_cache_bytes(m.config, 4, S, T, "float32")
            measured[num_kv, S, T] = got
    assert measured[4, 16, 10]["cross"] == 2 * measured[4, 8, 10]["cross"]  # input length doubles
    assert measured[4, 8, 20]["self"] == 2 * measured[4, 8, 10]["self"]  # output length doubles
    assert measured[1, 8, 10]["total"] * 2 == measured[2, 8, 10]["total"]  # K halves
    assert measured[2, 8, 10]["self"] * 4 == measured[4, 8, 10]["self"] * 2  # GQA-K is K/N of MHA
    assert measured[1, 8, 10]["self"] * 4 == measured[4, 8, 10]["self"]


# ---------------------------------------------------------------------------- HuggingFace
@pytest.mark.parametrize("ffn, tie, d_kv", [("gated-gelu", False, 8), ("relu", True, 16)])
def test_greedy_equals_transformers_generate(tmp_path, ffn, tie, d_kv):
    """Heads of 8 (XLA's products) and of 16 (the CPU attention kernel, ``cpu_kernels.takes``)."""
    torch = pytest.importorskip("torch", reason="HF generate parity needs torch (CPU)")
    pytest.importorskip("transformers", reason="HF generate parity needs transformers>=5")
    from hf_models import tiny_hf_t5

    from gqa_jax.checkpoints import load_hf_t5

    hf = tiny_hf_t5(
        ffn=ffn, tie=tie, separate_head=not tie, buckets=32, max_distance=128, seed=4, vocab=V, d_kv=d_kv
    )
    with torch.no_grad():
        if tie:  # a unit-scale tied embedding makes the model echo its start token forever
            hf.shared.weight.mul_(0.1)
        hf.lm_head.weight[1] *= 2.0  # EOS more likely: rows stop at different steps
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model, _ = load_hf_t5(tmp_path)
    ours = np.asarray(decoding.greedy_decode(model, ENC, MAX).tokens)
    with torch.no_grad():
        ref = hf.generate(
            input_ids=torch.tensor(ENC),
            attention_mask=torch.tensor(ENC != 0),
            max_new_tokens=MAX,
            num_beams=1,
            do_sample=False,
            decoder_start_token_id=0,
            eos_token_id=1,
            pad_token_id=0,
        ).numpy()[:, 1:]  # drop the start token
    ref = np.pad(ref, ((0, 0), (0, MAX - ref.shape[1])))  # HF stops when every row is done
    np.testing.assert_array_equal(ours, ref)
    finished = (ref == 1).any(axis=1)
    assert finished.any() and not finished.all(), f"some rows, not all, should end with EOS: {ref}"


# ---------------------------------------------------------------------------- beam search
@nnx.jit
def teacher_forced_logprob(model: T5, enc: Any, seqs: Any, lengths: Any) -> jax.Array:
    """Sum of log p(token) over each sequence's first ``length`` tokens. seqs [R, T], enc [R, S].
    Jitted: one program, not one per eager op."""
    logp = jax.nn.log_softmax(model(enc, shift_right(seqs)), -1)
    picked = jnp.take_along_axis(logp, seqs[..., None], -1)[..., 0]  # [R, T]
    return jnp.where(jnp.arange(seqs.shape[1]) < lengths[:, None], picked, 0.0).sum(-1)


def test_beam_of_one_without_length_penalty_is_greedy():
    model = tiny(1)  # MQA: one variant suffices (the cached == uncached tests cover all three)
    beam = beam_search(model, ENC, MAX, beam_size=1, alpha=0.0)
    greedy = decoding.greedy_decode(model, ENC, MAX, return_logits=True)  # the cached test's program
    np.testing.assert_array_equal(np.asarray(beam.tokens)[:, 0], np.asarray(greedy.tokens))
    np.testing.assert_array_equal(np.asarray(beam.lengths)[:, 0], np.asarray(greedy.lengths))


def test_beam_scores_are_length_penalized_teacher_forced_logprobs():
    model, alpha = shallow(2), 0.6  # GQA-2: grouped heads; one variant (CI time)
    beam = beam_search(model, ENC, MAX, beam_size=3, alpha=alpha)
    tokens, lengths, scores = (np.asarray(x) for x in (beam.tokens, beam.lengths, beam.scores))
    assert np.isfinite(scores).all() and (np.diff(scores, axis=1) <= 0).all()  # best first
    B, W, T = tokens.shape
    logp = teacher_forced_logprob(model, np.repeat(ENC, W, 0), tokens.reshape(B * W, T), lengths.reshape(-1))
    penalty = ((5.0 + lengths.reshape(-1)) / 6.0) ** alpha
    np.testing.assert_allclose(scores.reshape(-1), logp / penalty, atol=1e-4, rtol=1e-5)


def test_exhaustive_beam_equals_brute_force():
    vocab, T, alpha = 4, 3, 0.6
    m = T5(
        preset("tiny", vocab_size=vocab, num_kv_heads=2, num_encoder_layers=1, num_decoder_layers=1),
        rngs=nnx.Rngs(7),
    )
    enc = np.array([[2, 3, 2, 0], [3, 3, 0, 0]])
    beam = beam_search(m, enc, T, beam_size=vocab**T, alpha=alpha)
    # Every complete hypothesis: ends at its first EOS (id 1) or runs to length T.
    candidates = []
    for n in range(1, T + 1):
        for seq in itertools.product(range(vocab), repeat=n):
            if 1 not in seq[:-1] and (seq[-1] == 1 or n == T):
                candidates.append(list(seq) + [0] * (T - n))
    cands = np.array(candidates)
    lengths = np.array([list(c).index(1) + 1 if 1 in c else T for c in candidates])
    for row in range(enc.shape[0]):
        logp = teacher_forced_logprob(m, np.repeat(enc[row : row + 1], len(cands), 0), cands, lengths)
        scores = logp / ((5.0 + lengths) / 6.0) ** alpha
        best = int(np.argmax(scores))
        np.testing.assert_array_equal(np.asarray(beam.tokens)[row, 0], cands[best])
        np.testing.assert_allclose(float(beam.scores[row, 0]), scores[best], atol=1e-5)


# ------------------------------------------------------------------------------- sampling
def test_sampling_limits_and_reproducibility():
    model = shallow(2)
    greedy = np.asarray(decoding.greedy_decode(model, ENC, MAX).tokens)
    key = jax.random.key(42)
    # Gumbel noise is O(10); at temperature 1e-7 only logit gaps below ~1e-6 could flip.
    cold = decoding.sample_decode(model, ENC, MAX, key=key, temperature=1e-7)
    np.testing.assert_array_equal(np.asarray(cold.tokens), greedy)
    top1 = decoding.sample_decode(model, ENC, MAX, key=key, temperature=1.0, top_k=1)
    np.testing.assert_array_equal(np.asarray(top1.tokens), greedy)
    nucleus = decoding.sample_decode(model, ENC, MAX, key=key, temperature=1.0, top_p=1e-6)
    np.testing.assert_array_equal(np.asarray(nucleus.tokens), greedy)
    a = decoding.sample_decode(model, ENC, MAX, key=key, temperature=1.5)
    b = decoding.sample_decode(model, ENC, MAX, key=key, temperature=1.5)
    c = decoding.sample_decode(model, ENC, MAX, key=jax.random.key(43), temperature=1.5)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))


def test_choose_tokens_top_k_and_top_p_restrict_the_support():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    keys = jax.random.split(jax.random.key(0), 400)
    draw = jax.vmap(lambda k, **kw: decoding.choose_tokens(logits, k, temperature=1.0, **kw)[0])
    assert set(np.asarray(draw(keys)).tolist()) == {0, 1, 2, 3}
    assert set(
        np.asarray(
            jax.vmap(lambda k: decoding.choose_tokens(logits, k, temperature=1.0, top_k=2)[0])(keys)
        ).tolist()
    ) == {0, 1}
    # top_p = 0.7: {0.5} has mass 0.5 < 0.7, {0.5, 0.3} reaches it: tokens 0 and 1 only.
    assert set(
        np.asarray(
            jax.vmap(lambda k: decoding.choose_tokens(logits, k, temperature=1.0, top_p=0.7)[0])(keys)
        ).tolist()
    ) == {0, 1}


# ------------------------------------------------------------------------------ bad input
def test_bad_inputs_raise_clear_errors():
    m = tiny(2)
    with pytest.raises(ValueError, match="empty input"):
        decoding.greedy_decode(m, np.zeros((0, 4), int), MAX)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 16\): min 0, max 16"):
        decoding.greedy_decode(m, np.array([[3, 16, 0]]), MAX)
    with pytest.raises(ValueError, match="max_decode_len=0"):
        decoding.greedy_decode(m, ENC, 0)
    with pytest.raises(ValueError, match="length 8 exceed max_input_len=6.*truncate=True"):
        decoding.greedy_decode(m, ENC, MAX, max_input_len=6)
    cut = decoding.greedy_decode(m, ENC, MAX, max_input_len=6, truncate=True)
    np.testing.assert_array_equal(
        np.asarray(cut.tokens), np.asarray(decoding.greedy_decode(m, ENC[:, :6], MAX).tokens)
    )
    with pytest.raises(ValueError, match="sampling needs an explicit PRNG key"):
        decoding.sample_decode(m, ENC, MAX, temperature=1.0)
    key = jax.random.key(0)
    for kwargs, message in [
        ({"temperature": float("nan")}, "temperature=nan must be a finite number"),
        ({"temperature": float("inf")}, "temperature=inf must be a finite number"),
        ({"temperature": -0.5}, r"temperature=-0.5 must be a finite number >= 0"),
        ({"top_k": V + 1}, rf"top_k={V + 1} must be an integer in \[0, {V}\]"),
        ({"top_p": float("nan")}, r"top_p=nan must be in \(0, 1\]"),
        ({"top_p": 0.0, "top_k": -1}, r"top_k=-1 .*; top_p=0.0 must be in"),  # every problem at once
    ]:
        with pytest.raises(ValueError, match=message):
            decoding.sample_decode(m, ENC, MAX, key=key, **kwargs)
    with pytest.raises(ValueError, match="rectangular .* padded with 0 to one length"):
        decoding.greedy_decode(m, [[3, 4, 5], [6, 7]], MAX)  # ragged rows
    with pytest.raises(ValueError, match="beam_size=0"):
        beam_search(m, ENC, MAX, beam_size=0)
    other = tiny(1)
    state = decoding.init_state(
        decoding.prefill(other, jnp.asarray(ENC), MAX), jax.random.key(0), vocab_size=V, return_logits=False
    )
    with pytest.raises(ValueError, match=r"built for another config.*num_kv_heads=2"):
        decoding.decode_step(m, state)
