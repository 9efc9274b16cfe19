"""Our orbax checkpoint format: exact round trips and clear errors (tiny configs, CPU)."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from gqa_jax.checkpoints import load, save
from gqa_jax.config import preset
from gqa_jax.model import T5


def make_model(seed: int = 0, **overrides) -> T5:
    """A tiny T5 whose parameters numpy draws (JAX's eager random init takes seconds to compile)."""
    model = nnx.eval_shape(lambda: T5(preset("tiny", **overrides), rngs=nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    rng = np.random.default_rng(seed)

    def draw(x: jax.ShapeDtypeStruct) -> jax.Array:
        return jnp.asarray(rng.normal(0.0, 0.5, x.shape), x.dtype)

    nnx.replace_by_pure_dict(state, jax.tree.map(draw, nnx.to_pure_dict(state)))
    nnx.update(model, state)
    return model


def pure_params(model: T5) -> dict[str, jax.Array]:
    flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model, nnx.Param)))[0]
    return {jax.tree_util.keystr(k): v for k, v in flat}


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef: nnx.GraphDef, state: nnx.State, encoder_ids: jax.Array, decoder_ids: jax.Array):
    return nnx.merge(graphdef, state)(encoder_ids, decoder_ids)


def logits_on_padded_batch(model: T5) -> np.ndarray:
    encoder_ids = jnp.array([[5, 9, 17, 3, 1, 0, 0], [7, 2, 1, 0, 0, 0, 0]], jnp.int32)  # id 0 pads
    decoder_ids = jnp.array([[0, 4, 8, 1, 0], [0, 6, 1, 0, 0]], jnp.int32)
    graphdef, state = nnx.split(model)
    # Commit to one device as orbax-restored arrays are, so both models share one compilation.
    state = jax.device_put(state, jax.devices()[0])
    return np.asarray(_forward(graphdef, state, encoder_ids, decoder_ids))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, T5]:
    """One tiny GQA-2 checkpoint; tests that damage it work on a copy (see `ckpt`)."""
    model = make_model(num_kv_heads=2)
    return save(model, tmp_path_factory.mktemp("saved") / "ckpt"), model


@pytest.fixture
def ckpt(saved, tmp_path) -> Path:
    return Path(shutil.copytree(saved[0], tmp_path / "ckpt"))


def edit_config(path: Path, **changes) -> None:
    fields = json.loads((path / "config.json").read_text())
    fields.update(changes)
    (path / "config.json").write_text(json.dumps(fields))


# ------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize(
    "num_kv_heads, tied, param_dtype",  # every K, and every pair of (tied, param_dtype)
    [(4, False, "float32"), (2, True, "bfloat16"), (1, False, "bfloat16"), (1, True, "float32")],
    ids=["mha-untied-f32", "gqa2-tied-bf16", "mqa-untied-bf16", "mqa-tied-f32"],
)
def test_round_trip_is_exact(tmp_path, num_kv_heads, tied, param_dtype):
    model = make_model(num_kv_heads=num_kv_heads, tie_word_embeddings=tied, param_dtype=param_dtype)
    path = save(model, str(tmp_path / "ckpt"))  # a str path works too
    restored, config = load(path)

    assert config == model.config == restored.config
    want, got = pure_params(model), pure_params(restored)
    assert want.keys() == got.keys()
    assert ("['lm_head']" in got) == (not tied)
    for name, value in want.items():
        assert isinstance(got[name], jax.Array), name  # restored, not abstract
        assert got[name].dtype == value.dtype == jnp.dtype(param_dtype), name
        assert np.array_equal(np.asarray(got[name]), np.asarray(value)), name
    np.testing.assert_array_equal(logits_on_padded_batch(restored), logits_on_padded_batch(model))


def test_layout_and_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = save(make_model(tie_word_embeddings=True), "ckpt")
    assert path == tmp_path / "ckpt"
    assert sorted(p.name for p in path.iterdir()) == ["checkpoint.json", "config.json", "params"]
    assert json.loads((path / "checkpoint.json").read_text()) == {"format": "gqa_jax", "version": 1}
    assert load("ckpt")[1].tie_word_embeddings
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o777 & ~umask  # not tempfile.mkdtemp's 0700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporaries left


def test_save_into_existing_empty_dir(tmp_path):
    (tmp_path / "ckpt").mkdir()
    save(make_model(), tmp_path / "ckpt")
    assert load(tmp_path / "ckpt")[1] == preset("tiny")


def test_extra_files_land_with_the_checkpoint(tmp_path, monkeypatch):
    model = make_model(num_kv_heads=2)
    path = save(model, tmp_path / "ckpt", extra_files={"manifest.json": '{"a": 1}\n', "NOTES": "hi"})
    assert sorted(p.name for p in path.iterdir()) == [
        "NOTES",
        "checkpoint.json",
        "config.json",
        "manifest.json",
        "params",
    ]
    assert (path / "manifest.json").read_text() == '{"a": 1}\n' and (path / "NOTES").read_text() == "hi"
    assert load(path)[1] == model.config
    save(model, path, overwrite=True)  # a replaced checkpoint does not keep the old extra files
    assert sorted(p.name for p in path.iterdir()) == ["checkpoint.json", "config.json", "params"]

    def broken_save(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ocp.StandardCheckpointer, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):  # nothing half-written, manifest included
        save(model, tmp_path / "fresh", extra_files={"manifest.json": "{}"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.parametrize("name", ["checkpoint.json", "config.json", "params", "sub/manifest.json", "..", ""])
def test_extra_files_must_be_plain_new_names(tmp_path, name):
    with pytest.raises(ValueError, match="must be a plain file name other than checkpoint.json"):
        save(make_model(), tmp_path / "ckpt", extra_files={name: "x"})
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ save errors
def test_save_refuses_existing_destination(saved, tmp_path):
    path, model = saved
    before = pure_params(model)
    with pytest.raises(FileExistsError, match=re.escape(str(path)) + " already exists.*overwrite=True"):
        save(make_model(num_kv_heads=2, param_dtype="bfloat16"), path)
    restored, config = load(path)
    assert config == model.config
    assert all(np.array_equal(before[k], v) for k, v in pure_params(restored).items())

    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("precious")
    for overwrite in (False, True):  # overwrite=True replaces only a gqa_jax checkpoint
        with pytest.raises(FileExistsError, match=re.escape(str(other))):
            save(make_model(), other, overwrite=overwrite)
    assert [p.name for p in other.iterdir()] == ["keep.txt"]
    assert (other / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


def test_overwrite_replaces_a_checkpoint(ckpt):
    new = make_model(seed=1, num_kv_heads=1, param_dtype="bfloat16")
    save(new, ckpt, overwrite=True)
    restored, config = load(ckpt)
    assert config == new.config
    assert all(np.array_equal(pure_params(new)[k], v) for k, v in pure_params(restored).items())
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["ckpt"]


def test_failed_save_leaves_no_checkpoint_and_keeps_the_old_one(ckpt, monkeypatch):
    def broken_save(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ocp.StandardCheckpointer, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save(make_model(), ckpt.parent / "fresh")
    with pytest.raises(OSError, match="disk full"):
        save(make_model(), ckpt, overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["ckpt"]
    assert load(ckpt)[1] == preset("tiny", num_kv_heads=2)


def test_failed_final_rename_puts_the_old_checkpoint_back(ckpt, monkeypatch):
    replace = os.replace

    def failing_replace(src, dst):
        if Path(src).name.startswith("ckpt.tmp-"):  # the new checkpoint moving into place
            raise OSError("rename failed")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="rename failed"):
        save(make_model(), ckpt, overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["ckpt"]
    assert load(ckpt)[1] == preset("tiny", num_kv_heads=2)


# ------------------------------------------------------------------------------ load errors
def test_load_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'nope'}: the path does not exist")):
        load(tmp_path / "nope")


def test_load_not_a_checkpoint(tmp_path):
    with pytest.raises(
        ValueError, match="not a gqa_jax checkpoint: missing checkpoint.json, config.json, params"
    ):
        load(tmp_path)


@pytest.mark.parametrize("part", ["config.json", "params", "checkpoint.json"])
def test_load_incomplete_checkpoint(ckpt, part):
    target = ckpt / part
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(ValueError, match=re.escape(f"{ckpt} is not a gqa_jax checkpoint: missing {part}")):
        load(ckpt)


def test_load_unknown_format_version(ckpt):
    (ckpt / "checkpoint.json").write_text(json.dumps({"format": "gqa_jax", "version": 99}))
    with pytest.raises(ValueError, match="unsupported checkpoint format.*'version': 99"):
        load(ckpt)


def test_load_malformed_config(ckpt):
    (ckpt / "config.json").write_text('{"d_model": 32,')
    with pytest.raises(ValueError, match=re.escape(f"{ckpt / 'config.json'}: cannot read JSON")):
        load(ckpt)
    (ckpt / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="invalid model config: expected a JSON object"):
        load(ckpt)


def test_load_config_with_unknown_field(ckpt):
    edit_config(ckpt, bogus_field=3)
    with pytest.raises(ValueError, match=r"config\.json: invalid model config: .*unknown field.*bogus_field"):
        load(ckpt)


def test_load_config_with_invalid_value(ckpt):
    edit_config(ckpt, num_kv_heads=3)
    with pytest.raises(
        ValueError, match=r"invalid model config: .*num_heads=4 is not divisible by num_kv_heads=3"
    ):
        load(ckpt)


def test_load_params_not_matching_config(ckpt):
    edit_config(ckpt, num_kv_heads=1)  # saved as GQA-2: decoder K/V are [D=32, K=2, H=8]
    with pytest.raises(ValueError, match="parameters do not match") as err:
        load(ckpt)
    message = str(err.value)
    assert (
        "decoder.layers.0.self_attn.key: config expects (32, 1, 8) float32, checkpoint has (32, 2, 8)"
        in message
    )
    assert "decoder.layers.1.cross_attn.value" in message
    assert "encoder.layers" not in message  # encoder self-attention is MHA either way


def test_load_params_missing_or_extra(ckpt):
    edit_config(ckpt, tie_word_embeddings=True)
    with pytest.raises(ValueError, match="lm_head: in checkpoint but not in the model"):
        load(ckpt)
    edit_config(ckpt, tie_word_embeddings=False, mlp_activation="relu")
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.wi_1: in checkpoint but not in the model"):
        load(ckpt)


def test_load_params_with_other_dtype(ckpt):
    edit_config(ckpt, param_dtype="bfloat16")
    with pytest.raises(
        ValueError,
        match=re.escape(
            "shared.embedding: config expects (128, 32) bfloat16, checkpoint has (128, 32) float32"
        ),
    ):
        load(ckpt)
