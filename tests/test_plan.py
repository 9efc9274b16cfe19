"""The memory plan: ahead-of-time compiles on abstract shapes, per-device bytes consistent with the
shardings and the cache formula, the batch search, and the CLI (tiny preset; the 8-device mesh in
the process of the ``eight_devices`` fixture, so this process keeps its single CPU device)."""

import json

import pytest

from gqa_jax import cache
from gqa_jax.__main__ import main
from gqa_jax.config import preset
from gqa_jax.tools import batch_search, plan
from gqa_jax.tools.info import param_counts


def _settings(**kw):
    base = dict(preset="tiny", num_kv_heads=2, mesh="1x1", batch=4, input_len=16, output_len=8, hbm_gib=1.0)
    return plan.PlanSettings(**(base | kw))


def test_cli_one_device_train_and_decode_are_consistent_with_the_formulas(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = "plan --preset tiny --num-kv-heads 2 --mesh 1x1 --batch 16 --input-len 16 --output-len 8"
    assert main([*argv.split(), "--batch-search", "decode", "--hbm-gib", "0.000477", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| train step | 16 |" in text and "| decode (greedy) | 16 |" in text
    res = json.loads(out.read_text())
    assert all(c["ok"] for c in res["checks"]), res["checks"]
    train, decode = res["programs"]["train"], res["programs"]["decode"]
    cfg = preset("tiny", num_kv_heads=2)
    # one device holds everything: float32 train params, bfloat16 decode params, the whole cache
    n_params = param_counts(cfg)["total"]
    assert train["params_bytes"] == 4 * n_params and decode["params_bytes"] == 2 * n_params
    formula = cache.expected_cache_bytes(cfg, 16, 16, 8, "bfloat16")
    assert decode["cache_formula"] == formula == decode["cache_compiled"]
    assert train["optimizer_bytes"] > 0 and decode["optimizer_bytes"] == 0
    for r in (train, decode):
        m = r["memory"]
        assert (
            m["total"]
            == m["argument"] + m["output"] - m["alias"] + m["temp"] + m["generated_code"] + m["host"]
        )
        assert r["fits"] == (m["total"] <= res["hbm_bytes"])
    assert train["memory"]["alias"] > 0  # the donated state is reused for the new one
    # the decode batch search: the largest batch is verified by compiles either side of the limit
    # (the limit, 512,174 bytes, lies where the line through batch 1 and 16 predicts 18 and the
    # loops at 18 and 19 bracket it: verified by the first prediction's compiles, 4 in all)
    assert "largest_batch" not in train
    search = decode["largest_batch"]
    best, totals = search["largest_batch"], {int(k): v for k, v in search["compiled_totals"].items()}
    assert best > 16 and totals[best] <= res["hbm_bytes"] < totals[best + 1]
    assert "verified by compiling batch" in search["how"] and "Largest batch that fits" in text


def test_batch_search_on_an_affine_memory_finds_and_verifies_the_boundary():
    limit = 1000

    def affine(b):  # 100 fixed + 7 per row, + a small bump that makes the first fit slightly off
        return 100 + 7 * b + (3 if b > 100 else 0)

    calls = []

    def measure(b):
        calls.append(b)
        return affine(b)

    res = batch_search.search_batch(measure, 16, 2, limit, log=lambda m: None)
    best = res["largest_batch"]
    assert best % 2 == 0 and affine(best) <= limit < affine(best + 2)
    assert {16, 2, best, best + 2} <= set(calls) and len(calls) == len(set(calls)) <= 6
    assert "verified by compiling batch" in res["how"]
    # nothing fits: the smallest-batch compile of the fit is the verification
    res = batch_search.search_batch(lambda b: 5000 + b, 8, 4, limit, log=lambda m: None)
    assert res["largest_batch"] == 0 and "smallest batch 4 does not fit" in res["how"]
    # the requested batch is the smallest: the second point is twice it
    calls.clear()
    res = batch_search.search_batch(measure, 2, 2, limit, log=lambda m: None)
    assert calls[:2] == [2, 4] and affine(res["largest_batch"]) <= limit < affine(res["largest_batch"] + 2)


def test_bad_input_is_one_line_and_exit_2(capsys):
    base = "plan --preset tiny --batch 4 --input-len 16 --output-len 8 --no-batch-search".split()
    for extra, message in (
        (["--mesh", "2x4"], "needs 8 devices"),
        (["--mesh", "1x1", "--num-kv-heads", "3"], "not divisible by num_kv_heads=3"),
        (["--mesh", "1x1", "--programs", "eval"], "unknown program"),
        (["--mesh", "1x1", "--num-microbatches", "3"], "not divisible by data axis 1 x num_microbatches 3"),
    ):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert main(["plan", "--preset", "huge", "--batch", "4"]) == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_eight_devices_cache_and_arguments_per_device(eight_devices):
    """On 8 simulated devices (tests/sharded_plan.py): the cache is divided by data x model when model
    divides K, by data only when it does not (K/V heads replicated); every device's compiled
    argument bytes are its shards' (checked in the plan), less than the whole model's (so
    memory_analysis counts one device); a batch the data axis does not divide is a clear error."""
    (out,) = eight_devices("plan")
    assert out["bad_batch"] == 2 and "not divisible by the data axis size 2" in out["bad_batch_stderr"]
    sharded, replicated = out["2x4:4"], out["2x4:2"]
    for r in (sharded, replicated):
        assert all(c["ok"] for c in r["checks"]), r["checks"]
    for kind in ("self", "cross"):
        for k, r, shards in ((4, sharded, 8), (2, replicated, 8)):  # K = 2 on model 4: rows over the rest
            total = cache.expected_cache_bytes(preset("tiny", num_kv_heads=k), 4, 16, 8, "bfloat16")[kind]
            assert r["decode"]["cache_layout"][kind]["shards"] == shards
            assert (
                r["decode"]["cache_compiled"][kind] == r["decode"]["cache_formula"][kind] == total // shards
            )
        assert "'model'" in sharded["decode"]["cache_compiled_specs"][kind]
        assert "'autoregressive'" not in sharded["decode"]["cache_compiled_specs"][kind]
        assert "'autoregressive'" in replicated["decode"]["cache_compiled_specs"][kind]
    assert "replicated over model (4): 4 copies" in replicated["report"]
    assert "KV cache: no replication (the decode layout" in sharded["report"]
    # per device: the compiled argument size is below the whole model's bfloat16 bytes
    whole = 2 * param_counts(preset("tiny", num_kv_heads=4))["total"]
    assert sharded["decode"]["params_bytes"] < whole
    assert sharded["decode"]["memory"]["argument"] < whole


@pytest.mark.parametrize("bad", [dict(batch=0), dict(hbm_gib=0), dict(programs=())])
def test_settings_are_checked(bad):
    with pytest.raises(ValueError):
        plan.check_settings(_settings(**bad))
