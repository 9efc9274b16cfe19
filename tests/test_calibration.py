"""Calibrated ``grouped`` and ``svd`` conversions: the statistics (second moments of each K/V
input), the methods weighted by them, the manifest and stored file, the CLI and the uptraining
config."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
from flax import nnx
from test_convert import convert_cli, logits, make_model
from test_training import tiny_config

from gqa_jax import calibration, checkpoints, conversion, training
from gqa_jax.calibration_stats import expected_shape, read_statistics, statistics_bytes
from gqa_jax.config import ATTENTION_KINDS, preset
from gqa_jax.conversion import grouped, svd
from gqa_jax.convert import CALIBRATION_FILE, check_conversion, convert_checkpoint, to_grouped
from gqa_jax.data import stdlib_extract
from gqa_jax.data.pipeline import shift_right
from gqa_jax.model import build

EVERYTHING = ATTENTION_KINDS
TARGETS = np.array([[4, 8, 9, 1, 0], [6, 1, 0, 0, 0], [3, 5, 7, 11, 1]], np.int32)  # id 0 pads
BATCH = {
    "encoder_input_tokens": np.array([[5, 9, 17, 3, 1, 0, 0], [7, 2, 1, 0, 0, 0, 0], [8, 4, 6, 2, 9, 3, 1]]),
    "decoder_input_tokens": shift_right(TARGETS),
    "decoder_target_tokens": TARGETS,
}


@pytest.fixture(scope="module")
def mha4():
    return make_model(preset("tiny"), seed=3)  # N = 4 query heads, MHA


@pytest.fixture(scope="module")
def stats(mha4):
    return calibration.second_moments(mha4, [BATCH], EVERYTHING)[0]


@pytest.fixture(scope="module")
def vocab_model(small_vocab):
    return make_model(preset("tiny", vocab_size=small_vocab.vocab_size), seed=4)


@pytest.fixture
def suite_data(suite_subset, monkeypatch):
    """The suite subset's data dir, its subset selected in this process too."""
    data, env = suite_subset
    monkeypatch.setenv(stdlib_extract.MAX_FILES_ENV, env[stdlib_extract.MAX_FILES_ENV])
    return data


def moment(x, mask):
    x = np.asarray(x, np.float64)[mask]  # [n, D], the non-pad positions
    return x.T @ x / len(x)


def random_moments(config, seed=0):
    """Full-rank second moments of random inputs, one per layer (one for cross)."""
    rng = np.random.default_rng(seed)
    out = {}
    for kind in EVERYTHING:
        L, D, _ = expected_shape(config, kind)
        x = rng.normal(size=(L, 200, D)) * rng.uniform(0.2, 2.0, size=(L, 1, D))
        out[kind] = np.einsum("lnd,lne->lde", x, x) / 200
    return out


# ----------------------------------------------------------------------------- the statistics
def test_statistics_are_the_second_moments_of_each_kv_input(mha4, stats):
    enc, dec = jnp.asarray(BATCH["encoder_input_tokens"]), jnp.asarray(BATCH["decoder_input_tokens"])
    enc_mask, dec_mask = BATCH["encoder_input_tokens"] != 0, TARGETS != 0
    reference = {  # layer 0's K/V input, computed from the modules directly
        "encoder_self": moment(mha4.encoder.layers[0].attn_norm(mha4.shared(enc)), enc_mask),
        "decoder_self": moment(mha4.decoder.layers[0].self_attn_norm(mha4.shared(dec)), dec_mask),
        "cross": moment(mha4.encode(enc), enc_mask),
    }
    for kind, c in stats.items():
        assert c.dtype == np.float64 and c.shape == expected_shape(mha4.config, kind)
        np.testing.assert_allclose(c[0], reference[kind], rtol=1e-5, atol=1e-6 * np.abs(c[0]).max())
        np.testing.assert_allclose(c, c.transpose(0, 2, 1), rtol=0, atol=1e-6 * np.abs(c).max())
        assert np.linalg.eigvalsh(c).min() > -1e-6 * np.abs(c).max()  # PSD
    # layer 1 reads what layer 0 wrote: its own statistics
    assert not np.allclose(stats["encoder_self"][0], stats["encoder_self"][1])
    # a scanned, rematerialized stack runs the same function: the same statistics
    scanned = build(mha4.config.replace(scan_layers=True, remat="full"), mha4)
    again, tokens = calibration.second_moments(scanned, [BATCH], EVERYTHING)
    assert tokens == {"encoder": int(enc_mask.sum()), "decoder": int(dec_mask.sum())}
    for kind in EVERYTHING:
        np.testing.assert_allclose(again[kind], stats[kind], rtol=1e-5, atol=1e-7)


def test_gather_is_deterministic_per_seed(vocab_model, suite_data, small_vocab):
    def gather(seed):
        return calibration.gather(
            vocab_model, task="stdlib_span", data_dir=suite_data, vocab=small_vocab, batches=2,
            batch_size=2, input_length=32, seed=seed,
        )  # fmt: skip

    (a, record), (b, _), (c, _) = gather(0), gather(0), gather(1)
    assert list(a) == ["decoder_self", "cross"]  # the default attentions
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert all(not np.allclose(a[k], c[k]) for k in a)
    assert {k: record[k] for k in ("task", "split", "batches", "batch_size", "input_length", "seed")} == {
        "task": "stdlib_span", "split": "train", "batches": 2, "batch_size": 2, "input_length": 32, "seed": 0,
    }  # fmt: skip
    assert 0 < record["tokens"]["encoder"] <= 2 * 2 * 32 and record["tokens"]["decoder"] > 0
    assert record["vocab"]["path"] == small_vocab.path and record["data_dir"] == str(suite_data)
    json.dumps(record)  # JSON-able


# ---------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("method", conversion.calibrated())
def test_identity_weighting_is_the_uncalibrated_method(mha4, method):
    identity = {k: np.broadcast_to(np.eye(32), expected_shape(mha4.config, k)).copy() for k in EVERYTHING}
    plain, config, _ = to_grouped(mha4, mha4.config, 2, method, attentions=EVERYTHING)
    weighted, _, manifest = to_grouped(
        mha4, mha4.config, 2, method, attentions=EVERYTHING, calibration=identity
    )
    np.testing.assert_allclose(
        logits(build(config, weighted)), logits(build(config, plain)), atol=1e-6, rtol=0
    )
    assert manifest["calibration"]["statistics_sha256"]


@pytest.mark.parametrize("method", conversion.calibrated())
def test_calibrated_k_equals_n_returns_the_source(mha4, method):
    calibration_ = random_moments(mha4.config)
    params, config, _ = to_grouped(
        mha4, mha4.config, 4, method, attentions=EVERYTHING, calibration=calibration_
    )
    np.testing.assert_allclose(logits(build(config, params)), logits(mha4), atol=1e-6, rtol=0)


# ------------------------------------------------------------------ where the weighting matters
def subspace_inputs(rng, D, r, n):
    """``n`` tokens [n, D] in a random ``r``-dimensional subspace, and that subspace's complement."""
    basis = np.linalg.qr(rng.normal(size=(D, D)))[0]
    return rng.normal(size=(n, r)) @ basis[:, :r].T, basis[:, :r], basis[:, r:]


def relative_errors(x, source, merged):
    """Relative errors of every query head's attention logits ``x q (x k)^T`` and value output
    ``x v o`` after merging the layer to one K/V head (MHA source: query head n reads K/V head n)."""
    (q, k, v, o), (q2, k2, v2, o2) = source, merged
    N = q.shape[1]
    want_l = np.stack([(x @ q[:, n]) @ (x @ k[:, n]).T for n in range(N)])
    got_l = np.stack([(x @ q2[:, n]) @ (x @ k2[:, 0]).T for n in range(N)])
    want_o = np.stack([x @ v[:, n] @ o[n] for n in range(N)])
    got_o = np.stack([x @ v2[:, 0] @ o2[n] for n in range(N)])
    rel = [np.linalg.norm(g - w) / np.linalg.norm(w) for g, w in ((got_l, want_l), (got_o, want_o))]
    return np.array(rel)


def test_calibrated_svd_fits_the_activations_where_the_inputs_live():
    rng = np.random.default_rng(0)
    D, N, H = 32, 4, 8
    for r, bound in ((6, 1e-5), (12, 0.75)):  # input rank <= H: a rank-H fit of the activations is exact
        x, _, _ = subspace_inputs(rng, D, r, 2000)
        c = x[:1000].T @ x[:1000] / 1000  # rank r < D: the ridge makes it invertible
        q, k, v = (rng.normal(size=(D, N, H)) / np.sqrt(D) for _ in range(3))
        layer = (q, k, v, rng.normal(size=(N, H, D)) / np.sqrt(N * H))
        held_out = x[1000:1300]
        plain = relative_errors(held_out, layer, svd.fit(*layer, 1))
        weighted = relative_errors(held_out, layer, svd.fit(*layer, 1, c))
        # measured (seed 0): r = 6: 1.4e-7 against 0.59 (logits); r = 12: 0.61 and 0.58 of the unweighted
        assert (plain > 0.3).all() and (weighted < bound * plain).all(), (r, plain, weighted)


def test_calibrated_grouped_pairs_heads_that_differ_only_where_no_input_goes():
    rng = np.random.default_rng(0)
    D, H, r = 32, 8, 6
    x, seen, unseen = subspace_inputs(rng, D, r, 500)
    c = x.T @ x / len(x)

    def reads(space):  # a random [D, H] projection of the inputs' components in `space`
        return space @ rng.normal(size=(space.shape[1], H))

    def heads():  # [D, 4, H]: heads 0 and 2 agree on the inputs; 0 and 1 share a large unseen part
        a, b, big = reads(seen), reads(seen), 2 * np.sqrt(r / (D - r)) * reads(unseen)
        return np.stack([a + big, b + big, a - big, reads(seen) + reads(unseen)], axis=1)

    k, v = heads(), heads()
    assert grouped.similar_groups(grouped.head_features(k, v), 2) == [0, 1, 2, 3]
    assert grouped.similar_groups(grouped.head_features(k, v, c), 2) == [0, 2, 1, 3]


# -------------------------------------------------------------------- manifest and stored file
def test_the_stored_statistics_re_derive_and_a_tampered_file_is_reported(mha4, stats, tmp_path):
    src = checkpoints.save(mha4, tmp_path / "mha")
    record = {"task": "by hand", "batches": 1}
    dst, manifest = convert_checkpoint(
        src, tmp_path / "svd", 2, "svd", attentions=EVERYTHING, calibrate=lambda model: (stats, record)
    )
    entry = manifest["calibration"]
    assert entry["task"] == "by hand" and entry["file"] == CALIBRATION_FILE
    assert json.loads((dst / "manifest.json").read_text())["calibration"] == entry
    stored = read_statistics((dst / CALIBRATION_FILE).read_bytes(), "test")
    assert all(stored[k].tobytes() == stats[k].tobytes() for k in EVERYTHING)
    assert (dst / CALIBRATION_FILE).read_bytes() == statistics_bytes(stats)  # deterministic bytes
    assert check_conversion(dst) == []

    file = dst / CALIBRATION_FILE
    original = file.read_bytes()
    file.write_bytes(statistics_bytes({**stats, "cross": stats["cross"] * 2}))
    assert check_conversion(dst) == [
        f"{file} differs from the one the conversion wrote (sha256 is not the manifest's "
        "calibration.file_sha256): it was changed or replaced"
    ]
    file.unlink()
    problems = check_conversion(dst)
    assert len(problems) == 1 and problems[0].startswith(f"{file} is missing")
    file.write_bytes(original)
    assert check_conversion(dst) == []


# --------------------------------------------------------------------------------------- CLI
def test_cli_calibrated_svd_on_the_suite_corpus(vocab_model, suite_data, small_vocab, tmp_path, capsys):
    src = checkpoints.save(vocab_model, tmp_path / "mha")
    dst = tmp_path / "svd"
    argv = ["--src", src, "--dst", dst, "--num-kv-heads", 1, "--method", "svd", "--calibration-batches", 2,
            "--calibration-batch-size", 2, "--calibration-input-length", 32, "--data-dir", suite_data,
            "--vocab", small_vocab.path, "--seed", 3]  # fmt: skip
    assert convert_cli(*argv) == 0
    out = capsys.readouterr().out
    assert "calibrated on 2 batch(es) of 2 rows of stdlib_span (train, seed 3)" in out
    entry = json.loads((dst / "manifest.json").read_text())["calibration"]
    assert (entry["task"], entry["batches"], entry["batch_size"], entry["seed"]) == ("stdlib_span", 2, 2, 3)
    want, _ = calibration.gather(vocab_model, task="stdlib_span", data_dir=suite_data, vocab=small_vocab,
                                 batches=2, batch_size=2, input_length=32, seed=3)  # fmt: skip
    stored = read_statistics((dst / CALIBRATION_FILE).read_bytes(), "test")
    assert sorted(stored) == ["cross", "decoder_self"]
    assert all(stored[k].tobytes() == want[k].tobytes() for k in want)
    assert convert_cli("--check", dst) == 0
    assert "bit-identical" in capsys.readouterr().out


def test_cli_calibration_errors(mha4, tmp_path, capsys):
    src = checkpoints.save(mha4, tmp_path / "mha")
    empty = tmp_path / "no_data"
    empty.mkdir()
    base = ["--src", src, "--dst", tmp_path / "dst", "--num-kv-heads", 2]
    cases = [
        (["--method", "svd", "--calibration-batches", 2, "--data-dir", empty],
         ["calibration reads the train split of task stdlib_span: stdlib_corpus", f"is not built in {empty}",
          f"python -m gqa_jax data build-suite --data-dir {empty}"]),
        (["--method", "svd", "--calibration-batches", 0],
         ["--calibration-batches: must be a positive integer, got 0"]),
        (["--method", "mean", "--calibration-batches", 2],
         ["calibration is used by method grouped and svd only, not method='mean'"]),
        (["--method", "svd", "--data-dir", empty], ["--data-dir only apply to a calibrated conversion"]),
    ]  # fmt: skip
    for extra, messages in cases:
        assert convert_cli(*base, *extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and all(m in err for m in messages), err
        assert not (tmp_path / "dst").exists()
    assert convert_cli("--check", tmp_path / "dst", "--calibration-batches", 2) == 2
    assert "--check DST takes no other options (got --calibration-batches)" in capsys.readouterr().err


def test_library_calibration_errors(mha4, stats, tmp_path):
    with pytest.raises(ValueError, match=r"calibration batches=0 must be an integer >= 1"):
        calibration.gather(mha4, batches=0)
    for method in ("mean", "first", "random", "aligned"):
        with pytest.raises(ValueError, match=rf"used by method grouped and svd only, not method='{method}'"):
            to_grouped(mha4, mha4.config, 2, method, calibration=stats)
    with pytest.raises(ValueError, match=r"calibration has no statistics for 'encoder_self'"):
        to_grouped(mha4, mha4.config, 2, "svd", attentions=EVERYTHING, calibration={"cross": stats["cross"]})
    with pytest.raises(
        ValueError, match=r"calibration\['cross'\] is float32 \(1, 32, 32\); this model needs"
    ):
        to_grouped(
            mha4, mha4.config, 2, "svd", calibration={**stats, "cross": stats["cross"].astype(np.float32)}
        )
    with pytest.raises(ValueError, match=r"task c4_span: dataset c4/en \(task c4_span\) is not prepared in"):
        calibration.gather(mha4, task="c4_span", data_dir=tmp_path, batches=1)


# ---------------------------------------------------------------------------------- uptraining
def test_uptraining_calibrates_its_conversion(small_vocab, tmp_path):
    source_model = make_model(preset("tiny", vocab_size=small_vocab.vocab_size), seed=5)
    source = checkpoints.save(source_model, tmp_path / "mha")
    fields = {"uptrain.source": str(source), "uptrain.num_kv_heads": 1, "uptrain.method": "svd",
              "uptrain.alpha": 0.0, "uptrain.calibration_batches": 2,
              "uptrain.calibration_batch_size": 2}  # fmt: skip
    config = tiny_config(small_vocab.path, tmp_path, _file="configs/uptrain.py", **fields)
    with tfds.testing.mock_data(num_examples=8):
        model, _, info = training.init_model(config, small_vocab)
        want, record = calibration.gather(source_model, task="c4_span", vocab=small_vocab, batches=2,
                                          batch_size=2, input_length=64, seed=0)  # fmt: skip
    expected, _, _ = to_grouped(source_model, source_model.config, 1, "svd", calibration=want)
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(x, y)
    entry = info["conversion"]["calibration"]
    assert entry["statistics_sha256"] == record["statistics_sha256"] and entry["task"] == "c4_span"
    assert info["calibration_file"] == statistics_bytes(want)
    with tfds.testing.mock_data(num_examples=8):  # alpha 0: the run saves the conversion and its files
        training.train(config, tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "conversion.json").read_text())
    assert manifest["calibration"]["file_sha256"] == entry["file_sha256"]
    assert (tmp_path / "run" / CALIBRATION_FILE).read_bytes() == statistics_bytes(want)

    for field, value, message in [
        ("uptrain.calibration_batches", -1, "config.uptrain.calibration_batches must be an integer >= 0"),
        ("uptrain.calibration_batch_size", 0, "uptrain.calibration_batch_size must be an integer >= 1"),
        ("uptrain.calibration_task", "c5", "config.uptrain.calibration_task must be one of"),
        ("uptrain.method", "mean", "calibration_batches=2 calibrates method grouped or svd only, not "
         "uptrain.method='mean'"),
    ]:  # fmt: skip
        bad = tiny_config(small_vocab.path, tmp_path, _file="configs/uptrain.py", **{**fields, field: value})
        with pytest.raises(ValueError, match=message):
            training.check_config(bad)
