"""HuggingFace T5 import: logits parity with transformers on tiny random models, and refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from gqa_jax.checkpoints.hf import load_hf_t5

torch = pytest.importorskip("torch", reason="HF parity tests need torch (CPU) to build reference models")
transformers = pytest.importorskip("transformers", reason="HF parity tests need transformers>=5")

from hf_models import DEC_LAYERS, DKV, ENC_LAYERS, D, N  # noqa: E402  (after the importorskips)
from hf_models import max_logit_diff as _max_diff  # noqa: E402
from hf_models import tiny_hf_t5 as _hf_t5  # noqa: E402


def _save(model, directory: Path, **kwargs) -> Path:
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    return directory


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory) -> Path:
    """T5.1.1 style (gated-gelu, separate lm_head, no scaling), saved as a single file."""
    hf = _hf_t5(ffn="gated-gelu", tie=False, separate_head=True, buckets=32, max_distance=128, seed=1)
    return _save(hf, tmp_path_factory.mktemp("untied"))


@pytest.mark.parametrize(
    "ffn, tie, separate_head, buckets, max_distance, shard",
    [
        ("relu", True, False, 8, 16, False),  # original T5: tied and scaled
        ("gated-gelu", False, True, 32, 128, True),  # T5.1.1, sharded with an index file
        ("gated-gelu", False, False, 32, 128, False),  # unscaled, lm_head saved tied -> lm_head = shared.T
        ("gated-gelu", True, False, 8, 16, False),  # tied gated-gelu
    ],
)
def test_logits_match_transformers(tmp_path, ffn, tie, separate_head, buckets, max_distance, shard):
    hf = _hf_t5(
        ffn=ffn, tie=tie, separate_head=separate_head, buckets=buckets, max_distance=max_distance, seed=0
    )
    _save(hf, tmp_path, **({"max_shard_size": "20KB"} if shard else {}))
    assert (tmp_path / "model.safetensors.index.json").is_file() == shard
    model, config = load_hf_t5(tmp_path)

    assert config.tie_word_embeddings == tie
    assert config.mlp_activation == ffn
    assert (config.num_encoder_layers, config.num_decoder_layers) == (ENC_LAYERS, DEC_LAYERS)
    assert config.num_kv_heads == config.num_heads == N and config.head_dim == DKV
    assert config.relative_attention_num_buckets == buckets
    assert config.relative_attention_max_distance == max_distance
    assert config.param_dtype == "float32"
    if not tie:
        head = hf.lm_head.weight.detach().numpy().T
        np.testing.assert_array_equal(np.asarray(model.lm_head[...]), head)
    diff = _max_diff(hf, model)
    print(f"{ffn} tie={tie} separate_head={separate_head} shard={shard}: max |logit diff| = {diff:.2e}")
    assert diff <= 1e-4


def test_bfloat16_checkpoint_keeps_its_dtype(tmp_path):
    hf = _hf_t5(ffn="gated-gelu", tie=False, separate_head=True, buckets=8, max_distance=16, seed=2)
    _save(hf.to(torch.bfloat16), tmp_path)
    model, config = load_hf_t5(tmp_path)
    assert config.param_dtype == "bfloat16" and config.dtype == "float32"
    assert model.encoder.layers[0].attn.query[...].dtype == jnp.bfloat16
    wo = hf.decoder.block[1].layer[2].DenseReluDense.wo.weight.detach().float().numpy()
    np.testing.assert_array_equal(np.asarray(model.decoder.layers[1].mlp.wo[...], np.float32), wo.T)


def test_legacy_config_and_tensors(untied_dir, tmp_path):
    """Pre-5.x config (tie_word_embeddings false, no scale key) and the extra tensors old files hold."""
    shutil.copytree(untied_dir, tmp_path, dirs_exist_ok=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["scale_decoder_outputs"]
    cfg["tie_word_embeddings"] = False
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["encoder.embed_tokens.weight"] = tensors["decoder.embed_tokens.weight"] = tensors["shared.weight"]
    unused = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
    tensors[unused] = np.zeros((32, N), np.float32)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _, config = load_hf_t5(tmp_path)
    assert not config.tie_word_embeddings

    tensors["decoder.embed_tokens.weight"] = tensors["shared.weight"] + 1
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="decoder.embed_tokens.weight differs from shared.weight"):
        load_hf_t5(tmp_path)


def test_scaled_output_with_separate_head_is_refused(untied_dir, tmp_path):
    shutil.copytree(untied_dir, tmp_path, dirs_exist_ok=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["scale_decoder_outputs"] = True
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="not representable"):
        load_hf_t5(tmp_path)


def test_missing_unexpected_and_misshaped_tensors_are_all_listed(untied_dir, tmp_path):
    shutil.copytree(untied_dir, tmp_path, dirs_exist_ok=True)
    tensors = load_file(tmp_path / "model.safetensors")
    missing = "encoder.block.2.layer.1.DenseReluDense.wi_1.weight"
    misshaped = "decoder.block.1.layer.0.SelfAttention.k.weight"
    unexpected = "encoder.block.0.layer.0.SelfAttention.extra.weight"
    del tensors[missing]
    tensors[misshaped] = tensors[misshaped][:-1]
    tensors[unexpected] = np.zeros((2, 2), np.float32)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError) as err:
        load_hf_t5(tmp_path)
    message = str(err.value)
    for name in (missing, misshaped, unexpected):
        assert name in message
    assert f"expected ({N * DKV}, {D}), found ({N * DKV - 1}, {D})" in message


def test_pickle_only_checkpoint_is_refused(untied_dir, tmp_path):
    shutil.copy(untied_dir / "config.json", tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not even a pickle: it must never be opened")
    with pytest.raises(ValueError, match="arbitrary code") as err:
        load_hf_t5(tmp_path)
    assert "safetensors" in str(err.value) and "save_pretrained" in str(err.value)


def test_missing_directory_or_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_hf_t5(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_t5(tmp_path)


def test_unknown_feed_forward_proj(untied_dir, tmp_path):
    shutil.copytree(untied_dir, tmp_path, dirs_exist_ok=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["feed_forward_proj"] = "gated-silu"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="feed_forward_proj='gated-silu'"):
        load_hf_t5(tmp_path)
