"""ModelConfig: presets, overrides, serialization and validation errors."""

import pytest

from gqa_jax.config import ATTENTION_KINDS, ModelConfig, preset


@pytest.mark.parametrize(
    "name, d_model, d_ff, layers, heads",
    [
        ("small", 512, 1024, 8, 6),
        ("base", 768, 2048, 12, 12),
        ("large", 1024, 2816, 24, 16),
        ("xl", 2048, 5120, 24, 32),
        ("xxl", 4096, 10240, 24, 64),
    ],
)
def test_t5_1_1_presets_have_paper_shapes(name, d_model, d_ff, layers, heads):
    c = preset(name)
    assert (c.d_model, c.d_ff, c.num_encoder_layers, c.num_decoder_layers) == (d_model, d_ff, layers, layers)
    assert (c.num_heads, c.head_dim, c.vocab_size) == (heads, 64, 32128)
    assert c.num_kv_heads == heads  # MHA by default
    assert c.relative_attention_num_buckets == 32 and c.relative_attention_max_distance == 128
    assert not c.tie_word_embeddings and c.mlp_activation == "gated-gelu"


def test_num_kv_heads_override_and_grouped_attentions():
    c = preset("xxl", num_kv_heads=8)
    assert c.num_kv_heads == 8
    # Paper default: decoder self-attention and cross-attention grouped, encoder MHA.
    assert c.kv_heads("decoder_self") == 8 and c.kv_heads("cross") == 8
    assert c.kv_heads("encoder_self") == 64
    c = preset("tiny", num_kv_heads=1, grouped_attentions=ATTENTION_KINDS)
    assert [c.kv_heads(a) for a in ATTENTION_KINDS] == [1, 1, 1]


def test_round_trip_dict_and_json():
    c = preset("tiny", num_kv_heads=2, tie_word_embeddings=True, dtype="bfloat16")
    assert ModelConfig.from_dict(c.to_dict()) == c
    import json

    assert ModelConfig.from_dict(json.loads(c.to_json())) == c


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(num_heads=6, num_kv_heads=4),
            r"num_heads=6 is not divisible by num_kv_heads=4.*\[1, 2, 3, 6\]",
        ),
        (dict(num_heads=4, num_kv_heads=8), r"num_kv_heads=8 is larger than num_heads=4"),
        (dict(num_kv_heads=0), r"num_kv_heads=0 must be an integer >= 1"),
        (dict(num_kv_heads=-2), r"num_kv_heads=-2"),
        (dict(grouped_attentions=("decoder_self", "encoder")), r"unknown attention name\(s\) \['encoder'\]"),
        (dict(d_model=0), r"d_model=0"),
        (dict(d_ff=-1, head_dim=0), r"d_ff=-1, head_dim=0"),
        (dict(num_encoder_layers=0), r"num_encoder_layers=0"),
        (dict(vocab_size=1.5), r"vocab_size=1.5"),
        (dict(dropout_rate=1.0), r"dropout_rate=1.0"),
        (dict(mlp_activation="swiglu"), r"mlp_activation='swiglu'"),
        (dict(dtype="float64"), r"dtype='float64'"),
    ],
)
def test_bad_config_raises_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        preset("tiny", **overrides)


def test_unknown_preset_and_unknown_field():
    with pytest.raises(ValueError, match=r"unknown preset 'huge'.*xxl"):
        preset("huge")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['num_kv_head'\]"):
        ModelConfig.from_dict({"num_kv_head": 2})
    with pytest.raises(ValueError, match="unknown attention 'encoder'"):
        preset("tiny").kv_heads("encoder")
