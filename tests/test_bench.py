"""The decoding benchmark, end to end on the tiny preset (structure and bookkeeping, never timings)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gqa_jax import model as model_lib
from gqa_jax.__main__ import main
from gqa_jax.config import preset
from gqa_jax.tools import bench_decode, bench_hf, bench_models, decode_floor, info, measurement


def test_default_kv_heads_round_down_to_divisors():
    assert bench_models.default_kv_heads(6) == [6, 3, 1]  # t5-small: N/4 = 1.5 -> 1
    assert bench_models.default_kv_heads(4) == [4, 2, 1]
    assert bench_models.default_kv_heads(12) == [12, 6, 3, 1]
    assert bench_models.default_kv_heads(64) == [64, 32, 16, 1]
    assert bench_models.parse_kv_heads("2", 6) == [6, 2]  # MHA, the reference, is always there
    with pytest.raises(ValueError, match="divide"):
        bench_models.parse_kv_heads("4", 6)


def test_step_reads_follow_the_parameter_counts():
    """Weights a decode step reads = the decoder without cross K/V + output layer + B embedding rows."""
    config = preset("tiny", num_kv_heads=2)
    model = model_lib.build(config)
    counts = info.param_counts(config)
    L, D, H, K = config.num_decoder_layers, config.d_model, config.head_dim, config.num_kv_heads
    decoder = sum(counts[c] for c in counts if c.startswith("decoder_")) - 2 * L * D * K * H
    expected = 4 * (decoder + counts["lm_head"] + 3 * D)  # float32, batch 3
    assert decode_floor.step_reads(model, config, batch=3)["weight_bytes"] == expected


def test_markdown_table_and_json():
    lines = measurement.md_table([("a", str), ("b", lambda x: f"{x / 2:.1f}")], [1, 4])
    assert lines == ["| a | b |", "|---|---|", "| 1 | 0.5 |", "| 4 | 2.0 |"]
    res = {1: np.float32(0.5), "x": (np.arange(2), math.inf)}
    assert measurement.to_json(res) == {"1": 0.5, "x": [[0, 1], None]}


def test_the_fused_step_below_the_timing_noise_is_nan_not_negative():
    assert bench_decode.fused_step_s(0.010, 0.002, 4) == pytest.approx(0.002)
    assert math.isnan(bench_decode.fused_step_s(0.002, 0.003, 4))  # a loaded machine: prefill > fused
    assert math.isnan(bench_decode.fused_step_s(0.002, 0.002, 4))


def test_bad_kv_heads_is_a_usage_error(capsys):
    assert main(["bench", "decode", "--preset", "tiny", "--kv-heads", "3"]) == 2
    assert "divide" in capsys.readouterr().err


def _finite_positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_bench_decode_end_to_end(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    argv = ["bench", "decode", "--preset", "tiny", "--batch", "2", "--input-len", "16", "--new-tokens", "4"]
    argv += ["--runs", "2", "--lengths", "4,8", "--kv-heads", "1", "--json", str(out_json)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for header in (
        "## a. With vs without KV cache",
        "| new tokens | cached (s) |",
        "## b. MHA / GQA / MQA",
        "| model | K | cache bytes (measured) | cache bytes (formula) | cache / MHA |",
        "## c. The floor",
        "| model | weights (MB) |",
        "| model | prefill GFLOP |",
        "## d. HuggingFace `generate`",
        "Total wall time:",
    ):
        assert header in out, header
    res = json.loads(out_json.read_text())
    assert {"machine", "settings", "table_a", "table_b", "floor", "hf", "total_wall_s"} <= set(res)
    assert res["settings"]["kv_heads"] == [4, 1]
    assert sorted(res["table_a"], key=int) == ["4", "8"]

    for k, row in res["table_b"].items():
        assert row["cache_bytes_measured"] == row["cache_bytes_formula"], k
        for key in ("cache_ratio_to_mha", "tokens_per_s", "time_per_sample_s", "ttft_s", "tpot_s"):
            assert _finite_positive(row[key]), (k, key, row[key])
        assert len(row["stepped"]["step_latencies_s"]) == 3  # T - 1 steps after the first
    assert res["table_b"]["1"]["cache_ratio_to_mha"] == 0.25  # MQA: K / N = 1 / 4
    for k, row in res["floor"]["rows"].items():
        for key in ("step_p50_over_floor", "prefill_over_floor", "e2e_over_floor"):
            assert _finite_positive(row[key]), (k, key, row[key])
        # two loops' difference: NaN where the fused loop was not longer (a loaded machine), which
        # the table prints "below noise" and the JSON holds as null
        fused = row["step_fused_over_floor"]
        assert _finite_positive(fused) or (fused is None and "below noise" in out), (k, fused)
    assert _finite_positive(res["floor"]["bandwidth"]["reference"]["gb_s"])
    assert _finite_positive(res["floor"]["matmul"]["gflop_s"])
    for length, row in res["table_a"].items():
        assert _finite_positive(row["speedup"]), length

    if bench_hf.hf_unavailable() is None:
        hf = res["hf"]
        assert "| ours | HF | ours (s) | HF (s) | HF / ours |" in out
        assert res["hf_parity_max_abs_diff"] < 1e-3
        assert all(_finite_positive(r) for r in hf["ratio_hf_over_ours"].values())
        assert np.isclose(hf["tokens_per_s"] * hf["median_s"], 2 * 4)
    else:
        assert "skipped: transformers/torch not installed" in out
