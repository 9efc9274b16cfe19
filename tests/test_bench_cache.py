"""``bench cache``: a quantized KV cache's greedy decodes against the float cache's on a checkpoint
and a scored task (structure and bookkeeping on a tiny random model; the numbers are measured in
docs/results/decoding.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gqa_jax import checkpoints
from gqa_jax import model as model_lib
from gqa_jax.__main__ import main
from gqa_jax.cache import expected_cache_bytes
from gqa_jax.config import preset
from gqa_jax.data import stdlib_extract
from gqa_jax.tools.bench_cache import agreement


def test_agreement_counts_positions_up_to_the_longer_row():
    a = np.array([5, 6, 7, 1, 0, 0])
    assert agreement(a, a) == (4, 4, None)
    assert agreement(a, np.array([5, 9, 7, 1, 0, 0])) == (4, 3, 1)
    assert agreement(a, np.array([5, 6, 7, 8, 9, 1])) == (6, 3, 3)  # the other ran on past EOS
    assert agreement(np.zeros(4, int), np.zeros(4, int)) == (0, 0, None)


@pytest.fixture(scope="module")
def tiny_checkpoint(small_vocab, tmp_path_factory):
    vocab_size = small_vocab.vocab_size
    model = model_lib.build(preset("tiny", vocab_size=vocab_size, num_kv_heads=2), seed=0)
    return checkpoints.save(model, tmp_path_factory.mktemp("bench_cache") / "model")


@pytest.fixture
def suite_data(suite_subset, monkeypatch):
    """The suite subset's data dir, its subset selected in this process too."""
    data, env = suite_subset
    monkeypatch.setenv(stdlib_extract.MAX_FILES_ENV, env[stdlib_extract.MAX_FILES_ENV])
    return data


def _argv(ckpt, data, vocab, *extra):
    return ["bench", "cache", "--model", str(ckpt), "--task", "stdlib_docsum", "--split", "train",
            "--examples", "6", "--batch-size", "4", "--data-dir", str(data), "--vocab", vocab.path,
            "--input-length", "64", "--target-length", "8", *extra]  # fmt: skip


def test_bench_cache_compares_int8_and_fp8_with_the_float_cache(
    tiny_checkpoint, suite_data, small_vocab, tmp_path, capsys
):
    data = suite_data
    out_json = tmp_path / "cache.json"
    argv = _argv(tiny_checkpoint, data, small_vocab, "--cache-dtypes", "int8,float8_e4m3fn")
    assert main([*argv, "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "| KV cache | bytes / example | positions agreeing | rows identical |" in out
    assert "| float32 (reference) |" in out and "| int8 |" in out
    res = json.loads(out_json.read_text())
    assert res["settings"]["examples"] == 6 and res["settings"]["num_kv_heads"] == 2
    rows = res["rows"]
    assert list(rows) == ["float32", "int8", "float8_e4m3fn"]
    config = preset("tiny", vocab_size=small_vocab.vocab_size, num_kv_heads=2)
    for name, row in rows.items():
        assert row["cache_bytes_per_example"] == expected_cache_bytes(config, 1, 64, 8, name)["total"]
    # H = 8: 8 + 4 bytes per token and head vs 32
    assert rows["int8"]["cache_bytes_per_example"] < rows["float32"]["cache_bytes_per_example"] / 2
    for name in ("int8", "float8_e4m3fn"):
        r = rows[name]
        assert 0.0 <= r["positions_agreeing"] <= 1.0 and r["positions"] > 0
        assert 0 <= r["predictions_changed"] <= 6
        if r["predictions_changed"] == 0:  # the same text scores the same
            assert r["paired_difference"] == 0.0 and r["primary"] == rows["float32"]["primary"]
        if r["rows_identical"] == 1.0:
            assert r["positions_agreeing"] == 1.0 and r["first_difference_median"] is None


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--cache-dtypes", "int4"], "cache_dtype='int4' is not a KV-cache dtype"),
        (["--task", "stdlib_span"], "span corruption"),
    ],
)
def test_bench_cache_bad_input_is_one_line(tiny_checkpoint, suite_data, small_vocab, capsys, extra, needle):
    assert main([*_argv(tiny_checkpoint, suite_data, small_vocab), *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
