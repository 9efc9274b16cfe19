"""The paper's decode (``config.PAPER_SWITCHES``: T5X's cross K/V projected at every step, its one-hot
cache write, its ``[B, K, H, T]`` layout), an instrument for the paper's timings: every combination
of the switches gives our decode's tokens (greedy, sampling with a fixed key, beam search; float and
int8 caches), the cache holds what each switch says, bad names are one line; and the TPU compiler
(libtpu on this host, the tiny preset) hoists the per-step cross K/V projection out of the decode
loop, while the one-hot write stays in it."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from flax import nnx

from gqa_jax import decoding
from gqa_jax.beam_search import beam_search
from gqa_jax.cli import options
from gqa_jax.cli import plan as plan_cli
from gqa_jax.config import PAPER_SWITCHES, decode_name, decode_switches, preset
from gqa_jax.model import T5
from gqa_jax.tools import loop_hlo, plan

V, MAX = 16, 10
ENC = np.array(
    [
        [5, 6, 7, 8, 9, 10, 11, 12],
        [11, 12, 13, 3, 0, 0, 0, 0],
        [14, 15, 0, 0, 0, 0, 0, 0],
        [2, 4, 6, 8, 10, 12, 0, 0],
    ]
)
# every combination of the switches but none (ours): 7 decodes
DECODES = ["+".join(c) for r in range(1, 4) for c in itertools.combinations(PAPER_SWITCHES, r)]


@pytest.fixture(scope="module")
def model() -> T5:
    """GQA-2 with one layer each side (compiles fast); EOS made likely, so rows end at different steps."""
    config = preset("tiny", vocab_size=V, num_kv_heads=2, num_encoder_layers=1, num_decoder_layers=1)
    model = T5(config, rngs=nnx.Rngs(0))
    model.lm_head[...] = model.lm_head[...].at[:, 1].multiply(2.0)
    return model


def _decodes(model: T5, cache_dtype: str | None, decode: str):
    key = jax.random.key(3)
    greedy = decoding.greedy_decode(
        model, ENC, MAX, cache_dtype=cache_dtype, decode=decode, return_logits=True, return_cache=True
    )
    sampled = decoding.sample_decode(model, ENC, MAX, key=key, cache_dtype=cache_dtype, decode=decode)
    beams = beam_search(model, ENC, MAX, beam_size=3, cache_dtype=cache_dtype, decode=decode)
    return greedy, sampled, beams


@pytest.mark.parametrize("cache_dtype", [None, "int8"], ids=["float", "int8"])
def test_every_combination_of_the_switches_decodes_our_tokens(model, cache_dtype):
    ours = _decodes(model, cache_dtype, "ours")
    assert len(set(np.asarray(ours[0].lengths).tolist())) > 1  # rows end at different steps
    for decode in DECODES:
        on = decode_switches(decode)
        greedy, sampled, beams = _decodes(model, cache_dtype, decode)
        for what, a, b in zip(
            ("greedy", "sampling", "beam search"), ours, (greedy, sampled, beams), strict=True
        ):
            np.testing.assert_array_equal(
                np.asarray(a.tokens), np.asarray(b.tokens), err_msg=f"{decode}: {what}"
            )
            np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))
        np.testing.assert_allclose(np.asarray(greedy.logits), np.asarray(ours[0].logits), atol=1e-5, rtol=0)
        cache = greedy.cache
        # cross_recompute: no cross K/V, the encoder output carried instead
        assert (cache.cross_k == ()) == (cache.encoded is not None) == on["cross_recompute"], decode
        # t5x_layout: [B, K, H, T], the length last
        entry = jax.tree.leaves(cache.self_k[0])[0]
        assert entry.shape == ((4, 2, 8, MAX) if on["t5x_layout"] else (4, 2, MAX, 8)), decode
        assert cache.form.one_hot == on["one_hot_write"] and cache.max_decode_len == MAX


def test_decode_names_and_bad_ones():
    assert decode_switches("ours") == dict.fromkeys(PAPER_SWITCHES, False)
    assert decode_switches("paper") == dict.fromkeys(PAPER_SWITCHES, True)
    assert decode_name(decode_switches("t5x-layout+cross_recompute")) == "cross_recompute+t5x_layout"
    assert decode_name(decoding.decode_config(4, decode="paper")) == "paper"
    assert decode_name(decoding.decode_config(4)) == "ours"  # the default: none of the switches
    with pytest.raises(
        ValueError, match=r"decode 'fast': choose ours, paper, or switches .* cross_recompute"
    ):
        decode_switches("fast")
    p = options.Parser(prog="plan")
    plan_cli.add_args(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--preset", "tiny", "--batch", "8", "--decode", "cross+nothing"])


def test_the_tpu_compiler_hoists_the_cross_projection_out_of_the_loop_and_keeps_the_one_hot_write():
    """The paper's decode loop compiled for v4:2x2x1 (``plan --decode paper``: the whole greedy loop,
    prefill included): every product of the per-step cross K/V projection sits outside the ``while``
    (the loop carries their results, as a cross cache), while the one-hot write's multiply-add over
    the whole cache runs in the loop's body at every step. (At XXL on v4:2x2x2 too:
    docs/results/paper-decode.md.)"""
    settings = plan.PlanSettings(
        preset="tiny", num_kv_heads=2, mesh="1x4", batch=8, input_len=24, output_len=8,
        programs=("decode",), batch_search=(), topology="v4:2x2x1", decode="paper",
    )  # fmt: skip
    row = plan.plan(settings)["programs"]["decode"]  # what plan and time --predict record of the loop
    found = row["cross_kv_projection"]  # loop_hlo.where over the compiled loop's optimized HLO
    L = preset("tiny").num_decoder_layers
    assert found["placement"] == loop_hlo.HOISTED and len(found["products"]) == 2 * L  # K and V per layer
    assert not any(p["in_loop"] for p in found["products"])
    assert [sum(c.values()) for c in found["carried"]] == [2 * L]  # their results enter the loop's carry
    writes = row["one_hot_write"]["products"]  # the fusions of the one-hot write's multiply-add
    assert writes and all(op["in_loop"] for op in writes)
    assert row["cache_compiled"]["cross"] == row["cache_formula"]["cross"] == 0  # no cross cache


def test_the_report_shows_the_time_claim_under_both_decodes_labelled(tmp_path):
    """The mini's report with Table 1's time runs also under the paper's decode: Table 1 keeps ours
    (its times, its caption), the paper's decode has its section beside ours (ratios, labelled), and
    the decode-time claim is judged under each decode, named."""
    import dataclasses
    import json

    from test_report import claim_rows, fake_root, mini_sweep

    from gqa_jax.experiments import report
    from gqa_jax.experiments.sweep import Run

    sweep, values = mini_sweep()
    paper_times = {"MHA": 0.08, "GQA-2": 0.07, "MQA": 0.065}  # slower than ours, the same order
    runs = [Run(f"time_{m}_paper", "time", {}, (), {"model": m, "lengths": "512/256", "decode": "paper"})
            for m in paper_times]  # fmt: skip
    sweep = dataclasses.replace(sweep, runs=(*sweep.runs, *runs))
    root = fake_root(tmp_path, sweep, values | {r.name: paper_times[r.tags["model"]] for r in runs})
    for r in runs:
        timing = json.loads((root / r.name / "timing.json").read_text())
        (root / r.name / "timing.json").write_text(json.dumps({**timing, "decode": "paper"}))
    numbers = report.compute(sweep, root)
    assert numbers["table1"].row("MQA").time.mean == pytest.approx(0.02)  # ours alone (0.5 and 1.5 x 0.02)
    assert "PAPER'S DECODE" not in numbers["table1"].source
    rows = {r.model: r for r in numbers["paper_decode"].decodes["paper"]}
    assert rows["MQA"].time.mean == pytest.approx(0.065) and rows["MQA"].ours.mean == pytest.approx(0.02)
    md = report.write_report(sweep, root)["report.md"].read_text()
    section = md.split("## Table 1's T_infer under the paper's decode")[1].split("\n## ")[0]
    assert "UNDER THE PAPER'S DECODE (paper: T5X's, an instrument" in section
    assert "| MQA | `paper` | 0.065" in section and "| 3.25 |" in section  # 0.065 / 0.02
    verdicts = claim_rows(md)
    under = (
        "decode time MQA < GQA < MHA (the time runs: {}), UNDER THE PAPER'S DECODE `paper` (an instrument)"
    )
    assert verdicts["decode time MQA < GQA < MHA (the time runs: the whole decode)"] == "reproduced"
    assert verdicts[under.format("the whole decode")] == "reproduced"
    assert under.format("the decoder's steps alone") in verdicts


def test_time_predict_costs_a_hoisted_projection_as_the_loop_runs_it(tmp_path):
    """``time --predict --decode cross_recompute``: the compiled loop hoists the projection, so the
    prediction costs the programs the loop runs, which are our decode's (the projection once in the
    prefill, a step that reads its results): the same cost as ours; the step as written, projecting
    the encoder output itself, is kept beside them (``step_in_loop``: more flops); the record names
    the decode, and ours names none. ``--cache-layout heads``: the cache held as T5X's rules hold it,
    its K/V heads over the model axis alone, whole on every chip where they do not split.
    ``--beam-search``: each step a beam search's of one beam, T5X's default decode."""
    import json

    from gqa_jax.cli import time as time_cli

    p = options.Parser(prog="time")
    time_cli.add_args(p)
    records = {}
    for name, decode, more in (("ours", "ours", []), ("cross", "cross_recompute", []),
                               ("heads", "cross_recompute", ["--cache-layout", "heads"]),
                               ("beam", "one_hot_write", ["--beam-search"])):  # fmt: skip
        argv = ["--workdir", str(tmp_path / name), "--preset", "tiny", "--num-kv-heads", "2", "--input-len",
                "24", "--output-len", "8", "--predict", "v4:2x2x1", "--mesh", "1x4", "--batch", "8",
                "--decode", decode, *more]  # fmt: skip
        assert time_cli.run(p.parse_args(argv)) == 0
        records[name] = json.loads((tmp_path / name / "timing.json").read_text())
    records["cross_recompute"] = records.pop("cross")
    # T5X's default decode, a beam search of one beam: its step costs more than a greedy one
    beam = records.pop("beam")
    assert beam["beams"] == 1 and "beams" not in records["ours"]
    step_bytes = {
        k: r["prediction"]["meshes"][0]["step"]["bytes_accessed"]
        for k, r in (("beam", beam), *records.items())
    }
    assert step_bytes["beam"] > step_bytes["ours"]
    # T5X's rules: 2 K/V heads do not split over the 4-way model axis alone, so every chip holds them all
    heads = records.pop("heads")["prediction"]["meshes"][0]
    assert heads["cache_specs"]["self"] == "P(None, None, None, None)"
    ours, paper = (records[d]["prediction"]["meshes"][0] for d in ("ours", "cross_recompute"))
    assert "decode" not in records["ours"] and records["cross_recompute"]["decode"] == "cross_recompute"
    assert "cross_kv_projection" not in ours and paper["cross_kv_projection"] == loop_hlo.HOISTED
    for program in ("prefill", "step"):
        assert paper[program]["flops"] == ours[program]["flops"], program
        assert paper[program]["bytes_accessed"] == ours[program]["bytes_accessed"], program
    assert paper["step_in_loop"]["flops"] > paper["step"]["flops"]  # the projection at every step
    assert records["cross_recompute"]["time_per_sample_s"] == records["ours"]["time_per_sample_s"]
    assert ours["cache_specs"]["self"] != heads["cache_specs"]["self"]  # ours: rows over the rest
    assert heads["step"]["memory"]["argument"] > paper["step"]["memory"]["argument"]  # the copies
