"""MHA -> GQA / MQA conversion: exactness, the paper's equivalence check, the CLI and its manifest."""

from __future__ import annotations

import datetime
import errno
import functools
import json
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import gqa_jax
from gqa_jax import checkpoints, decoding
from gqa_jax.__main__ import main
from gqa_jax.cache import cache_bytes, expected_cache_bytes
from gqa_jax.config import preset
from gqa_jax.convert import (
    check_conversion,
    content_hash,
    group_map,
    target_config,
    to_grouped,
)
from gqa_jax.model import T5, build

KV = ("key", "value")
LOCATIONS = {"encoder_self": ("encoder", "attn"), "decoder_self": ("decoder", "self_attn")}
LOCATIONS["cross"] = ("decoder", "cross_attn")


def make_model(config, seed: int = 0) -> T5:
    """A T5 whose parameters numpy draws at T5's scales (JAX's eager random init takes seconds to
    compile): fan-in normal projections, unit-normal embeddings and biases, norms near 1, so the
    logits have unit scale as in a real checkpoint."""
    model = nnx.eval_shape(lambda: T5(config, rngs=nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    rng = np.random.default_rng(seed)

    def draw(path, x: jax.ShapeDtypeStruct) -> jax.Array:
        name = path[-1].key
        if name == "scale":
            w = 1.0 + 0.1 * rng.normal(size=x.shape)
        elif name == "embedding":
            w = rng.normal(size=x.shape)
        else:  # [D, N, H], [D, K, H], [D, F], [F, D], [D, V]: fan-in D (or F); out [N, H, D]: N * H
            fan_in = x.shape[0] * x.shape[1] if name == "out" else x.shape[0]
            w = rng.normal(size=x.shape) / np.sqrt(fan_in)
        return jnp.asarray(w, x.dtype)

    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(state)))
    nnx.update(model, state)
    return model


def flat(model_or_params) -> dict[str, np.ndarray]:
    """``{"decoder.layers.0.self_attn.key": array}`` of a model or a pure params dict."""
    if isinstance(model_or_params, nnx.Module):
        model_or_params = nnx.to_pure_dict(nnx.state(model_or_params, nnx.Param))
    leaves = jax.tree_util.tree_flatten_with_path(model_or_params)[0]
    return {".".join(str(k.key) for k in path): np.asarray(v) for path, v in leaves}


def kv_names(config, kind: str) -> list[str]:
    stack, module = LOCATIONS[kind]
    layers = config.num_encoder_layers if stack == "encoder" else config.num_decoder_layers
    return [f"{stack}.layers.{i}.{module}.{p}" for i in range(layers) for p in KV]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, encoder_ids, decoder_ids):
    return nnx.merge(graphdef, state)(encoder_ids, decoder_ids)


def logits(model: T5) -> np.ndarray:
    encoder_ids = jnp.array([[5, 9, 17, 3, 1, 0, 0], [7, 2, 1, 0, 0, 0, 0]], jnp.int32)  # id 0 pads
    decoder_ids = jnp.array([[0, 4, 8, 1, 0], [0, 6, 1, 0, 0]], jnp.int32)
    graphdef, state = nnx.split(model)
    return np.asarray(_forward(graphdef, jax.device_put(state, jax.devices()[0]), encoder_ids, decoder_ids))


@pytest.fixture(scope="module")
def mha4() -> T5:
    return make_model(preset("tiny"))  # N = 4 query heads, MHA


@pytest.fixture(scope="module")
def mha8() -> T5:
    return make_model(preset("tiny", num_heads=8), seed=1)


# ----------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("method", ["mean", "first"])
@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_k_equals_n_is_the_identity(mha4, method, param_dtype):
    model = mha4 if param_dtype == "float32" else make_model(preset("tiny", param_dtype="bfloat16"))
    everything = ("encoder_self", "decoder_self", "cross")
    for attentions in (everything, ("decoder_self", "cross")):
        params, config, manifest = to_grouped(model, model.config, 4, method, attentions=attentions)
        want, got = flat(model), flat(params)
        assert want.keys() == got.keys()
        assert all(same_bits(want[k], got[k]) for k in want), method
        assert manifest["source_params_sha256"] == manifest["target_params_sha256"] == content_hash(model)
        if attentions == everything:
            assert config == model.config.replace(grouped_attentions=everything)
    assert config == model.config
    if param_dtype == "float32":
        np.testing.assert_array_equal(logits(build(config, params)), logits(model))


@pytest.mark.parametrize("method", ["mean", "first"])
@pytest.mark.parametrize(
    "K, attentions",
    [
        (2, ("decoder_self", "cross")),
        (1, ("decoder_self", "cross")),
        (1, ("encoder_self", "decoder_self", "cross")),
    ],
)
def test_equal_heads_in_each_group_give_the_mha_logits(mha4, method, K, attentions):
    """The paper's equivalence check: an MHA model whose K/V heads agree within each group."""
    N, G = 4, 4 // K
    state = nnx.state(mha4, nnx.Param)
    pure = jax.tree.map(lambda x: x, nnx.to_pure_dict(state))  # a copy of the tree structure
    for kind in attentions:
        stack, module = LOCATIONS[kind]
        for layer in pure[stack]["layers"].values():
            for p in KV:
                w = np.asarray(layer[module][p])  # [D, N, H]
                layer[module][p] = jnp.asarray(np.repeat(w[:, ::G], G, axis=1))  # head n := head n//G*G
    mha = build(mha4.config, pure)
    params, config, _ = to_grouped(mha, mha4.config, K, method, attentions=attentions)
    assert all(config.kv_heads(kind) == K for kind in attentions) and config.num_heads == N
    reference, converted = logits(mha), logits(build(config, params))
    scale = np.abs(reference).max()
    assert 1.0 < scale < 10.0  # unit-scale logits, as from a real checkpoint
    # Not bit-identical: XLA sums the K-head and the N-head einsums in different orders (1 ulp in
    # the attention logits); measured max |diff| ~1.5e-6 at logits of max |x| ~3.5 (~5 ulp).
    np.testing.assert_allclose(converted, reference, rtol=0, atol=1e-6 * scale)


def test_first_picks_head_g_times_G(mha8):
    params, _, _ = to_grouped(mha8, mha8.config, 2, "first")  # G' = 4
    src, got = flat(mha8), flat(params)
    for name in kv_names(mha8.config, "decoder_self") + kv_names(mha8.config, "cross"):
        assert got[name].shape == (32, 2, 8)
        for g in range(2):
            assert same_bits(got[name][:, g], src[name][:, g * 4])


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_mean_equals_a_numpy_mean(mha8, param_dtype):
    model = (
        mha8 if param_dtype == "float32" else make_model(preset("tiny", num_heads=8, param_dtype="bfloat16"))
    )
    params, _, _ = to_grouped(model, model.config, 2, "mean", attentions=("encoder_self", "cross"))
    src, got = flat(model), flat(params)
    D, N, H = src["encoder.layers.0.attn.key"].shape
    for name in kv_names(model.config, "encoder_self") + kv_names(model.config, "cross"):
        w = src[name].astype(np.float32).reshape(D, 2, N // 2, H)  # [D, K', G', H]
        assert got[name].dtype == np.dtype(param_dtype)
        assert same_bits(got[name], np.mean(w, axis=2).astype(src[name].dtype))  # float32 mean
        w64 = w.astype(np.float64)
        mean64 = (w64[:, :, 0] + w64[:, :, 1] + w64[:, :, 2] + w64[:, :, 3]) / 4  # [D, K', H]
        np.testing.assert_allclose(
            got[name].astype(np.float64), mean64, rtol=0, atol=1e-7 if param_dtype == "float32" else 2e-3
        )


def test_random_is_deterministic_per_seed_and_differs_across_seeds(mha4):
    a = flat(to_grouped(mha4, mha4.config, 1, "random", seed=0)[0])
    b = flat(to_grouped(mha4, mha4.config, 1, "random", seed=0)[0])
    c = flat(to_grouped(mha4, mha4.config, 1, "random", seed=1)[0])
    names = kv_names(mha4.config, "decoder_self") + kv_names(mha4.config, "cross")
    assert all(same_bits(a[n], b[n]) for n in a)
    assert all(not np.array_equal(a[n], c[n]) for n in names)
    draws = np.stack([a[n] for n in names])  # [8, D=32, 1, H=8]: the model's 1/sqrt(D) init
    assert len({a[n].tobytes() for n in names}) == len(names)  # every projection its own draw
    assert 0.8 < draws.std() * np.sqrt(32) < 1.2 and abs(draws.mean()) < 0.05
    first = flat(to_grouped(mha4, mha4.config, 1, "first")[0])
    assert all(not np.array_equal(a[n], first[n]) for n in names)


@pytest.mark.parametrize("method", ["mean", "first", "random"])
def test_everything_else_is_copied_bit_for_bit(mha4, method):
    before = content_hash(mha4)
    params, config, manifest = to_grouped(mha4, mha4.config, 2, method)
    src, got = flat(mha4), flat(params)
    converted = set(kv_names(config, "decoder_self") + kv_names(config, "cross"))
    assert src.keys() == got.keys() and len(converted) == 8
    for name in src:
        if name in converted:
            assert got[name].shape == (32, 2, 8) and got[name].dtype == src[name].dtype, name
        else:
            assert same_bits(got[name], src[name]), name
    assert content_hash(mha4) == before == manifest["source_params_sha256"]
    assert manifest["target_params_sha256"] == content_hash(params)


@pytest.mark.parametrize("method", ["mean", "first"])
def test_conversions_chain(mha8, method):
    """MHA-8 -> GQA-4 -> MQA equals MHA-8 -> MQA (mean of equal-size means is the mean)."""
    gqa4, config4, _ = to_grouped(mha8, mha8.config, 4, method)
    chained, config1, manifest = to_grouped(gqa4, config4, 1, method)
    direct, config_direct, _ = to_grouped(mha8, mha8.config, 1, method)
    assert config1 == config_direct
    assert manifest["groups"]["cross"]["groups"] == [[0, 1, 2, 3]]  # of the GQA-4 heads
    a, b = flat(chained), flat(direct)
    for name in a:
        if method == "first":
            assert same_bits(a[name], b[name]), name
        else:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_group_map():
    config = preset("tiny", num_heads=8, num_kv_heads=4)
    assert group_map(config, 2, ("cross", "encoder_self")) == {
        "encoder_self": {"source_kv_heads": 8, "target_kv_heads": 2, "groups": [[0, 1, 2, 3], [4, 5, 6, 7]]},
        "cross": {"source_kv_heads": 4, "target_kv_heads": 2, "groups": [[0, 1], [2, 3]]},
    }


def test_content_hash():
    model = make_model(preset("tiny"))
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    h = content_hash(model)
    assert re.fullmatch("[0-9a-f]{64}", h)
    assert content_hash(pure) == content_hash(nnx.state(model, nnx.Param)) == h
    assert content_hash(jax.tree.map(np.asarray, pure)) == h  # numpy or jax, same bits
    flipped = jax.tree.map(lambda x: x, pure)
    w = np.array(flipped["decoder"]["layers"][1]["mlp"]["wo"])
    w.view(np.uint32)[3, 5] ^= 1  # one bit
    flipped["decoder"]["layers"][1]["mlp"]["wo"] = w
    assert content_hash(flipped) != h
    recast = jax.tree.map(lambda x: x, pure)
    recast["shared"]["embedding"] = pure["shared"]["embedding"].astype(jnp.bfloat16).astype(jnp.float16)
    assert content_hash(recast) != h


# ------------------------------------------------------------------------ the config rule
def test_target_config_rule():
    mha = preset("tiny")  # grouped_attentions (decoder_self, cross) at K = N = 4
    assert target_config(mha, 2, ("decoder_self", "cross")) == mha.replace(num_kv_heads=2)
    # An MHA attention that is not converted leaves the grouped set (it keeps N heads).
    assert target_config(mha, 2, ("cross",)).grouped_attentions == ("cross",)
    assert target_config(mha, 2, ("encoder_self",)).grouped_attentions == ("encoder_self",)
    # One already grouped with K' heads stays grouped; the encoder joins it.
    gqa2 = preset("tiny", num_kv_heads=2)
    new = target_config(gqa2, 2, ("encoder_self",))
    assert new.grouped_attentions == ("encoder_self", "decoder_self", "cross")
    assert [new.kv_heads(k) for k in ("encoder_self", "decoder_self", "cross")] == [2, 2, 2]
    # Requested in any order, with repeats: canonical order.
    assert target_config(mha, 1, ("cross", "decoder_self", "cross")).grouped_attentions == (
        "decoder_self",
        "cross",
    )
    # A grouped attention left at another K cannot sit beside K' in one ModelConfig.
    with pytest.raises(ValueError, match=r"'decoder_self' is grouped in the source with num_kv_heads=2.*"):
        target_config(gqa2, 1, ("cross",))
    with pytest.raises(ValueError, match=r"convert it too: attentions=\['encoder_self', 'decoder_self'\]"):
        target_config(gqa2, 1, ("encoder_self",))


def test_partial_conversion_keeps_the_rest(mha4):
    params, config, manifest = to_grouped(mha4, mha4.config, 1, "mean", attentions=("cross",))
    assert config.kv_heads("cross") == 1 and config.kv_heads("decoder_self") == 4
    assert list(manifest["groups"]) == ["cross"]
    src, got = flat(mha4), flat(params)
    assert all(same_bits(got[n], src[n]) for n in kv_names(config, "decoder_self"))
    model = build(config, params)
    assert model.decoder.layers[1].cross_attn.value[...].shape == (32, 1, 8)  # [D, K', H]
    assert model.decoder.layers[1].self_attn.value[...].shape == (32, 4, 8)


# ---------------------------------------------------------------------------------- errors
def test_library_errors(mha4):
    gqa2 = make_model(preset("tiny", num_kv_heads=2), seed=2)
    cases = [
        ((mha4, mha4.config, 3, "mean"), "num_kv_heads=3 does not divide the 4 K/V heads of 'decoder_self'"),
        ((gqa2, gqa2.config, 4, "mean"), "num_kv_heads=4 is larger than the 2 K/V heads of 'decoder_self'"),
        ((mha4, mha4.config, 0, "mean"), "num_kv_heads=0 must be an integer >= 1"),
        ((mha4, mha4.config, 2, "median"), "unknown conversion method 'median'; known: mean, first"),
        (
            (mha4, gqa2.config, 2, "mean"),
            "(?s)source do not match the config.*decoder.layers.0.cross_attn.key",
        ),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            to_grouped(*args)
    with pytest.raises(ValueError, match="unknown attention name\\(s\\) \\['decoder'\\]"):
        to_grouped(mha4, mha4.config, 2, "mean", attentions=("decoder",))
    with pytest.raises(ValueError, match="attentions is empty"):
        to_grouped(mha4, mha4.config, 2, "mean", attentions=())
    for seed in ("0", -1, 2**32):
        with pytest.raises(ValueError, match=re.escape(f"seed={seed!r} must be an integer in [0, 2**32)")):
            to_grouped(mha4, mha4.config, 2, "random", seed=seed)


# ------------------------------------------------------------------------ checkpoints + CLI
@pytest.fixture(scope="module")
def src(tmp_path_factory, mha4) -> Path:
    return checkpoints.save(mha4, tmp_path_factory.mktemp("src") / "mha")


def tree_bytes(path: Path) -> dict[str, bytes]:
    path = Path(path)
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def convert_cli(*argv) -> int:
    return main(["convert", *map(str, argv)])


def test_cli_converts_and_checks(src, mha4, tmp_path, capsys):
    before = tree_bytes(src)
    dst = tmp_path / "gqa2"
    assert convert_cli("--src", src, "--dst", dst, "--num-kv-heads", 2, "--method", "mean") == 0
    out = capsys.readouterr().out
    assert f"converted {src} (gqa_jax) -> {dst}" in out
    assert "cross: K/V heads 4 -> 2, groups [[0, 1], [2, 3]]" in out
    assert tree_bytes(src) == before  # the source is never written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gqa2"]  # no temporaries left

    manifest = json.loads((dst / "manifest.json").read_text())
    assert manifest["format"] == "gqa_jax.convert" and manifest["version"] == 1
    assert manifest["source"] == {"path": str(src), "kind": "gqa_jax"}
    assert manifest["source_params_sha256"] == content_hash(mha4) == content_hash(checkpoints.load(src)[0])
    assert (manifest["method"], manifest["seed"], manifest["num_kv_heads"]) == ("mean", None, 2)
    assert manifest["attentions"] == ["decoder_self", "cross"]
    assert manifest["source_config"] == mha4.config.to_dict()
    assert manifest["groups"]["decoder_self"]["groups"] == [[0, 1], [2, 3]]
    assert manifest["gqa_jax_version"] == gqa_jax.__version__
    assert manifest["git_commit"] is None or re.fullmatch("[0-9a-f]{40}", manifest["git_commit"])
    assert datetime.datetime.fromisoformat(manifest["created_utc"]).utcoffset() == datetime.timedelta(0)

    model, config = checkpoints.load(dst)
    assert manifest["target_config"] == config.to_dict() and config.kv_heads("cross") == 2
    assert manifest["target_params_sha256"] == content_hash(model)
    assert model.decoder.layers[0].self_attn.key[...].shape == (32, 2, 8)  # [D, K', H]
    assert model.encoder.layers[0].attn.key[...].shape == (32, 4, 8)
    assert np.isfinite(logits(model)).all()
    mha_cache = expected_cache_bytes(mha4.config, 2, 7, 5, "float32")
    gqa_cache = expected_cache_bytes(config, 2, 7, 5, "float32")
    assert all(gqa_cache[p] * 4 == mha_cache[p] * 2 for p in ("self", "cross", "total"))  # K'/N
    # The converted checkpoint decodes, and its measured cache is K'/N of the source's.
    ids = np.array([[5, 6, 7, 8, 0, 0, 0], [9, 10, 11, 12, 13, 14, 15]])
    result = decoding.greedy_decode(model, ids, 5)
    assert result.tokens.shape == (2, 5) and (np.asarray(result.lengths) >= 1).all()
    prefill = nnx.jit(decoding.prefill, static_argnums=2)  # one program each, not one per eager op
    measured = cache_bytes(prefill(model, jnp.asarray(ids), 5))
    assert measured == gqa_cache
    assert measured["total"] * 4 == cache_bytes(prefill(mha4, jnp.asarray(ids), 5))["total"] * 2

    assert convert_cli("--check", dst) == 0
    assert capsys.readouterr().out == f"OK: {dst} is bit-identical to its re-derived conversion\n"
    assert tree_bytes(src) == before


def test_cli_random_and_chained_checks(src, tmp_path, capsys):
    rnd, mqa = tmp_path / "rnd", tmp_path / "mqa"
    assert (
        convert_cli("--src", src, "--dst", rnd, "--num-kv-heads", 2, "--method", "random", "--seed", 7) == 0
    )
    assert json.loads((rnd / "manifest.json").read_text())["seed"] == 7
    assert convert_cli("--src", rnd, "--dst", mqa, "--num-kv-heads", 1, "--method", "first") == 0
    assert convert_cli("--check", rnd) == 0 and convert_cli("--check", mqa) == 0
    model, config = checkpoints.load(mqa)
    assert config.num_kv_heads == 1
    capsys.readouterr()


def test_check_finds_a_tampered_destination_and_a_changed_source(src, mha4, tmp_path, capsys):
    own_src, dst = Path(shutil.copytree(src, tmp_path / "src")), tmp_path / "dst"
    assert convert_cli("--src", own_src, "--dst", dst, "--num-kv-heads", 1, "--method", "mean") == 0
    manifest = (dst / "manifest.json").read_text()
    model, config = checkpoints.load(dst)
    state = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(state)
    pure["decoder"]["layers"][1]["cross_attn"]["value"] += 1e-3
    checkpoints.save(build(config, pure), dst, overwrite=True, extra_files={"manifest.json": manifest})
    capsys.readouterr()
    assert convert_cli("--check", dst) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"FAILED: {dst} does not match")
    assert "decoder.layers.1.cross_attn.value: differs from the re-derived conversion" in out
    assert "decoder.layers.0.cross_attn.value" not in out

    checkpoints.save(make_model(mha4.config, seed=5), own_src, overwrite=True)
    assert check_conversion(dst) == [f"source {own_src} changed since the conversion (content hash)"]


def test_cli_destination_rules(src, mha4, tmp_path, capsys):
    dst = tmp_path / "dst"
    args = ["--src", src, "--dst", dst, "--num-kv-heads", 2, "--method", "first"]
    assert convert_cli(*args) == 0
    capsys.readouterr()
    assert convert_cli(*args) == 2
    assert re.search(
        f"destination {re.escape(str(dst))} already exists; pass --overwrite", capsys.readouterr().err
    )
    assert convert_cli(*args[:-1], "mean", "--overwrite") == 0
    assert json.loads((dst / "manifest.json").read_text())["method"] == "mean"
    for bad_dst in (src, src / "inside"):
        assert convert_cli("--src", src, "--dst", bad_dst, "--num-kv-heads", 2, "--method", "mean") == 2
        assert "overlap; the source is never written into" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]


def test_failed_write_leaves_no_destination(src, tmp_path, monkeypatch, capsys):
    def broken_save(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "dst"))

    monkeypatch.setattr(ocp.StandardCheckpointer, "save", broken_save)
    assert convert_cli("--src", src, "--dst", tmp_path / "dst", "--num-kv-heads", 2, "--method", "mean") == 2
    err = capsys.readouterr().err.strip().splitlines()
    hint = "free some space or choose a path on another disk"
    assert err[-1].endswith(f"error: No space left on device ({tmp_path / 'dst'}): {hint}")
    assert "Traceback" not in "".join(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-kv-heads", "3", "--method", "mean"], "num_kv_heads=3 does not divide the 4 K/V heads"),
        (["--num-kv-heads", "8", "--method", "mean"], "num_kv_heads=8 is larger than the 4 K/V heads"),
        (["--num-kv-heads", "2", "--method", "median"], "invalid choice: 'median'"),
        (["--num-kv-heads", "2", "--method", "mean", "--attentions", "self"], "unknown attention name"),
        (["--num-kv-heads", "0", "--method", "mean"], "must be a positive integer"),
        (["--method", "mean"], "missing --num-kv-heads"),
    ],
)
def test_cli_bad_arguments(src, tmp_path, capsys, argv, message):
    assert convert_cli("--src", src, "--dst", tmp_path / "dst", *argv) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_cli_bad_sources(tmp_path, capsys):
    args = ["--dst", tmp_path / "dst", "--num-kv-heads", 2, "--method", "mean"]
    assert convert_cli("--src", tmp_path / "nowhere", *args) == 2
    assert f"source {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "config.json").write_text("{}")
    assert convert_cli("--src", tmp_path / "notes", *args) == 2
    assert "is not a checkpoint: expected a gqa_jax checkpoint" in capsys.readouterr().err
    assert convert_cli("--check", tmp_path / "notes") == 2
    assert "has no manifest.json" in capsys.readouterr().err
    assert convert_cli("--check", tmp_path / "notes", "--method", "mean") == 2
    assert "--check DST takes no other options" in capsys.readouterr().err


def test_cli_converts_a_huggingface_directory(tmp_path, capsys):
    pytest.importorskip("torch", reason="building a HF T5 source needs torch (CPU)")
    pytest.importorskip("transformers", reason="building a HF T5 source needs transformers")
    from hf_models import tiny_hf_t5

    hf = tiny_hf_t5(ffn="gated-gelu", tie=False, separate_head=True, buckets=8, max_distance=16, seed=0)
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    hf_model, hf_cfg = checkpoints.load_hf_t5(tmp_path / "hf")
    before = content_hash(hf_model)

    dst = tmp_path / "mqa"
    assert convert_cli("--src", tmp_path / "hf", "--dst", dst, "--num-kv-heads", 1, "--method", "mean") == 0
    assert "(huggingface)" in capsys.readouterr().out
    manifest = json.loads((dst / "manifest.json").read_text())
    assert manifest["source"]["kind"] == "huggingface" and manifest["source_params_sha256"] == before
    model, config = checkpoints.load(dst)
    assert config == hf_cfg.replace(num_kv_heads=1)
    src, got = flat(hf_model), flat(model)
    assert same_bits(
        got["decoder.layers.0.cross_attn.key"], src["decoder.layers.0.cross_attn.key"].mean(1, keepdims=True)
    )
    assert same_bits(got["encoder.layers.0.attn.key"], src["encoder.layers.0.attn.key"])
    assert convert_cli("--check", dst) == 0
    assert content_hash(checkpoints.load_hf_t5(tmp_path / "hf")[0]) == before
