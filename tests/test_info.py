"""Parameter counts, KV-cache bytes and the ``info`` command (CPU; nothing is allocated)."""

from __future__ import annotations

import re

import pytest

from gqa_jax.__main__ import main
from gqa_jax.cache import cache_bytes_per_token, expected_cache_bytes
from gqa_jax.config import T5_1_1_PRESETS, preset
from gqa_jax.tools.info import COMPONENTS, PUBLIC_T5_1_1_PARAMS, kv_heads_by_attention, param_counts

# The paper's T5.1.1 shapes (docs/paper.md), as (d_model, d_ff, layers, heads).
SHAPES = {
    "small": (512, 1024, 8, 6),
    "base": (768, 2048, 12, 12),
    "large": (1024, 2816, 24, 16),
    "xl": (2048, 5120, 24, 32),
    "xxl": (4096, 10240, 24, 64),
}


# ------------------------------------------------------------------------- parameter counts
@pytest.mark.parametrize("name", T5_1_1_PRESETS)
def test_param_counts_equal_public_checkpoints(name):
    counts = param_counts(preset(name))
    assert counts["total"] == PUBLIC_T5_1_1_PARAMS[name]
    assert counts["total"] == sum(counts[k] for k in COMPONENTS)


@pytest.mark.parametrize("name", T5_1_1_PRESETS)
def test_param_counts_equal_huggingface_meta_model(name):
    torch = pytest.importorskip("torch", reason="parity with HF T5 needs torch (CPU)")
    transformers = pytest.importorskip("transformers", reason="parity with HF T5 needs transformers")
    D, F, L, N = SHAPES[name]
    cfg = transformers.T5Config(
        vocab_size=32128,
        d_model=D,
        d_ff=F,
        d_kv=64,
        num_layers=L,
        num_decoder_layers=L,
        num_heads=N,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        m = transformers.T5ForConditionalGeneration(cfg)
        if m.lm_head.weight is m.shared.weight:
            # transformers 5.x always ties T5's lm_head; T5.1.1 checkpoints have their own.
            m.lm_head.weight = torch.nn.Parameter(torch.empty(32128, D))
    assert m.lm_head.weight is not m.shared.weight
    hf_total = sum(p.numel() for p in m.parameters())
    assert param_counts(preset(name))["total"] == hf_total == PUBLIC_T5_1_1_PARAMS[name]


def test_param_components_xxl():
    D, F, L, N, H, V = 4096, 10240, 24, 64, 64, 32128
    c = param_counts(preset("xxl"))
    assert c["embedding"] == c["lm_head"] == V * D
    assert c["encoder_attention"] == L * 4 * D * N * H
    assert c["decoder_self_attention"] == c["decoder_cross_attention"] == L * 4 * D * N * H
    assert c["encoder_mlp"] == c["decoder_mlp"] == L * 3 * D * F
    assert c["encoder_norms"] == (2 * L + 1) * D and c["decoder_norms"] == (3 * L + 1) * D
    assert c["encoder_relpos"] == c["decoder_relpos"] == 32 * N


def test_tied_embeddings_have_no_lm_head():
    c = param_counts(preset("tiny", tie_word_embeddings=True))
    assert c["lm_head"] == 0
    assert param_counts(preset("tiny"))["total"] - c["total"] == 128 * 32


def test_gqa_reduces_exactly_the_kv_projections():
    D, L, N, H, K = 4096, 24, 64, 64, 8
    mha, gqa = param_counts(preset("xxl")), param_counts(preset("xxl", num_kv_heads=K))
    # decoder self + cross, key and value: 2 * 2 * L * D * (N - K) * H
    assert mha["total"] - gqa["total"] == 2 * 2 * L * D * (N - K) * H
    for part in ("decoder_self_attention", "decoder_cross_attention"):
        assert mha[part] - gqa[part] == 2 * L * D * (N - K) * H
    unchanged = [k for k in COMPONENTS if k not in ("decoder_self_attention", "decoder_cross_attention")]
    assert {k: gqa[k] for k in unchanged} == {k: mha[k] for k in unchanged}


def test_grouping_the_encoder_reduces_encoder_attention():
    D, L, N, H, K = 512, 8, 6, 64, 2
    mha = param_counts(preset("small"))
    enc_only = param_counts(preset("small", num_kv_heads=K, grouped_attentions=("encoder_self",)))
    assert mha["encoder_attention"] - enc_only["encoder_attention"] == 2 * L * D * (N - K) * H
    assert mha["total"] - enc_only["total"] == 2 * L * D * (N - K) * H


def test_kv_heads_by_attention():
    assert kv_heads_by_attention(preset("xxl", num_kv_heads=8)) == {
        "encoder_self": 64,
        "decoder_self": 8,
        "cross": 8,
    }
    assert kv_heads_by_attention(preset("xxl", num_kv_heads=1, grouped_attentions=("cross",))) == {
        "encoder_self": 64,
        "decoder_self": 64,
        "cross": 1,
    }


# ---------------------------------------------------------------------------- cache bytes
def test_cache_bytes_hand_computed_xxl_gqa8():
    c = expected_cache_bytes(preset("xxl", num_kv_heads=8), 1, 2048, 512, "bfloat16")
    # self  = 2 * 24 * 1 * 512 * 8 * 64 * 2 = 48 * 512 * 1024 = 25,165,824 bytes (24 MiB)
    # cross = 2 * 24 * 1 * 2048 * 8 * 64 * 2 = 48 * 2048 * 1024 = 100,663,296 bytes (96 MiB)
    assert c == {"self": 25_165_824, "cross": 100_663_296, "total": 125_829_120}
    # per token: 2 * 24 * 8 * 64 * 2 = 49,152 bytes for both (same K for self and cross)
    assert cache_bytes_per_token(preset("xxl", num_kv_heads=8), "bfloat16") == {
        "self": 49_152,
        "cross": 49_152,
    }


def test_cache_bytes_scale_with_lengths_batch_and_heads():
    cfg = preset("large", num_kv_heads=4)
    base = expected_cache_bytes(cfg, 2, 300, 70, "float32")
    longer_out = expected_cache_bytes(cfg, 2, 300, 140, "float32")
    longer_in = expected_cache_bytes(cfg, 2, 600, 70, "float32")
    assert longer_out["self"] == 2 * base["self"] and longer_out["cross"] == base["cross"]
    assert longer_in["cross"] == 2 * base["cross"] and longer_in["self"] == base["self"]
    assert expected_cache_bytes(cfg, 4, 300, 70, "float32")["total"] == 2 * base["total"]
    half = expected_cache_bytes(preset("large", num_kv_heads=2), 2, 300, 70, "float32")
    assert half["self"] * 2 == base["self"] and half["cross"] * 2 == base["cross"]
    assert expected_cache_bytes(cfg, 2, 300, 70, "bfloat16")["total"] * 2 == base["total"]


@pytest.mark.parametrize("K", [1, 2, 4, 8, 16])
def test_gqa_cache_is_k_over_n_of_mha(K):
    N = 16
    mha = expected_cache_bytes(preset("large"), 3, 512, 256, "bfloat16")
    gqa = expected_cache_bytes(preset("large", num_kv_heads=K), 3, 512, 256, "bfloat16")
    for part in ("self", "cross", "total"):
        assert gqa[part] * N == mha[part] * K


def test_encoder_grouping_does_not_change_the_cache():
    mha = expected_cache_bytes(preset("small"), 1, 64, 32, "float32")
    enc = expected_cache_bytes(
        preset("small", num_kv_heads=1, grouped_attentions=("encoder_self",)), 1, 64, 32, "float32"
    )
    assert enc == mha


@pytest.mark.parametrize("field", ["batch", "input_len", "output_len"])
@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_cache_bytes_rejects_bad_sizes(field, bad):
    args = dict(batch=1, input_len=8, output_len=8)
    args[field] = bad
    with pytest.raises(ValueError, match=field):
        expected_cache_bytes(preset("tiny"), dtype="float32", **args)


@pytest.mark.parametrize("dtype", ["bf17", "not-a-dtype", "bool"])
def test_cache_bytes_rejects_bad_dtype(dtype):
    with pytest.raises(ValueError, match="dtype"):
        expected_cache_bytes(preset("tiny"), 1, 8, 8, dtype)


# ------------------------------------------------------------------------------------ CLI
def _run(capsys, *argv):
    code = main(["info", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _cache_row(out: str, part: str) -> int:
    """Bytes on the ``self``/``cross``/``total`` row of the full-cache table."""
    table = out[out.index("KV cache (batch") :]
    m = re.search(rf"^  {part}\s+([\d,]+)\s", table, re.MULTILINE)
    assert m, out
    return int(m.group(1).replace(",", ""))


def test_cli_info_xxl_gqa8(capsys):
    code, out, err = _run(capsys, "--preset", "xxl", "--num-kv-heads", "8")
    assert code == 0, err
    assert "9,726,046,208" in out and "9.73B" in out  # GQA-8-XXL total
    assert "11,135,332,352" in out and "11.14B" in out  # MHA / public XXL
    assert _cache_row(out, "self") == 25_165_824 and "24.00 MiB" in out
    assert _cache_row(out, "cross") == 100_663_296 and "96.00 MiB" in out
    assert _cache_row(out, "total") == 125_829_120
    assert "0.1250" in out  # GQA-8 / MHA
    assert re.search(r"decoder_self\s+8\s", out) and re.search(r"encoder_self\s+64\s", out)


def test_cli_doubling_output_len_doubles_self_cache(capsys):
    args = ("--preset", "xxl", "--num-kv-heads", "8", "--batch", "2", "--input-len", "100")
    _, out1, _ = _run(capsys, *args, "--output-len", "300")
    _, out2, _ = _run(capsys, *args, "--output-len", "600")
    assert _cache_row(out2, "self") == 2 * _cache_row(out1, "self")
    assert _cache_row(out2, "cross") == _cache_row(out1, "cross")


@pytest.mark.parametrize("k", [1, 2, 4, 8, 64])
def test_cli_mesh_shows_each_device_holding_its_share_of_the_cache(capsys, k):
    """``--mesh 1x8`` on XXL at the paper's lengths, batch 256: whatever K, every device holds the
    cache's total / 8 (K/V heads over model as far as K allows, rows over the rest), none replicated."""
    code, out, err = _run(
        capsys, "--preset", "xxl", "--num-kv-heads", str(k), "--batch", "256", "--mesh", "1x8"
    )
    assert code == 0, err
    table = out[out.index("KV cache on mesh 1x8") :]
    for part in ("self", "cross"):
        row = re.search(rf"^  {part}\s+P\((.*)\)\s+(\d+)\s+([\d,]+)\s+([\d,]+)$", table, re.MULTILINE)
        assert row, table
        assert row.group(2) == "8" and row.group(3) == row.group(4), table
        assert int(row.group(3).replace(",", "")) * 8 == _cache_row(out, part)
        assert ("'autoregressive'" in row.group(1)) == (k < 8), table
    assert "no cache is replicated" in table


def test_cli_preset_all(capsys):
    code, out, err = _run(capsys, "--preset", "all")
    assert code == 0, err
    for name, count in PUBLIC_T5_1_1_PARAMS.items():
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert row.count(f"{count:,}") == 2  # ours and the public count, side by side
        assert " yes " in row


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--preset", "xxxl"], "unknown preset 'xxxl'"),
        (["--preset", "xxl", "--num-kv-heads", "7"], "num_kv_heads=7"),
        (["--preset", "xxl", "--num-kv-heads", "0"], "num_kv_heads=0"),
        (["--preset", "xxl", "--output-len", "0"], "--output-len"),
        (["--preset", "xxl", "--input-len", "-5"], "--input-len"),
        (["--preset", "xxl", "--batch", "two"], "--batch"),
        (["--preset", "xxl", "--dtype", "bf17"], "--dtype: invalid choice: 'bf17'"),
        (["--preset", "xxl", "--attentions", "decoder"], "decoder"),
        (["--preset", "xxl", "--mesh", "3x"], "mesh '3x' must look like DATAxMODEL"),
        ([], "--preset"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
