"""``time --predict`` (``gqa_jax.tools.t_infer_predict``): T_infer predicted for a TPU slice from the
TPU compiler on this host (libtpu from requirements-test.txt), on the tiny preset at v4:2x2x1: the
record's numbers are the TPU executables' and add up as the roofline says, the batch and mesh
rules, the compiler's element limit, bad input, and a report that labels predictions."""

from __future__ import annotations

import copy
import json
import math
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from test_timing import PREDICTED_KEYS

from gqa_jax import decode_inputs, decoding
from gqa_jax import sharding as sharding_lib
from gqa_jax.cli import options
from gqa_jax.cli import time as time_cli
from gqa_jax.experiments import report
from gqa_jax.experiments.parts import md as md_lib
from gqa_jax.experiments.stats import Stat
from gqa_jax.experiments.sweep import Run, Sweep
from gqa_jax.timing import TimingRecord
from gqa_jax.tools import compiled_memory, plan, tpu_topology
from gqa_jax.tools import t_infer as td
from gqa_jax.tools import t_infer_predict as tp
from gqa_jax.tools.bench_models import NEVER_EOS
from gqa_jax.tools.compiled_memory import compile_lowered

TOPOLOGY = "v4:2x2x1"  # 4 chips
SHAPE = ["--input-len", "32", "--output-len", "8"]


def parse(argv):
    p = options.Parser(prog="time")
    time_cli.add_args(p)
    return p.parse_args(argv)


def settings(workdir, **kw):
    base = dict(preset="tiny", num_kv_heads=2, input_len=32, output_len=8, predict=TOPOLOGY)
    return td.TimeSettings(workdir=str(workdir), **(base | kw))


@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    """``time --predict v4:2x2x1`` through the command, every mesh (auto), the paper's batch rule."""
    workdir = tmp_path_factory.mktemp("predict") / "t"
    argv = ["--workdir", str(workdir), "--preset", "tiny", "--num-kv-heads", "2", "--predict", TOPOLOGY]
    assert time_cli.run(parse(argv + SHAPE)) == 0
    return json.loads((workdir / td.TIMING_FILE).read_text())


def test_the_record_is_the_roofline_of_the_tpu_executables(predicted):
    r, p = predicted, predicted["prediction"]
    assert tuple(r) == PREDICTED_KEYS and r["times_s"] == []  # nothing was run
    assert TimingRecord.from_dict(r).to_dict() == r  # the record the command wrote reads back
    assert p["topology"] == TOPOLOGY and p["chips"] == 4 and p["chip"]["device_kind"] == "TPU v4"
    assert [m["mesh"] for m in p["meshes"]] == ["4x1", "2x2", "1x4"]  # every split (auto)
    chip = tpu_topology.CHIPS["v4"]
    for m in p["meshes"]:
        assert m["fits"] and m["batch"] == 32 * 4  # the tiny model fits the cap: 32 per chip
        for program in ("prefill", "step"):
            c = m[program]
            assert c["flops"] > 0 and c["bytes_accessed"] > 0 and c["memory"]["total"] > 0
            assert c["compute_s"] == c["flops"] / chip.peak_bf16_flops
            assert c["s"] == max(
                c["flops"] / chip.peak_bf16_flops, c["bytes_accessed"] / chip.hbm_bytes_per_s
            )
        batch_s = m["prefill"]["s"] + 8 * m["step"]["s"]  # prefill + T x step
        assert m["time_per_sample_s"] == pytest.approx(batch_s * 4 / m["batch"])  # per chip
    best = min(p["meshes"], key=lambda m: m["time_per_sample_s"])
    assert p["mesh"] == best["mesh"] and r["time_per_sample_s"] == best["time_per_sample_s"]
    assert r["batch"] == best["batch"] and r["batch_rule"] == tp.RULE_AUTO
    assert r["steps_per_sample_s"] == pytest.approx(r["time_per_sample_s"] - r["prefill_per_sample_s"])


@pytest.fixture(scope="module")
def mesh_4x1(tmp_path_factory):
    """``(settings, slice, mesh 4x1)``, one ``_Mesh`` for the tests below: the programs and loops
    one test compiles on it (kept in ``compiled`` and ``loops``) are the next one's too."""
    s = settings(tmp_path_factory.mktemp("mesh_4x1"), mesh="4x1")
    tpu = tpu_topology.slice_devices(TOPOLOGY)
    return s, tpu, tp._setup(td.model_config(s), tpu, "4x1")


def test_the_cost_is_one_devices_and_the_fit_is_the_whole_loops(mesh_4x1):
    """Per device: twice the rows per chip, twice the prefill's flops. The fit is the decode loop's
    memory (``plan --topology``'s decode row), which holds more than the prefill or the step alone."""
    s, _, m = mesh_4x1
    one, two = tp.compile_programs(m, 4, s), tp.compile_programs(m, 8, s)
    assert two["prefill"]["cost"]["flops"] == pytest.approx(2 * one["prefill"]["cost"]["flops"], rel=0.05)
    loop = plan.plan(
        plan.PlanSettings(
            preset="tiny",
            num_kv_heads=2,
            mesh="4x1",
            batch=8,
            input_len=32,
            output_len=8,
            programs=("decode",),
            batch_search=(),
            topology=TOPOLOGY,
        )  # fmt: skip
    )["programs"]["decode"]["memory"]["total"]
    assert tp.loop_memory(m, s, 8)["total"] == loop > two["total"]


def test_a_batch_over_the_compilers_limit_is_costed_from_row_chunks(mesh_4x1, monkeypatch):
    """Above MAX_ENCODER_LOGITS the TPU compiler crashes on the encoder, so a TPU encodes the batch
    in row chunks: the prediction compiles one chunk and scales its cost by the chunks (the record
    says so), which agrees with an unchunked compile of the same batch below the limit (the flops;
    the bytes grow, the weights read once per chunk); the step
    is compiled at the whole batch, on the state the chunks fill; the loop's memory is the chunked
    loop's, and the auto batch is no longer capped by the limit. (At the cap, 128 rows: the record's
    test compiles the unchunked programs, and the plan's loop is the one the prediction compiles.)"""
    s, tpu, plain = mesh_4x1
    config = td.model_config(s)
    whole = tp.compile_programs(plain, 128, s)  # 32 rows per chip: no chunks
    per_row = decode_inputs.encoder_logits(config, 4, 32, plain.mesh)
    assert per_row == config.num_heads * 32 * 32  # one row per chip: heads x S x S
    monkeypatch.setattr(decode_inputs, "MAX_ENCODER_LOGITS", 16 * per_row)  # 16 rows per chip at most
    m = tp._setup(config, tpu, "4x1")
    chunked = tp.compile_programs(m, 128, s)
    p = chunked["prefill"]
    assert (p["rows"], p["chunks"]) == (64, 2) and "cost x 2" in p["scaled"]
    assert "rows" not in whole["prefill"]
    assert p["cost"]["flops"] == pytest.approx(whole["prefill"]["cost"]["flops"], rel=0.02)
    # every chunk reads the weights again: more bytes than one pass, less than a pass per chunk
    assert whole["prefill"]["cost"]["bytes_accessed"] < p["cost"]["bytes_accessed"]
    assert p["cost"]["bytes_accessed"] < 2 * whole["prefill"]["cost"]["bytes_accessed"]
    assert chunked["step"]["cost"] == whole["step"]["cost"]  # the same step, at 128 rows
    planned = plan.PlanSettings(
        preset="tiny", num_kv_heads=2, mesh="4x1", batch=128, input_len=32, output_len=8,
        programs=("decode",), batch_search=(), topology=TOPOLOGY,
    )  # fmt: skip
    assert plan.plan(planned)["programs"]["decode"]["prefill_rows"] == 64  # the loop as the TPU runs it
    row = tp.predict_mesh(m, s, tpu, limit=2**40, log=lambda _: None)
    assert row.batch == 128 and row.fits and row.prefill.chunks == 2  # 16 of 32 rows per chip


def test_a_batch_search_when_the_cap_does_not_fit(mesh_4x1):
    """The limit between the loops at 8 and 12 rows: the search lands on 8 (their compiles, and
    the programs at 8, are the test above's or the search's own)."""
    s, tpu, m = mesh_4x1
    fits, over = tp.loop_memory(m, s, 8)["total"], tp.loop_memory(m, s, 12)["total"]
    limit = (fits + over) // 2
    row = tp.predict_mesh(m, s, tpu, limit, lambda _: None)
    assert 4 <= row.batch < 128 and row.batch % 4 == 0 and row.fits
    assert m.loops[row.batch]["total"] <= limit < m.loops[row.batch + 4]["total"]


def test_a_refused_loop_counts_the_temporaries_it_names_so_the_search_stays_short(tmp_path, monkeypatch):
    """A loop the compiler refuses over the chip's HBM (MHA-XXL at 256 rows) enters the batch search
    as the temporaries its refusal names plus the parameters, so the affine fit stays sane: the
    search lands at the largest batch that fits in a few compiles instead of walking up one row at
    a time. (Memory simulated: a line of 1 GiB + 0.1 GiB per row, refused over 30 GiB.)"""
    s = settings(tmp_path, mesh="4x1")
    tpu = tpu_topology.slice_devices(TOPOLOGY)
    m = tp._setup(td.model_config(s), tpu, "4x1")
    gib, compiled = 2**30, []

    def planned(settings, log=None):
        compiled.append(settings.batch)
        total = int((1 + 0.1 * settings.batch) * gib)
        if total > 30 * gib:
            temp = (total - compiled_memory.device_bytes(m.params)) / gib
            raise ValueError(f"the TPU compiler refused the decode loop at batch {settings.batch}: "
                             f"the total memory required for HLO temporaries ({temp:.2f}G) exceeds "
                             "available HBM (30.75G)")  # fmt: skip
        return {"programs": {"decode": {"memory": {"total": total}, "compile_s": 0.0}}}

    monkeypatch.setattr(plan, "plan", planned)
    batch, how = tp._largest_batch(m, s, 512, 4, 16 * gib, lambda _: None)  # the cap: 52.2 GiB, refused
    assert batch == 148, how  # 1 + 0.1 x 148 = 15.8 GiB fits 16, 152 rows (the next 4 per chip) do not
    assert m.loops[512]["refused"] and m.loops[512]["total"] == pytest.approx(52.2 * gib, rel=1e-3)
    assert len(compiled) <= 5, compiled


def test_bad_input_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="--predict compiles a preset's shapes"):
        tp.check_settings(settings(tmp_path, preset=None, num_kv_heads=None, model=str(tmp_path)))
    with pytest.raises(ValueError, match=r"--mesh 2x1 has 2 devices but TPU slice v4:2x2x1 has 4 chips"):
        tp.check_settings(settings(tmp_path, mesh="2x1"))
    with pytest.raises(ValueError, match=r"--batch 6 does not split over mesh 4x1's data axis 4"):
        tp.check_settings(settings(tmp_path, mesh="4x1", batch=6))
    with pytest.raises(ValueError, match="unknown TPU generation 'v9'"):
        tp.check_settings(settings(tmp_path, predict="v9:2x2"))
    with pytest.raises(ValueError, match="--mesh applies to --predict only"):
        time_cli.run(parse(["--workdir", str(tmp_path), "--preset", "tiny", "--mesh", "2x2", *SHAPE]))
    assert not (tmp_path / td.TIMING_FILE).exists()


def test_a_report_of_predictions_says_so_with_the_ratio_and_the_speed_ups(tmp_path, predicted):
    """Table 1 from predicted timing.json records: labelled, beside the paper's, ours / paper."""
    from test_report import PAPER_ROWS, TASKS, write_run

    times = {"MHA-Large": 0.1, "MHA-XXL": 0.5, "MQA-XXL": 0.05, "GQA-8-XXL": 0.1}
    runs = [Run(f"time_{m}", "time", {"predict": TOPOLOGY}, (), {"model": m, "predicted": TOPOLOGY})
            for m in times]  # fmt: skip
    sweep = Sweep("table1", tuple(runs), {"tasks": TASKS, "rows": PAPER_ROWS})
    for run in runs:
        write_run(tmp_path, run, None)
        record = {**predicted, "time_per_sample_s": times[run.tags["model"]], "prefill_per_sample_s": 0.01}
        (tmp_path / run.name / td.TIMING_FILE).write_text(json.dumps(record))
    md = report.write_report(sweep, tmp_path)["report.md"].read_text()
    table = md.split("## Table 1")[1].split("\n## ")[0]
    assert f"PREDICTED for TPU {TOPOLOGY} (4 x TPU v4), not measured" in table
    floor = TimingRecord.from_dict(predicted).read_once_floor()
    assert (
        "| model | T_infer (s) PREDICTED | ours / paper | read-once floor (s) | of which prefill (s) |"
        in table
    )
    assert f"| MHA-XXL | 0.5 (1.51) | 0.33 | {md_lib.fmt(Stat(floor), 'time')} | 0.01 |" in table
    # every record here holds the same compiled programs: the floors' speed-ups are 1
    assert "MQA-XXL 10.00x, floor 1.00x (paper 6.29x), GQA-8-XXL 5.00x, floor 1.00x (paper 5.39x)" in table
    assert not math.isnan(predicted["time_per_sample_s"])


def test_the_read_once_floor_is_the_roofline_of_what_each_program_must_move(predicted):
    """The floor: each program's flops against the peak, its bytes read or written once (arguments
    + outputs not aliased, memory_analysis) against the bandwidth; prefill + T x step per sample per
    chip on the chosen mesh. Below the prediction, whose bytes are XLA's count over every op."""
    p = predicted["prediction"]
    chip, row = tpu_topology.CHIPS["v4"], next(m for m in p["meshes"] if m["mesh"] == p["mesh"])
    once = []
    for program in ("prefill", "step"):
        mem, flops = row[program]["memory"], row[program]["flops"]
        moved = mem["argument"] + mem["output"] - mem["alias"]
        assert 0 < moved < row[program]["bytes_accessed"]  # XLA counts more than the minimum
        once.append(max(flops / chip.peak_bf16_flops, moved / chip.hbm_bytes_per_s))
    expected = (once[0] + 8 * once[1]) * 4 / predicted["batch"]
    floor = TimingRecord.from_dict(predicted).read_once_floor()
    assert floor == pytest.approx(expected) and 0 < floor < predicted["time_per_sample_s"]
    measured = {k: v for k, v in predicted.items() if k != "prediction"}
    assert TimingRecord.from_dict(measured).read_once_floor() is None  # a measured time has no floor
    chunked = copy.deepcopy(predicted)  # a prefill costed from 2 row chunks moves one chunk's bytes twice
    row = next(m for m in chunked["prediction"]["meshes"] if m["mesh"] == p["mesh"])
    row["prefill"]["chunks"], row["prefill"]["flops"] = 2, 0.0
    prefill_once = (
        2 * (row["prefill"]["memory"]["argument"] + row["prefill"]["memory"]["output"]) / chip.hbm_bytes_per_s
    )
    assert TimingRecord.from_dict(chunked).read_once_floor() == pytest.approx(
        (prefill_once + 8 * once[1]) * 4 / predicted["batch"]
    )


def test_the_step_writes_the_cache_at_one_index_without_a_scatter_or_a_loop(tmp_path):
    """One shared cache index: the TPU compiler's optimized decode step (``decoding.step``, the
    program ``time --predict`` costs, lowered here as ``compile_programs`` lowers it for the
    record's 1x4 mesh, so this process compiles it once) holds no scatter and no while loop. The
    per-row vmapped write it replaced compiled to a scatter in a while loop over rows, and its
    counted bytes were 28.4 times the step's arguments on this mesh (docs/decoding.md)."""
    s = settings(tmp_path)
    tpu = tpu_topology.slice_devices(TOPOLOGY)
    m = tp._setup(td.model_config(s), tpu, "1x4")
    replicated = NamedSharding(m.mesh, PartitionSpec())
    ids = jax.ShapeDtypeStruct((128, 32), jnp.int32, sharding=sharding_lib.batch_sharding(m.mesh))
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    greedy = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)
    config = decoding.decode_config(8, mesh=m.mesh, eos_id=NEVER_EOS, cache_dtype=None, decode=s.decode)
    start = compile_lowered(
        decoding.start.lower(m.graphdef, m.params, ids, key, config=config, mesh=m.mesh), "tpu"
    )
    weights = decoding.step_weights(m.graphdef, m.params, config)  # a TPU's: as they are
    step = decoding.step.lower(m.graphdef, weights, start.out_info, greedy, config=config, mesh=m.mesh)
    hlo = compile_lowered(step, "tpu").as_text()
    assert not re.search(r" (scatter|while)\(", hlo)  # as an instruction (names may say either)
