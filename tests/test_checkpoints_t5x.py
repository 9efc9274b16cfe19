"""T5X / Flaxformer and HF Flax import: checkpoints written here in each documented format hold
the weights of a tiny HF T5.1.1 model (or of our MQA model); the imported model's logits must
equal the source's. Then the refusals."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

from gqa_jax import checkpoints, convert
from gqa_jax.config import preset
from gqa_jax.model import build, flat_params

torch = pytest.importorskip("torch", reason="the parity tests need torch (CPU) to build reference models")
transformers = pytest.importorskip("transformers", reason="the parity tests need transformers>=5")

from hf_models import DEC_LAYERS, DKV, ENC_LAYERS, D, F, N, V, batch, max_logit_diff, tiny_hf_t5  # noqa: E402
from t5x_files import SUBLAYERS, nest, t5x_from_ours, write_legacy, write_orbax  # noqa: E402

HF_TO_T5X_ATTENTION = {"q": "query", "k": "key", "v": "value", "o": "out"}


@pytest.fixture(scope="module")
def hf_model():
    return tiny_hf_t5(ffn="gated-gelu", tie=False, separate_head=True, buckets=32, max_distance=128, seed=3)


def _hf_config():
    """What the shapes of ``hf_model`` say (and ModelConfig's defaults for what they cannot)."""
    return preset("tiny").replace(
        vocab_size=V, d_model=D, d_ff=F, num_heads=N, head_dim=DKV, num_kv_heads=N,
        num_encoder_layers=ENC_LAYERS, num_decoder_layers=DEC_LAYERS,
        relative_attention_num_buckets=32, relative_attention_max_distance=128,
    )  # fmt: skip


def t5x_tensors(hf) -> dict[str, np.ndarray]:
    """The HF model's weights under T5X's names and layouts (kernels [in, out], heads merged)."""
    w = {n: p.detach().numpy() for n, p in hf.state_dict().items()}
    out = {
        "token_embedder.embedding": w["shared.weight"],
        "decoder.logits_dense.kernel": w["lm_head.weight"].T,
    }
    for stack, layers in (("encoder", ENC_LAYERS), ("decoder", DEC_LAYERS)):
        rel = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        out[f"{stack}.relpos_bias.rel_embedding"] = w[rel].T  # HF [buckets, N] -> T5X [N, buckets]
        out[f"{stack}.{stack}_norm.scale"] = w[f"{stack}.final_layer_norm.weight"]
        subs = SUBLAYERS[stack]
        for i in range(layers):
            hf_layer, t5x_layer = f"{stack}.block.{i}.layer", f"{stack}.layers_{i}"
            for j, (_, hf_attn, attn, norm) in enumerate(subs):
                for p, q in HF_TO_T5X_ATTENTION.items():
                    out[f"{t5x_layer}.{attn}.{q}.kernel"] = w[f"{hf_layer}.{j}.{hf_attn}.{p}.weight"].T
                out[f"{t5x_layer}.{norm}.scale"] = w[f"{hf_layer}.{j}.layer_norm.weight"]
            j = len(subs)
            for m in ("wi_0", "wi_1", "wo"):
                out[f"{t5x_layer}.mlp.{m}.kernel"] = w[f"{hf_layer}.{j}.DenseReluDense.{m}.weight"].T
            out[f"{t5x_layer}.pre_mlp_layer_norm.scale"] = w[f"{hf_layer}.{j}.layer_norm.weight"]
    return out


@pytest.mark.parametrize("write", [write_legacy, write_orbax], ids=["legacy", "orbax"])
def test_t5x_logits_match_transformers(tmp_path, hf_model, write):
    tensors = t5x_tensors(hf_model)
    # the legacy layout may keep small leaves inline in the msgpack
    kwargs = {"inline": ("encoder.encoder_norm.scale",)} if write is write_legacy else {}
    path = write(tmp_path / "checkpoint_1000000", tensors, **kwargs)
    assert checkpoints.kind_of(path) == ("t5x" if write is write_legacy else "t5x_orbax")
    model, config = checkpoints.load_t5x(path)
    assert config == _hf_config()
    diff = max_logit_diff(hf_model, model)
    print(f"{write.__name__}: max |logit diff| vs HF = {diff:.2e}")
    assert diff <= 1e-4


def test_flaxformer_multi_query_layout(tmp_path):
    """Flaxformer's MQA keeps K/V kernels [D, H] (no head axis); split head kernels are 3-D."""
    config = preset("tiny", num_kv_heads=1, relative_attention_max_distance=128)  # T5X keeps no distance
    source = build(config, seed=5)
    t = t5x_from_ours(source, split_query=True)
    assert t["decoder.layers_0.self_attention.key.kernel"].shape == (config.d_model, config.head_dim)
    model, got = checkpoints.load_t5x(write_legacy(tmp_path / "mqa", t))
    assert got == config
    enc, dec = batch()
    diff = float(np.max(np.abs(np.asarray(model(enc, dec)) - np.asarray(source(enc, dec)))))
    print(f"Flaxformer MQA layout: max |logit diff| vs our MQA model = {diff:.2e}")
    assert diff <= 1e-6


def flax_params(hf) -> dict:
    """HF's Flax T5 parameter tree: kernels [in, out], embeddings `embedding`, norms `weight`."""
    tree = {}
    for name, p in hf.state_dict().items():
        if name.endswith("embed_tokens.weight"):
            continue  # Flax's T5 keeps one `shared` embedding
        w, module = p.detach().numpy(), name.rsplit(".", 1)[0]
        if name == "shared.weight" or "relative_attention_bias" in name:
            tree[f"{module}.embedding"] = w
        elif "layer_norm" in name:
            tree[name] = w
        else:
            tree[f"{module}.kernel"] = w.T
    return nest(tree)


def test_hf_flax_msgpack_logits_match_transformers(tmp_path, hf_model):
    hf_model.config.save_pretrained(tmp_path)  # config.json only
    (tmp_path / "flax_model.msgpack").write_bytes(serialization.msgpack_serialize(flax_params(hf_model)))
    assert checkpoints.kind_of(tmp_path) == "huggingface_flax"
    model, config, kind = checkpoints.load_any(tmp_path)
    assert kind == "huggingface_flax" and not config.tie_word_embeddings
    diff = max_logit_diff(hf_model, model)
    print(f"flax_model.msgpack: max |logit diff| vs HF = {diff:.2e}")
    assert diff <= 1e-4


def test_convert_from_a_t5x_checkpoint_and_check_it(tmp_path, hf_model):
    src = write_legacy(tmp_path / "checkpoint_1000000", t5x_tensors(hf_model))
    dst, manifest = convert.convert_checkpoint(src, tmp_path / "gqa2", 2, "mean")
    assert manifest["source"]["kind"] == "t5x"
    model, config = checkpoints.load(dst)
    assert config.num_kv_heads == 2 and config.grouped_attentions == ("decoder_self", "cross")
    assert convert.check_conversion(dst) == []


def test_t5x_mismatches_are_listed_together(tmp_path, hf_model):
    tensors = t5x_tensors(hf_model)
    missing, misshaped = "encoder.layers_2.mlp.wi_1.kernel", "decoder.layers_1.self_attention.key.kernel"
    unexpected = "encoder.layers_0.attention.extra.kernel"
    del tensors[missing]
    tensors[misshaped] = tensors[misshaped][:, :-1]
    tensors[unexpected] = np.zeros((2, 2), np.float32)
    path = write_legacy(tmp_path / "c", tensors)
    with pytest.raises(ValueError) as err:
        checkpoints.load_t5x(path, config=_hf_config())
    message = str(err.value)
    for name in (missing, misshaped, unexpected):
        assert name in message
    assert f"expected ({D}, {N * DKV}), found ({D}, {N * DKV - 1})" in message


def test_t5x_bad_directories(tmp_path, hf_model):
    (tmp_path / "run" / "checkpoint_100").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"no `checkpoint` file.*\['checkpoint_100'\]: pass one"):
        checkpoints.load_t5x(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        checkpoints.load_t5x(tmp_path / "nowhere")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "checkpoint").write_bytes(b"\x93not msgpack at all")
    with pytest.raises(ValueError, match="not a readable T5X msgpack checkpoint"):
        checkpoints.load_t5x(bad)

    path = write_legacy(tmp_path / "truncated", t5x_tensors(hf_model))
    chunk = path / "target.decoder.layers_1.mlp.wo.kernel" / "0.0"
    chunk.write_bytes(chunk.read_bytes()[:10])  # a truncated gzip chunk
    with pytest.raises(ValueError, match="cannot read decoder.layers_1.mlp.wo.kernel"):
        checkpoints.load_t5x(path)


def test_t5x_shapes_that_disagree_with_the_given_config(tmp_path, hf_model):
    path = write_legacy(tmp_path / "c", t5x_tensors(hf_model))
    with pytest.raises(ValueError, match=r"(?s)does not match the model \(vocab_size=128.*mis-shaped"):
        checkpoints.load_t5x(path, config=preset("tiny"))


def test_load_any_names_what_it_accepts(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="gqa_jax checkpoint.*HuggingFace.*flax_model.msgpack.*T5X"):
        checkpoints.load_any(tmp_path)


def test_every_loader_casts_to_param_dtype_as_it_reads(tmp_path, hf_model):
    source = build(preset("tiny", relative_attention_max_distance=128), seed=2)
    hf_model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    paths = {
        "gqa_jax": (checkpoints.save(source, tmp_path / "ours"), source),
        "t5x": (write_legacy(tmp_path / "t5x", t5x_from_ours(source)), source),
        "t5x_orbax": (write_orbax(tmp_path / "orbax", t5x_from_ours(source)), source),
        "huggingface": (tmp_path / "hf", checkpoints.load_hf_t5(tmp_path / "hf")[0]),
    }
    for kind, (path, reference) in paths.items():
        model, config, found = checkpoints.load_any(path, param_dtype="bfloat16")
        assert found == kind and config.param_dtype == "bfloat16"
        want = flat_params(reference)
        for p, got in flat_params(model).items():
            assert got.dtype == jnp.bfloat16, (kind, p)
            np.testing.assert_array_equal(
                np.asarray(got), np.asarray(want[p]).astype(jnp.bfloat16), err_msg=kind
            )
