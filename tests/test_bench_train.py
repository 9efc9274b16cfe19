"""bench train: the FLOP count, and a tiny end-to-end run of the benchmark."""

from gqa_jax.__main__ import main
from gqa_jax.config import preset
from gqa_jax.tools import bench_train, measurement


def test_forward_flops_by_hand():
    cfg = preset("tiny")  # D32 F64 N4 H8 V128, 2 + 2 layers, gated MLP
    B, S, T, D, F, N, H, V = 1, 10, 4, 32, 64, 4, 8, 128
    attn = lambda q, kv, K, src: 2 * q * D * N * H * 2 + 2 * src * D * K * H * 2 + 4 * q * kv * N * H  # noqa: E731
    enc = 2 * (attn(S, S, N, S) + 2 * S * D * F * 3)
    dec = 2 * (attn(T, T, N, T) + attn(T, S, N, S) + 2 * T * D * F * 3)
    assert bench_train.forward_flops(cfg, B, S, T) == enc + dec + 2 * T * D * V
    assert bench_train.train_flops(cfg, 3, S, T) == 9 * (enc + dec + 2 * T * D * V)
    mqa = preset("tiny", num_kv_heads=1)
    saved = 2 * 2 * 2 * D * (N - 1) * H * (T + S)  # k, v projections of decoder self + cross, 2 layers
    assert bench_train.forward_flops(cfg, B, S, T) - bench_train.forward_flops(mqa, B, S, T) == saved


def test_bench_train_runs_and_reports(capsys):
    # the peak over small matmuls: the default sizes take seconds, and no check reads the rate
    code = main(["bench", "train", "--presets", "tiny", "--batch", "2", "--input-len", "16", "--target-len",
                 "8", "--steps", "1", "--peak-sizes", "64,128"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "matmul peak" in out and "| tiny |" in out and "%" in out
    assert "(128x128x128, float32)" in out or "(64x64x64, float32)" in out  # the peak: a size asked for
    assert main(["bench", "train", "--peak-sizes", "64,x"]) == 2
    assert "--peak-sizes='64,x' must be comma-separated integers" in capsys.readouterr().err


def test_bench_train_bad_preset(capsys):
    assert main(["bench", "train", "--presets", "huge"]) == 2
    assert "unknown" in capsys.readouterr().err


def test_matmul_peak_is_positive():
    assert bench_train.matmul_peak("float32", sizes=(64,), runs=1)["gflop_s"] > 0
    rate = measurement.matmul_rate("float32", (32, 64), runs=1)  # the one probe: the best size of those tried
    assert rate["gflop_s"] == max(p["gflop_s"] for p in rate["probes"]) > 0 and rate["dtype"] == "float32"
