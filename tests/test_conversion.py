"""The conversion methods' registry (``gqa_jax.conversion``) and every method in it: exact where
the heads' structure allows it, the standard GQA shape, recorded in the manifest, re-derivable by
``check_conversion``; the names everything else takes derive from the registry."""

import numpy as np
import pytest
from test_convert import logits, make_model

from gqa_jax import checkpoints, conversion
from gqa_jax.config import preset
from gqa_jax.convert import check_conversion, convert_checkpoint, to_grouped
from gqa_jax.model import build, flat_params

EVERYTHING = ("encoder_self", "decoder_self", "cross")
LAYERS = {"encoder_self": ("encoder", "attn"), "decoder_self": ("decoder", "self_attn")}
LAYERS["cross"] = ("decoder", "cross_attn")


@pytest.fixture(scope="module")
def mha4():
    return make_model(preset("tiny"), seed=3)  # N = 4 query heads, MHA


def rebuilt(model, edit):
    """``model`` with ``edit(kind, layer, {"query": q, "key": k, "value": v, "out": o})`` applied to
    every attention layer's float64 projections (in place)."""
    flat = {p: np.asarray(v, np.float64) for p, v in flat_params(model).items()}
    for kind, (stack, module) in LAYERS.items():
        layers = model.config.num_encoder_layers if stack == "encoder" else model.config.num_decoder_layers
        for i in range(layers):
            arrays = {n: flat[(stack, "layers", i, module, n)] for n in ("query", "key", "value", "out")}
            edit(kind, i, arrays)
            for n, a in arrays.items():
                flat[(stack, "layers", i, module, n)] = a
    nested: dict = {}
    for path, value in flat.items():
        node = nested
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value.astype(np.float32)
    return build(model.config, nested)


def rotation(rng, h):
    q, _ = np.linalg.qr(rng.normal(size=(h, h)))
    return q


def converted_logits(model, method, k, attentions=EVERYTHING):
    params, config, manifest = to_grouped(model, model.config, k, method, attentions=attentions)
    return logits(build(config, params)), manifest


BEYOND = [m.name for m in conversion.METHODS if not m.paper]  # the methods beyond the paper's


@pytest.mark.parametrize("method", [m.name for m in conversion.METHODS if not m.seeded])
def test_k_equals_n_returns_the_source(mha4, method):
    out, _ = converted_logits(mha4, method, 4)
    np.testing.assert_allclose(out, logits(mha4), atol=1e-6, rtol=0)


def test_aligned_merges_rotated_heads_exactly_and_mean_does_not(mha4):
    rng = np.random.default_rng(0)

    def rotate_members(kind, i, a):  # heads 1 and 3 are heads 0 and 2 under their own rotations
        for member, ref in ((1, 0), (3, 2)):
            a["key"][:, member] = a["key"][:, ref] @ rotation(rng, a["key"].shape[2])
            a["value"][:, member] = a["value"][:, ref] @ rotation(rng, a["value"].shape[2])

    model = rebuilt(mha4, rotate_members)
    reference = logits(model)
    aligned, manifest = converted_logits(model, "aligned", 2)
    np.testing.assert_allclose(aligned, reference, atol=1e-5, rtol=0)
    svd, _ = converted_logits(model, "svd", 2)  # a rotation is a change of basis: exact as well
    np.testing.assert_allclose(svd, reference, atol=1e-5, rtol=0)
    mean, _ = converted_logits(model, "mean", 2)
    assert np.abs(mean - reference).max() > 1e-2
    assert manifest["method"] == "aligned" and manifest["groups"]["cross"]["groups"] == [[0, 1], [2, 3]]


def test_grouped_finds_scattered_equal_heads(mha4):
    def scatter(kind, i, a):  # heads 2 and 3 repeat heads 0 and 1: equal heads are not contiguous
        for copy, of in ((2, 0), (3, 1)):
            a["key"][:, copy], a["value"][:, copy] = a["key"][:, of], a["value"][:, of]

    model = rebuilt(mha4, scatter)
    reference = logits(model)
    grouped, manifest = converted_logits(model, "grouped", 2)
    np.testing.assert_allclose(grouped, reference, atol=1e-5, rtol=0)
    mean, _ = converted_logits(model, "mean", 2)
    assert np.abs(mean - reference).max() > 1e-2
    cross = manifest["groups"]["cross"]
    assert cross["order"] == [[0, 2, 1, 3]] * 2 and cross["groups"] == [[[0, 2], [1, 3]]] * 2
    assert manifest["groups"]["decoder_self"]["order"] == [[0, 2, 1, 3]] * 2  # one order: the shared bias


def test_a_gqa_source_merges_further(mha4):
    """From GQA-2 (each K/V head read by two query heads) to MQA, every method keeps the shapes."""
    params, config, _ = to_grouped(mha4, mha4.config, 2, "mean", attentions=EVERYTHING)
    gqa = build(config, params)
    for method in BEYOND:
        same, _ = converted_logits(gqa, method, 2)
        np.testing.assert_allclose(same, logits(gqa), atol=1e-6, rtol=0)
        mqa, manifest = converted_logits(gqa, method, 1)
        assert mqa.shape == logits(gqa).shape and np.isfinite(mqa).all()
        assert manifest["target_config"]["num_kv_heads"] == 1


@pytest.mark.parametrize("method", conversion.names())
def test_the_manifest_re_derives_each_method(mha4, tmp_path, method):
    src = checkpoints.save(mha4, tmp_path / "mha")
    dst, manifest = convert_checkpoint(src, tmp_path / method, 2, method, attentions=EVERYTHING)
    assert manifest["method"] == method and check_conversion(dst) == []


# ------------------------------------------------------------------------------ the registry
def test_every_method_writes_the_standard_gqa_shape_and_only_what_it_reads(mha4):
    source = flat_params(mha4)
    for method in conversion.METHODS:
        for k in (2, 1):
            params, config, _ = to_grouped(mha4, mha4.config, k, method.name, attentions=EVERYTHING)
            flat = flat_params(params)
            assert flat.keys() == source.keys()
            for path, value in flat.items():
                if path[-1] in ("key", "value") and path[1] == "layers":
                    assert value.shape == (32, k, 8) and value.dtype == source[path].dtype, (method, path)
                elif path[-1] not in method.reads and path[-1] != "embedding":
                    assert value is source[path] or np.array_equal(value, source[path]), (method, path)
            assert np.isfinite(logits(build(config, params))).all()


def test_names_everything_takes_come_from_the_registry():
    assert (
        conversion.names() == tuple(m.name for m in conversion.METHODS) and len(set(conversion.names())) == 7
    )
    assert conversion.paper() == ("mean", "first", "random")
    assert conversion.calibrated() == ("grouped", "svd")
    assert conversion.variants()[-2:] == ("grouped-calibrated", "svd-calibrated")
    assert conversion.variant("svd-calibrated") == (conversion.get("svd"), True)
    with pytest.raises(ValueError, match="unknown conversion method 'median'; known: mean, first, random"):
        conversion.get("median")
    with pytest.raises(
        ValueError, match="calibration is used by method grouped and svd only, not method='mean'"
    ):
        conversion.variant("mean-calibrated")
    from gqa_jax.experiments import paper

    assert paper.conversion_methods("all") == conversion.variants()
    assert paper.method_fields("grouped-calibrated") == ("grouped", paper.CALIBRATION_BATCHES)
    from gqa_jax.cli import convert as convert_cli
    from gqa_jax.cli import options

    parser = options.Parser(prog="convert")
    convert_cli.add_args(parser)
    (method_option,) = [a for a in parser._actions if a.dest == "method"]
    assert tuple(method_option.choices) == conversion.names()
    assert all(m.summary in method_option.help for m in conversion.METHODS)


def test_the_docs_table_lists_every_method():
    """docs/checkpoints.md's table of methods: one row per method of the registry, with its flags."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "checkpoints.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 4:
            rows[cells[0].strip("`")] = cells
    assert list(rows) == list(conversion.names())
    for m in conversion.METHODS:
        assert rows[m.name][1:3] == ["yes" if m.paper else "no", "yes" if m.calibrates else "no"], m.name


def test_medoid_keeps_the_most_central_head(mha4):
    def center(kind, i, a):  # head 2 is the mean of heads 0, 1, 3, and so of all four
        for name in ("key", "value"):
            a[name][:, 2] = (a[name][:, 0] + a[name][:, 1] + a[name][:, 3]) / 3

    model = rebuilt(mha4, center)
    params, _, _ = to_grouped(model, model.config, 1, "medoid", attentions=EVERYTHING)  # first: head 0
    source, flat = flat_params(model), flat_params(params)
    for path in source:
        if path[-1] in ("key", "value") and path[1] == "layers":
            np.testing.assert_array_equal(np.asarray(flat[path])[:, 0], np.asarray(source[path])[:, 2])
