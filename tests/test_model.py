"""The encoder-decoder: shapes, grouping by config, padding, causality, dropout, jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gqa_jax.config import ATTENTION_KINDS, preset
from gqa_jax.data.pipeline import shift_right
from gqa_jax.model import T5, abstract, build

ENC = jnp.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0], [14, 15, 0, 0, 0, 0]])
DEC = jnp.array([[0, 3, 4, 5], [0, 6, 7, 8], [0, 9, 10, 11]])


@nnx.jit
def run(model, enc, dec, rngs=None):
    """Jitted forward: one compile per shape instead of one per op."""
    return model(enc, dec, rngs=rngs)


def make(**overrides):
    cfg = preset("tiny", **overrides)
    return T5(cfg, rngs=nnx.Rngs(0)), cfg


@pytest.mark.parametrize("num_kv", [4, 2, 1])
def test_forward_shapes_and_kv_heads_by_attention_kind(num_kv):
    model, cfg = make(num_kv_heads=num_kv)
    logits = run(model, ENC, DEC)
    assert logits.shape == (3, 4, cfg.vocab_size) and logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))
    dec = model.decoder.layers[0]
    assert dec.self_attn.key.shape[1] == dec.cross_attn.value.shape[1] == num_kv
    assert model.encoder.layers[0].attn.key.shape[1] == cfg.num_heads  # encoder stays MHA


def test_encoder_grouped_only_when_configured():
    model, _ = make(num_kv_heads=1, grouped_attentions=ATTENTION_KINDS)
    assert model.encoder.layers[1].attn.key.shape[1] == 1
    model, _ = make(num_kv_heads=2, grouped_attentions=("cross",))
    assert model.decoder.layers[0].self_attn.key.shape[1] == 4
    assert model.decoder.layers[0].cross_attn.key.shape[1] == 2


def test_gqa_with_k_equal_n_is_the_mha_model():
    mha, _ = make(grouped_attentions=())
    gqa, _ = make(num_kv_heads=4)  # all grouped attentions at K = N
    nnx.update(gqa, nnx.state(mha, nnx.Param))
    np.testing.assert_array_equal(np.asarray(gqa(ENC, DEC)), np.asarray(mha(ENC, DEC)))


def test_trailing_encoder_padding_changes_nothing():
    model, _ = make(num_kv_heads=2)
    short = run(model, ENC, DEC)
    padded = run(model, jnp.pad(ENC, ((0, 0), (0, 5))), DEC)
    np.testing.assert_allclose(np.asarray(padded), np.asarray(short), atol=1e-5)
    # Each row alone equals the row inside the padded batch.
    for i in range(ENC.shape[0]):
        n = int((ENC[i] != 0).sum())
        alone = run(model, ENC[i : i + 1, :n], DEC[i : i + 1])
        np.testing.assert_allclose(np.asarray(alone[0]), np.asarray(short[i]), atol=1e-5)


def test_decoder_is_causal():
    model, _ = make(num_kv_heads=1)
    a = run(model, ENC, DEC)
    b = run(model, ENC, DEC.at[:, 2:].set(42))
    np.testing.assert_array_equal(np.asarray(a[:, :2]), np.asarray(b[:, :2]))
    assert not np.allclose(np.asarray(a[:, 2:]), np.asarray(b[:, 2:]))


def test_tied_and_untied_output_layers():
    tied, cfg = make(tie_word_embeddings=True)
    assert not hasattr(tied, "lm_head")
    hidden, _ = tied.decoder(tied.shared(DEC), tied.decoder.cross_kv(tied.encode(ENC)), ENC != 0)
    want = jnp.einsum("btd,vd->btv", hidden * cfg.d_model**-0.5, tied.shared.embedding[...])
    np.testing.assert_allclose(np.asarray(tied(ENC, DEC)), np.asarray(want), atol=1e-5)
    untied, cfg = make()
    assert untied.lm_head.shape == (cfg.d_model, cfg.vocab_size)


def test_dropout_only_with_rngs_and_reproducible():
    # rbg keys: XLA compiles them ~4x faster than threefry on CPU (many dropout sites).
    model, _ = make(num_kv_heads=2, dropout_rate=0.3)
    det = run(model, ENC, DEC)
    np.testing.assert_array_equal(np.asarray(det), np.asarray(run(model, ENC, DEC)))
    d1 = run(model, ENC, DEC, nnx.Rngs(dropout=jax.random.key(1, impl="rbg")))
    d1_again = run(model, ENC, DEC, nnx.Rngs(dropout=jax.random.key(1, impl="rbg")))
    d2 = run(model, ENC, DEC, nnx.Rngs(dropout=jax.random.key(2, impl="rbg")))
    np.testing.assert_array_equal(np.asarray(d1), np.asarray(d1_again))
    assert not np.allclose(np.asarray(d1), np.asarray(det))
    assert not np.allclose(np.asarray(d1), np.asarray(d2))


def test_functional_jit_core_matches_eager():
    model, _ = make(num_kv_heads=2)
    graphdef, params = nnx.split(model)

    @jax.jit
    def forward(params, enc, dec):
        return nnx.merge(graphdef, params)(enc, dec)

    np.testing.assert_allclose(np.asarray(forward(params, ENC, DEC)), np.asarray(model(ENC, DEC)), atol=1e-5)


def test_bfloat16_activations_run_and_stay_close():
    model, _ = make(num_kv_heads=2)
    bf16, _ = make(num_kv_heads=2, dtype="bfloat16")
    nnx.update(bf16, nnx.state(model, nnx.Param))
    a, b = np.asarray(run(model, ENC, DEC)), np.asarray(run(bf16, ENC, DEC))
    assert b.dtype == np.float32  # logits are returned in float32
    assert np.abs(a - b).max() < 0.1 * np.abs(a).max()


def test_bad_inputs():
    model, _ = make()
    with pytest.raises(ValueError, match=r"encoder_input_ids must be \[batch, length\].*\(6,\)"):
        model(ENC[0], DEC)
    with pytest.raises(ValueError, match="integer token ids"):
        model(ENC.astype(jnp.float32), DEC)
    with pytest.raises(ValueError, match="batch sizes differ"):
        model(ENC, DEC[:2])


def test_shift_right_starts_with_pad():
    np.testing.assert_array_equal(np.asarray(shift_right(jnp.array([[7, 8, 1]]))), [[0, 7, 8]])


def test_shift_right_restarts_every_packed_segment():
    targets = jnp.array([[5, 6, 7, 8, 9, 0]])
    segments = jnp.array([[1, 1, 2, 2, 2, 0]])
    np.testing.assert_array_equal(shift_right(targets, segments), [[0, 5, 0, 7, 8, 0]])


@nnx.jit
def run_packed(model, enc, dec, enc_seg, dec_seg):
    return model(enc, dec, encoder_segment_ids=enc_seg, decoder_segment_ids=dec_seg)


def test_packed_rows_match_separate_examples():
    """Two documents packed into one row give the logits each gives alone: no cross-talk.
    GQA-2, so grouped and ungrouped (encoder) attentions are both covered."""
    cfg = preset("tiny", num_kv_heads=2)
    model = T5(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    enc_a, enc_b = rng.integers(2, cfg.vocab_size, 5), rng.integers(2, cfg.vocab_size, 7)
    tgt_a, tgt_b = rng.integers(2, cfg.vocab_size, 3), rng.integers(2, cfg.vocab_size, 4)
    S, T = 16, 10
    enc = np.zeros((1, S), np.int32)
    enc[0, :12] = np.concatenate([enc_a, enc_b])
    enc_seg = np.zeros((1, S), np.int32)
    enc_seg[0, :5], enc_seg[0, 5:12] = 1, 2
    tgt = np.zeros((1, T), np.int32)
    tgt[0, :7] = np.concatenate([tgt_a, tgt_b])
    dec_seg = np.zeros((1, T), np.int32)
    dec_seg[0, :3], dec_seg[0, 3:7] = 1, 2
    packed = run_packed(
        model,
        jnp.asarray(enc),
        shift_right(jnp.asarray(tgt), jnp.asarray(dec_seg)),
        jnp.asarray(enc_seg),
        jnp.asarray(dec_seg),
    )
    alone_a = run(model, jnp.asarray(enc_a[None]), shift_right(jnp.asarray(tgt_a[None])))
    alone_b = run(model, jnp.asarray(enc_b[None]), shift_right(jnp.asarray(tgt_b[None])))
    np.testing.assert_allclose(packed[0, :3], alone_a[0], atol=2e-5)
    np.testing.assert_allclose(packed[0, 3:7], alone_b[0], atol=2e-5)
    with pytest.raises(ValueError, match="both"):
        model(jnp.asarray(enc), jnp.asarray(tgt), encoder_segment_ids=jnp.asarray(enc_seg))


def test_abstract_gives_a_fresh_module_each_call_and_build_fills_it():
    from gqa_jax import model as model_lib

    cfg = preset("tiny", num_kv_heads=2)
    a, b = model_lib.abstract(cfg), model_lib.abstract(cfg)
    assert a is not b and a.decoder.layers[0].self_attn.key is not b.decoder.layers[0].self_attn.key
    key = a.decoder.layers[0].self_attn.key
    assert isinstance(key.get_value(), jax.ShapeDtypeStruct) and key.shape == (cfg.d_model, 2, cfg.head_dim)
    built = model_lib.build(cfg, seed=0)
    again = model_lib.build(cfg, nnx.state(built, nnx.Param))
    # filling one module in place leaves the next abstract model shape-only
    assert isinstance(again.decoder.layers[0].self_attn.key.get_value(), jax.Array)
    assert isinstance(
        model_lib.abstract(cfg).decoder.layers[0].self_attn.key.get_value(), jax.ShapeDtypeStruct
    )
    np.testing.assert_array_equal(
        again.decoder.layers[0].self_attn.key[...], built.decoder.layers[0].self_attn.key[...]
    )


def loss_of(base, params, dropout=0.0, grads=True, **options):
    """The remat test's loss (and its gradients) of ``base`` with these options, jitted whole."""
    enc = jnp.asarray(np.random.default_rng(0).integers(2, 100, (2, 10)))
    dec = jnp.asarray(np.random.default_rng(1).integers(2, 100, (2, 6)))
    graphdef = nnx.split(abstract(base.replace(dropout_rate=dropout, **options)), nnx.Param)[0]

    def loss(params):
        rngs = nnx.Rngs(dropout=7) if dropout else None  # the recomputation draws the same masks
        logits = nnx.merge(graphdef, params)(enc, dec, rngs=rngs)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 3])

    return jax.jit(jax.value_and_grad(loss) if grads else loss)(params)


def test_remat_policies_and_scanned_layers_give_the_plain_loss_and_gradients():
    """Remat wraps each layer alone: its policies, with and without dropout, are compared on one
    encoder and one decoder layer (a smaller compile); scanning stacks the layers: on two of each."""
    deep = preset("tiny", num_kv_heads=2)  # two encoder and two decoder layers
    shallow = deep.replace(num_encoder_layers=1, num_decoder_layers=1)
    model = T5(deep, rngs=nnx.Rngs(0))
    first = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for stack in ("encoder", "decoder"):  # the shallow model: the deep one's first layers
        first[stack]["layers"] = {0: first[stack]["layers"][0]}
    params = {  # one set of weights per depth for all its cases
        deep: nnx.split(model, nnx.Param)[1],
        shallow: nnx.split(build(shallow, first), nnx.Param)[1],
    }
    cases = [(shallow, 0.0, {"remat": r}) for r in ("full", "save_dots", "save_dots_no_batch")]
    cases += [
        (deep, 0.0, {"scan_layers": True}),
        (deep, 0.0, {"scan_layers": True, "remat": "full"}),
        (shallow, 0.3, {"remat": "full"}),
    ]
    plain = {(b, d): loss_of(b, params[b], d) for b, d in ((shallow, 0.0), (shallow, 0.3), (deep, 0.0))}
    for base, dropout, options in cases:
        (loss, grads), (got_loss, got_grads) = (
            plain[base, dropout],
            loss_of(base, params[base], dropout, **options),
        )
        assert float(got_loss) == pytest.approx(float(loss), abs=1e-5), options
        for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(grads), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, err_msg=str(options))
    # scanned with dropout: each layer's key comes from one split, so other masks than the loop's
    scanned = float(loss_of(shallow, params[shallow], 0.3, grads=False, scan_layers=True))
    assert np.isfinite(scanned) and scanned != float(plain[shallow, 0.3][0])
    with pytest.raises(ValueError, match=r"remat='everything'; known: \['none', 'full', 'save_dots'"):
        preset("tiny", remat="everything")
    with pytest.raises(ValueError, match="scan_layers='yes' must be True or False"):
        preset("tiny", scan_layers="yes")
