"""ModelConfig: presets, overrides, serialization and validation errors; the run configs
(configs/*.py loaded by gqa_jax.run_config, their variants and --config.FIELD overrides)."""

import os
from pathlib import Path

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


# ------------------------------------------------------------- run configs (configs/*.py, run_config)
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", ["base.py", "pretrain.py", "uptrain.py", "finetune.py"])
def test_configs_load_from_any_directory_and_have_the_base_fields(name, tmp_path, monkeypatch):
    from gqa_jax import run_config

    base = run_config.load(CONFIGS / "base.py")
    monkeypatch.chdir(tmp_path)  # the configs find configs/base.py next to themselves
    config = run_config.load(CONFIGS / name)
    assert run_config.field_names(config) == run_config.field_names(base)
    assert config.is_locked  # code cannot add a field by a typo
    with pytest.raises(AttributeError):
        config.num_train_step = 5
    for field in run_config.field_names(config):  # no untyped None: every field can be overridden
        *parents, leaf = field.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        assert node.get_type(leaf) is not type(None), field


def test_none_default_fields_are_typed_placeholders():
    from gqa_jax import run_config

    config = run_config.load(CONFIGS / "base.py")
    assert config.input_length is None and config.get_type("input_length") is int
    assert config.model.get_type("num_kv_heads") is int and config.get_type("vocab") is str
    with pytest.raises(TypeError):
        config.input_length = "long"
    config = run_config.load(CONFIGS / "base.py", ["--config.input_length=12", "--config.vocab", "spm.model"])
    assert (config.input_length, config.vocab) == (12, os.path.abspath("spm.model"))  # a path: absolute
    with pytest.raises(ValueError, match=r"config.uptrain.source_step takes a value of type int"):
        run_config.load(CONFIGS / "base.py", ["--config.uptrain.source_step=soon"])


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("pretrain.py", dict(recipe="pretrain", task="stdlib_span", num_train_steps=1000)),
        ("pretrain.py:model=small,kv=2,steps=3", {"model.preset": "small", "model.num_kv_heads": 2}),
        (
            "uptrain.py:source=runs/pt/model,kv=2,method=first,alpha=0.1,original_steps=400",
            {"recipe": "uptrain", "uptrain.source": os.path.abspath("runs/pt/model"),
             "uptrain.num_kv_heads": 2, "uptrain.method": "first", "uptrain.alpha": 0.1,
             "uptrain.original_steps": 400},
        ),
        (
            "finetune.py:task=stdlib_qa,init=runs/pt/model",
            {"recipe": "finetune", "task": "stdlib_qa", "init_from": os.path.abspath("runs/pt/model"),
             "model.dropout_rate": 0.1, "eval_at_start": True},
        ),
        ("finetune.py", {"init_from": None, "task": "stdlib_docsum"}),
    ],
)  # fmt: skip
def test_variant_keys(spec, expected):
    from gqa_jax import run_config

    flat = {}
    config = run_config.load(f"{CONFIGS}/{spec}")
    for field in run_config.field_names(config):
        node = config
        for name in field.split("."):
            node = node[name]
        flat[field] = node
    assert {k: flat[k] for k in expected} == expected


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "pretrain.py:size=small",
            r"configs/pretrain.py: unknown variant keys \['size'\]; known: task, model",
        ),
        ("uptrain.py:kv=1,src=x", r"configs/uptrain.py: unknown variant keys \['src'\]; known: source, kv"),
        ("finetune.py:init", r"config variant item 'init' must look like key=value"),
        ("base.py:model=tiny", r"configs/base.py: unknown variant keys \['model'\]; known: none"),
    ],
)
def test_bad_variant_keys(spec, message):
    from gqa_jax import run_config

    with pytest.raises(ValueError, match=message):
        run_config.load(f"{CONFIGS}/{spec}")


def test_override_errors_are_one_line_naming_the_field():
    from gqa_jax import run_config

    def error(*overrides):
        with pytest.raises(ValueError) as info:
            run_config.load(CONFIGS / "pretrain.py", overrides)
        assert "\n" not in str(info.value)
        return str(info.value)

    assert "no field 'batchsize' (did you mean batch_size?); the known fields: batch_size," in error(
        "--config.batchsize=3"
    )
    assert "config.optimizer has no field 'lr'" in error("--config.optimizer.lr=1")
    assert "config.z_loss takes a value of type float" in error("--config.z_loss", "small")
    assert "unrecognized argument --steps" in error("--steps=3")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_config.load(CONFIGS / "nope.py")


def test_path_fields_are_made_absolute_where_the_user_typed_them(tmp_path, monkeypatch):
    from gqa_jax import run_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_task.py").write_text("")
    config = run_config.load(
        CONFIGS / "finetune.py:task=my_task.py",
        ["--config.vocab=~/spm.model", "--config.data_dir=data", "--config.init_from=gs://b/m"],
    )
    home = os.path.expanduser("~")
    assert (config.task, config.vocab) == (str(tmp_path / "my_task.py"), f"{home}/spm.model")
    assert (config.data_dir, config.init_from) == (str(tmp_path / "data"), "gs://b/m")
    assert run_config.load(CONFIGS / "finetune.py:task=stdlib_docsum").task == "stdlib_docsum"
    # a shipped config by name, its variant naming a task file (not taken for a config file's path)
    assert run_config.load("finetune:task=my_task.py").task == str(tmp_path / "my_task.py")
