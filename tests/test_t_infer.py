"""The ``time`` stage (``gqa_jax.tools.t_infer``, ``gqa_jax.cli.time``) on the tiny preset:
timing.json's fields, time per sample = median / batch, the batch rules, bad input, overwriting.
The command is run through its module (``cli.time.run`` on a parsed namespace)."""

import json
import statistics

import jax
import pytest
from test_timing import MEASURED_KEYS

from gqa_jax import checkpoints, timing
from gqa_jax import model as model_lib
from gqa_jax.cli import options
from gqa_jax.cli import time as time_cli
from gqa_jax.config import preset
from gqa_jax.timing import TimingRecord
from gqa_jax.tools import decode_floor, plan
from gqa_jax.tools import t_infer as td

SHAPE = ["--input-len", "16", "--output-len", "8", "--runs", "2", "--dtype", "float32"]


def parse(argv):
    p = options.Parser(prog="time")
    time_cli.add_args(p)
    return p.parse_args(argv)


def settings(workdir, **kw):
    base = dict(preset="tiny", input_len=16, output_len=8, batch=2, runs=1, dtype="float32")
    return td.TimeSettings(workdir=str(workdir), **(base | kw))


def test_given_batch_writes_every_field_and_refuses_to_overwrite(tmp_path, capsys):
    workdir = tmp_path / "runs" / "t"  # created, parents too
    argv = ["--workdir", str(workdir), "--preset", "tiny", "--num-kv-heads", "2", "--batch", "2", *SHAPE]
    args = parse(argv)
    assert time_cli.run(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "per sample" in lines[0] and "timing.json" in lines[0]
    text = (workdir / "timing.json").read_text()
    record = json.loads(text)
    assert tuple(record) == MEASURED_KEYS
    typed = TimingRecord.from_dict(record)  # the record the command wrote reads back, and writes the same
    assert json.dumps(typed.to_dict(), indent=1) + "\n" == text
    assert len(record["times_s"]) == 2 and all(t > 0 for t in record["times_s"])
    assert record["time_per_sample_s"] == pytest.approx(statistics.median(record["times_s"]) / 2)
    prefill = record["prefill_times_s"]  # the prefill alone, timed by the same rule
    assert len(prefill) == 2 and all(t > 0 for t in prefill)
    assert record["prefill_per_sample_s"] == pytest.approx(statistics.median(prefill) / 2)
    steps = record["steps_times_s"]  # the step loop alone, on a prefilled state: measured, its own repeats
    assert len(steps) == 2 and all(t > 0 for t in steps)
    assert record["steps_per_sample_s"] == pytest.approx(statistics.median(steps) / 2)
    # the bytes model: tiny K=2 at batch 2, 16 in / 8 out, float32: 2 layers x K/V x 2 heads x 8 x 4 B
    # per row and token, self over the 8 output slots, cross over the 16 input tokens
    per_token = 2 * 2 * 2 * 8 * 4
    read = record["step_bytes"]
    assert (read["self_cache"], read["cross_cache"]) == (2 * 8 * per_token, 2 * 16 * per_token)
    model = model_lib.build(preset("tiny", num_kv_heads=2, dtype="float32"), seed=0)
    weights = decode_floor.step_reads(model, model.config, 2)["weight_bytes"]
    assert read["weights"] == weights and read["total"] == weights + read["self_cache"] + read["cross_cache"]
    roof = record["step_roofline"]  # the step's ops at the rates measured in the run
    assert roof["read_gb_s"] > 0 and roof["matmul_gflop_s"] > 0
    cache = {"self": read["self_cache"], "cross": read["cross_cache"]}
    ops = decode_floor.step_ops(model, model.config, 2, (16, 8), cache)
    assert roof["roofline_s"] == pytest.approx(
        decode_floor.roofline_s(ops, roof["read_gb_s"], roof["matmul_gflop_s"])
    )
    assert roof["roofline_s"] >= read["total"] / (roof["read_gb_s"] * 1e9) * (1 - 1e-9)  # at least the bytes
    assert record["batch"] == 2 and record["batch_rule"] == td.RULE_GIVEN == "given"
    assert (record["input_len"], record["output_len"]) == (16, 8)
    assert (record["preset"], record["num_heads"], record["num_kv_heads"]) == ("tiny", 4, 2)
    assert (record["dtype"], record["cache_dtype"], record["weights"]) == ("float32", "float32", "random")
    assert record["machine"]["backend"] == jax.default_backend()
    assert record["machine"]["device_count"] == jax.device_count()
    assert not [p.name for p in workdir.iterdir() if p.name != "timing.json"]  # no temporary left

    before = (workdir / "timing.json").read_text()
    with pytest.raises(ValueError, match="already exists.*--overwrite"):
        time_cli.run(args)
    assert (workdir / "timing.json").read_text() == before
    assert time_cli.run(parse([*argv, "--overwrite"])) == 0
    assert (workdir / "timing.json").read_text() != before  # new times


def test_a_checkpoint_timed_with_an_int8_cache_records_it(tmp_path):
    shallow = preset("tiny", num_kv_heads=2, num_encoder_layers=1, num_decoder_layers=1)  # half the compile
    ckpt = checkpoints.save(model_lib.build(shallow, seed=3), tmp_path / "ckpt")
    argv = ["--workdir", str(tmp_path / "t"), "--model", str(ckpt), "--batch", "2", "--cache-dtype", "int8"]
    assert time_cli.run(parse([*argv, *SHAPE])) == 0
    record = json.loads((tmp_path / "t" / "timing.json").read_text())
    assert (record["dtype"], record["cache_dtype"], record["num_kv_heads"]) == ("float32", "int8", 2)
    with pytest.raises(SystemExit):  # argparse: --cache-dtype: invalid choice
        parse([*argv, *SHAPE[:-2], "--cache-dtype", "int4"])


def test_batch_auto_takes_the_cap_when_it_fits(tmp_path):
    record = td.measure_t_infer(settings(tmp_path, batch="auto", hbm_gib=1.0))
    cap = td.PER_DEVICE * jax.device_count()
    assert record.batch == cap and record.batch_rule == td.RULE_AUTO
    assert record.batch_rule == "largest that fits, <= 32 per device"
    assert record.time_per_sample_s == pytest.approx(statistics.median(record.times_s) / cap)
    assert timing.read(tmp_path / "timing.json") == record


def test_batch_auto_searches_the_largest_batch_that_fits_below_the_cap(tmp_path):
    hbm = 0.0007  # tiny at 16 / 8, float32: ~0.29 MB at batch 1, ~1.06 MB at batch 32
    record = td.measure_t_infer(settings(tmp_path, batch="auto", hbm_gib=hbm))
    batch = record.batch
    assert 1 <= batch < td.PER_DEVICE * jax.device_count() and record.batch_rule == td.RULE_AUTO

    def fits(b):
        s = plan.PlanSettings(
            preset="tiny", num_kv_heads=None, mesh=f"{jax.device_count()}x1", batch=b, input_len=16,
            output_len=8, hbm_gib=hbm, dtype="float32", programs=("decode",), batch_search=(),
        )  # fmt: skip
        return plan.plan(s)["programs"]["decode"]["fits"]

    assert fits(batch) and not fits(batch + jax.device_count())


def test_a_checkpoint_is_timed_with_its_own_config(tmp_path):
    """K = 2 from the checkpoint, not the preset's 4 (the shapes of the first test: its programs)."""
    ckpt = checkpoints.save(model_lib.build(preset("tiny", num_kv_heads=2), seed=3), tmp_path / "ckpt")
    args = parse(["--workdir", str(tmp_path / "t"), "--model", str(ckpt), "--batch", "2", *SHAPE])
    assert time_cli.run(args) == 0
    record = json.loads((tmp_path / "t" / "timing.json").read_text())
    assert record["weights"] == str(ckpt) and record["preset"] == "tiny"
    assert (record["num_heads"], record["num_kv_heads"], record["batch_rule"]) == (4, 2, "given")
    with pytest.raises(ValueError, match="--num-kv-heads applies to --preset only"):
        td.measure_t_infer(settings(tmp_path / "u", preset=None, model=str(ckpt), num_kv_heads=2))


def test_a_checkpoint_of_no_preset_shape_names_no_preset():
    """8 K/V heads fit none of the presets with fewer query heads (small has 6): no preset, no error."""
    assert td.matching_preset(preset("tiny", num_heads=8, num_kv_heads=8)) is None
    assert td.matching_preset(preset("tiny", num_kv_heads=2)) == "tiny"


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(preset="huge"), ValueError, "unknown preset 'huge'"),
        (dict(num_kv_heads=3), ValueError, "--num-kv-heads 3 does not divide num_heads=4"),
        (dict(input_len=0), ValueError, "input_len=0 must be a positive integer"),
        (dict(output_len=0), ValueError, "output_len=0 must be a positive integer"),
        (dict(batch=0), ValueError, "batch=0 must be a positive integer"),
        (dict(runs=0), ValueError, "runs=0"),
        (dict(dtype="float16"), ValueError, "dtype 'float16'"),
        (dict(model="MODEL"), ValueError, "either --preset .* or --model CKPT_DIR, not both"),
        (dict(preset=None), ValueError, "give --preset P .* or --model CKPT_DIR"),
        (dict(preset=None, model="MODEL"), ValueError, "is not a gqa_jax checkpoint"),
        (dict(preset=None, model="MISSING"), FileNotFoundError, "no checkpoint at"),
    ],
)
def test_bad_input_is_one_error_naming_the_problem(tmp_path, kw, error, match):
    (tmp_path / "MODEL").mkdir()  # a directory that is not a checkpoint
    kw = {k: str(tmp_path / v) if k == "model" else v for k, v in kw.items()}
    with pytest.raises(error, match=match) as e:
        td.measure_t_infer(settings(tmp_path / "t", **kw))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "t").exists()  # nothing written, not even the directory


def test_a_workdir_that_is_a_file_is_an_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        td.measure_t_infer(settings(tmp_path / "f"))


def test_the_batch_option_takes_a_number_or_auto(tmp_path):
    base = ["--workdir", str(tmp_path), "--preset", "tiny"]
    assert parse(base).batch == "auto" and parse([*base, "--batch", "auto"]).batch == "auto"
    assert parse([*base, "--batch", "8"]).batch == 8
    for bad in ("0", "x"):
        with pytest.raises(SystemExit) as e:
            parse([*base, "--batch", bad])
        assert e.value.code == 2
