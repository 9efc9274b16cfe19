"""The bytes model beside the measured times and the time claims' gate
(gqa_jax.experiments.parts.time_model): the ratios and the realised fraction, the gate on made-up
cells (a spread larger than the predicted difference among them), and through the report on fake
run directories: the bytes columns, a time claim made "not testable at this setting", and a
timing.json from before the decoder's steps and the bytes were recorded."""

from __future__ import annotations

import json

import pytest
from test_report import STEPS, as_older_timings, claim_rows, fake_root, mini_sweep, step_bytes
from test_sanity_claims import TIME, TIME_STEPS
from test_timing import WRITTEN

from gqa_jax.experiments import report
from gqa_jax.experiments.claims import MISSING, NOT_IN_SWEEP, NOT_TESTABLE, REPRODUCED, WITHIN_NOISE
from gqa_jax.experiments.parts import records, time_model
from gqa_jax.experiments.stats import Stat, stat
from gqa_jax.experiments.sweep import Run

GATE_STEPS = "the bytes model predicts differences beyond the timing spread (the decoder's steps alone)"
GATE_WHOLE = "the bytes model predicts differences beyond the timing spread (the whole decode)"


def repeats(*xs):
    return stat(dict(enumerate(xs)), len(xs))


def timed(label, steps, whole, sample_bytes, roofline=None):
    reads = time_model.Reads(1.0, sample_bytes, 0.9, roofline, None if roofline is None else 10.0)
    return time_model.Timed(label, repeats(*whole), repeats(*steps), reads)


def test_the_ratios_to_mha_and_the_fraction_of_the_predicted_saving_realised():
    """Against MHA: the bytes model's and the roofline's ratios, the measured ones, and the share
    of each predicted saving realised; the rate the steps read at beside the machine's."""
    mha = timed("MHA", (2.0, 2.0), (2.5, 2.5), 100.0, roofline=1.0)
    # bytes predict 0.2 and the roofline 0.5; the steps took 0.75 of MHA's
    mqa = timed("MQA", (1.5, 1.5), (2.0, 2.0), 20.0, roofline=0.5)
    v = time_model.versus(mqa, mha)
    assert (v.predicted, v.roofline, v.steps, v.whole) == pytest.approx((0.2, 0.5, 0.75, 0.8))
    assert v.realised == pytest.approx(0.25 / 0.8)  # a quarter saved of the 80% predicted
    assert v.realised_roofline == pytest.approx(0.25 / 0.5)  # of the roofline's half
    assert time_model.versus(mha, mha).realised is None  # no saving predicted: no fraction
    row = time_model.row(mqa, mha)
    # 20 bytes per sample over 1.5 s per sample: 1.3e-8 GB/s, 0% of the machine's 10 GB/s
    assert row[2:] == ["0.0", "90%", "0.0 (0%)", "0.20", "0.50", "0.75", "0.80", "31%", "50%"]
    older = time_model.Timed(
        "MQA", repeats(2.0), Stat(None, expected=1), time_model.Reads()
    )  # no steps, bytes
    assert time_model.row(older, mha)[1:] == ["missing", "—", "—", "—", "—", "—", "—", "0.80", "—", "—"]


def test_the_gate_passes_when_the_predicted_differences_exceed_the_spread():
    cells = {
        "MQA": timed("MQA", (0.40, 0.42, 0.41), (0.50, 0.52, 0.51), 20.0),
        "GQA": timed("GQA", (0.60, 0.62, 0.61), (0.70, 0.72, 0.71), 40.0),
        "MHA": timed("MHA", (2.00, 2.02, 2.01), (2.10, 2.12, 2.11), 100.0),
    }
    gate = time_model.gate("steps", ("MQA", "GQA", "MHA"), cells)
    assert gate.verdict == REPRODUCED
    # predicted: MHA's 2.01 s x 20 / 100 = 0.402, x 40 / 100 = 0.804; differences 0.402 and 1.206 s
    assert "MQA 0.402 s, GQA 0.804 s, MHA 2.01 s" in gate.evidence and "MQA–GQA 0.402 s" in gate.evidence
    assert gate.resolves == pytest.approx(0.01 * 2**0.5)  # both pairs' spreads: sqrt(0.01² + 0.01²)


def test_the_gate_fails_when_the_spread_is_larger_than_the_predicted_difference():
    # MQA and GQA by the bytes model 2.01 x (20 - 19) / 100 = 0.02 s apart; their repeats spread 0.1 s
    cells = {
        "MQA": timed("MQA", (0.30, 0.40, 0.50), (0.4, 0.5, 0.6), 19.0),
        "GQA": timed("GQA", (0.35, 0.45, 0.55), (0.45, 0.55, 0.65), 20.0),
        "MHA": timed("MHA", (2.00, 2.02, 2.01), (2.10, 2.12, 2.11), 100.0),
    }
    for measure in ("steps", "whole"):
        gate = time_model.gate(measure, ("MQA", "GQA", "MHA"), cells)
        assert gate.verdict == WITHIN_NOISE
        assert gate.resolves == pytest.approx(0.1 * 2**0.5)
        assert "MQA–GQA 0.0201 s (spread 0.141 s)" in gate.evidence


def test_the_gate_is_missing_without_a_bytes_model_or_measured_steps_and_not_in_a_sweep_without_a_model():
    full = {m: timed(m, (1.0, 1.1), (1.2, 1.3), b) for m, b in (("MQA", 20.0), ("GQA", 40.0), ("MHA", 100.0))}
    no_bytes = dict(full, GQA=time_model.Timed("GQA", repeats(1.2, 1.3), repeats(1.0, 1.1)))
    assert time_model.gate("whole", ("MQA", "GQA", "MHA"), no_bytes).verdict == MISSING
    no_steps = dict(
        full, MHA=time_model.Timed("MHA", repeats(1.2), Stat(None, expected=1), full["MHA"].reads)
    )
    gate = time_model.gate("whole", ("MQA", "GQA", "MHA"), no_steps)
    assert gate.verdict == MISSING and "no measured decoder steps of MHA" in gate.evidence
    assert time_model.gate("steps", ("MQA", None, "MHA"), full).verdict == NOT_IN_SWEEP


def test_a_record_reads_the_decoder_steps_and_the_bytes_and_a_prediction_its_steps(tmp_path):
    run = Run("time_x", "time", {}, (), {"model": "MQA"})
    d = tmp_path / run.name
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"status": "done"}))
    measured, predicted = (json.loads((WRITTEN / f).read_text()) for f in ("measured.json", "predicted.json"))
    timing = {**measured, "time_per_sample_s": 0.5, "times_s": [4.0], "batch": 8, "output_len": 16,
              "steps_times_s": [3.2, 3.6], "step_bytes": step_bytes(0.5)}  # fmt: skip
    (d / "timing.json").write_text(json.dumps(timing))
    rec = records.read_run(tmp_path, run)
    assert rec.steps_times == (0.4, 0.45) and rec.step_bytes == 5e7
    assert rec.sample_bytes == 5e7 * 16 / 8 and rec.cache_share == pytest.approx(0.9)
    predicted |= {"time_per_sample_s": 0.5, "steps_per_sample_s": 0.3, "batch": 8}
    (d / "timing.json").write_text(json.dumps(predicted))
    rec = records.read_run(tmp_path, run)
    assert rec.steps_times == (0.3,) and rec.step_bytes is None and rec.sample_bytes is None


def test_the_report_shows_the_bytes_beside_every_time_cell(tmp_path):
    sweep, values = mini_sweep()
    md = report.write_report(sweep, fake_root(tmp_path, sweep, values))["report.md"].read_text()
    table = md.split("## Table 1")[1].split("Dev loss")[0]
    # MQA 0.02 s per sample: a step reads 0.02 x 1e8 bytes; MHA 0.04 s: 4 MB; the steps 0.8 of each;
    # the steps read 2 MB x 16 steps / 8 rows in 0.016 s: 0.25 GB/s, a quarter of the machine's 1 GB/s;
    # the roofline half the steps' time: its ratio to MHA's the same as the measured one
    row = "| MQA | 0.02 ± 0.000503, n=3 | 0.016 ± 0.000403, n=3 | 2.0 | 90% | 0.2 (25%) | 0.50 | 0.50 |"
    assert row + " 0.50 | 0.50 | 100% | 100% |" in table
    fig6 = md.split("## Fig. 6")[1].split("## ")[0]
    mha = "| float, 8 (MHA) | 0.03 ± 0.000755, n=3 | 0.024 ± 0.000604, n=3 | 3.0 | 90% | 0.2 (25%) | 1.00 |"
    assert mha in fig6
    assert "| float, 1 | 0.0125 ± 0.000315, n=3 |" in fig6 and STEPS == 0.8


def test_a_spread_larger_than_the_predicted_difference_makes_the_time_claims_not_testable(tmp_path):
    sweep, values = mini_sweep()
    root = fake_root(tmp_path, sweep, values)
    for model in ("MQA", "GQA-2", "MHA"):  # the bytes model: GQA-2 reads a hair more than MQA, no more
        for path in root.glob(f"time_{model}_*/timing.json"):
            timing = json.loads(path.read_text())
            path.write_text(json.dumps(timing | {"step_bytes": step_bytes({"MHA": 0.04}.get(model, 0.02))}))
    md = report.write_report(sweep, root)["report.md"].read_text()
    verdicts = claim_rows(md)
    assert verdicts[TIME_STEPS] == verdicts[TIME] == NOT_TESTABLE  # the rule alone: reproduced
    assert "by the rule alone: reproduced" in md.split("## The paper's claims")[1]
    assert "Failed: the time claim on the decoder's steps alone and on the whole decode" in md
    assert verdicts["quality MHA ≥ GQA ≥ MQA after uptraining (Table 1, plain mean)"] == "within noise"


def test_older_timing_records_say_the_decoder_steps_and_the_bytes_are_missing(tmp_path):
    sweep, values = mini_sweep()
    root = fake_root(tmp_path, sweep, values)
    as_older_timings(root)
    md = report.write_report(sweep, root)["report.md"].read_text()
    verdicts = claim_rows(md)
    assert verdicts[TIME] == REPRODUCED and verdicts[TIME_STEPS] == MISSING  # judged ungated, never made up
    gates = md.split("| gate |")[1].split("\n\n")[0]
    assert f"{GATE_STEPS} | no bytes model in timing.json" in gates and f"{GATE_WHOLE} | no bytes" in gates
    assert "| MQA | 0.02 ± 0.000503, n=3 | missing | — | — | — | — | — | — | 0.50 | — | — |" in md
