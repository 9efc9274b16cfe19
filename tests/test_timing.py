"""The timing record (``gqa_jax.timing``): timing.json as ``time`` and ``time --predict`` wrote it
before the record was typed reads into a ``TimingRecord`` and writes back byte for byte; records
written before a field was recorded keep reading; a bad record is one error naming the file and the
field; the roofline and the read-once floor.

tests/timing_records/ holds timing.json files the untyped writers wrote (gqa_jax at 8d482a3, the
tiny preset): measured.json (``time --batch 2 --input-len 16 --output-len 8 --runs 2 --dtype
float32 --num-kv-heads 2``), predicted.json (``time --predict v4:2x2x1 --batch 6 --input-len 32
--output-len 8 --num-kv-heads 2``: a mesh the batch does not split over beside two that compiled)
and predicted_chunked.json (``--mesh 4x1 --batch 16`` with the encoder's element limit at 2 rows
per chip: a prefill costed from row chunks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gqa_jax import timing
from gqa_jax.experiments.parts import records
from gqa_jax.experiments.sweep import Run
from gqa_jax.timing import TimingRecord

WRITTEN = Path(__file__).resolve().parent / "timing_records"
COMMON_KEYS = (
    "time_per_sample_s", "times_s", "prefill_per_sample_s", "prefill_times_s", "steps_per_sample_s",
    "batch", "batch_rule", "input_len", "output_len", "preset", "num_heads", "num_kv_heads", "dtype",
    "cache_dtype", "weights", "machine",
)  # fmt: skip
MEASURED_KEYS = (
    *COMMON_KEYS,
    "steps_times_s",
    "step_bytes",
    "step_roofline",
)  # measured.json: all but the last
PREDICTED_KEYS = (*COMMON_KEYS, "prediction")
# what a measured timing.json lacked before each was recorded: the decoder steps and the bytes model,
# the prefill alone and the steps' median, the KV cache's dtype (the step's roofline came later still:
# tests/test_t_infer.py writes it)
OLDER = (("steps_times_s", "step_bytes"), ("prefill_per_sample_s", "prefill_times_s", "steps_per_sample_s"),
         ("cache_dtype",))  # fmt: skip


def text(name: str) -> str:
    return (WRITTEN / name).read_text()


def written(record: TimingRecord) -> str:
    """The file ``time`` writes (``t_infer.write_record``; these records hold only JSON's types)."""
    return json.dumps(record.to_dict(), indent=1) + "\n"


@pytest.mark.parametrize("name", ["measured.json", "predicted.json", "predicted_chunked.json"])
def test_a_record_the_untyped_writers_wrote_round_trips_byte_for_byte(name):
    data = json.loads(text(name))
    record = TimingRecord.from_dict(data)
    assert record.to_dict() == data and list(record.to_dict()) == list(data)
    assert written(record) == text(name)
    assert timing.read(WRITTEN / name) == record
    keys = PREDICTED_KEYS if record.prediction is not None else MEASURED_KEYS[:-1]
    assert tuple(data) == keys


def test_the_typed_fields_of_a_measured_and_a_predicted_record():
    measured = TimingRecord.from_dict(json.loads(text("measured.json")))
    assert measured.prediction is None and measured.read_once_floor() is None
    assert isinstance(measured.times_s, tuple) and measured.step_bytes["total"] == 120064
    predicted = TimingRecord.from_dict(json.loads(text("predicted.json")))
    p = predicted.prediction
    assert (p.topology, p.chips, p.mesh, predicted.batch) == ("v4:2x2x1", 4, "2x2", 6)
    assert [(m.mesh, m.fits, m.prefill is not None) for m in p.meshes] == [
        ("4x1", False, False),
        ("2x2", True, True),
        ("1x4", True, True),
    ]
    assert p.meshes[0].why == "batch 6 does not split over the data axis 4"
    assert p.chosen is p.meshes[1] and p.chosen.time_per_sample_s == predicted.time_per_sample_s
    chunked = TimingRecord.from_dict(json.loads(text("predicted_chunked.json"))).prediction.chosen.prefill
    assert (chunked.rows, chunked.chunks, chunked.scaled) == (8, 2, "one chunk of 8 rows, cost x 2")


@pytest.mark.parametrize("missing", range(1, len(OLDER) + 1))
def test_a_measured_record_from_before_a_field_was_recorded_reads_and_writes_as_it_was(missing):
    data = json.loads(text("measured.json"))
    for keys in OLDER[:missing]:
        for k in keys:
            del data[k]
    record = TimingRecord.from_dict(data)
    assert record.to_dict() == data and list(record.to_dict()) == list(data)
    assert record.steps_times_s is None and record.step_bytes is None


def test_the_roofline_and_the_read_once_floor_of_a_prediction():
    """Each program of a compiled mesh is the roofline of its cost (``roofline``); the time per
    sample per chip is (prefill + T x step) x chips / batch; the floor is the same with the bytes
    each program reads or writes once, a chunked prefill's once per chunk."""
    for name in ("predicted.json", "predicted_chunked.json"):
        record = TimingRecord.from_dict(json.loads(text(name)))
        p = record.prediction
        for row in (m for m in p.meshes if m.prefill is not None):
            for program in (row.prefill, row.step):
                rebuilt = timing.Roofline.of(
                    {"flops": program.flops, "bytes_accessed": program.bytes_accessed}, p.chip,
                    memory=program.memory, rows=program.rows, chunks=program.chunks, scaled=program.scaled,
                )  # fmt: skip
                assert rebuilt == program
            wall = row.prefill.s + record.output_len * row.step.s
            assert row.batch_s == wall
            assert row.time_per_sample_s == timing.per_sample_per_chip(wall, p.chips, row.batch)
        chip, row = p.chip, p.chosen
        once = []
        for program in (row.prefill, row.step):
            mem = program.memory
            moved = (mem["argument"] + mem["output"] - mem["alias"]) * (program.chunks or 1)
            once.append(max(program.flops / chip["peak_bf16_flops"], moved / chip["hbm_bytes_per_s"]))
        floor = record.read_once_floor()
        assert floor == (once[0] + record.output_len * once[1]) * p.chips / record.batch
        assert 0 < floor < record.time_per_sample_s


def bad(tmp_path, data) -> str:
    path = tmp_path / "timing.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(ValueError) as e:
        timing.read(path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def test_a_bad_record_is_one_error_naming_the_file_and_the_field(tmp_path):
    measured, predicted = json.loads(text("measured.json")), json.loads(text("predicted.json"))
    without_batch = {k: v for k, v in measured.items() if k != "batch"}
    assert "field 'batch' is missing" in bad(tmp_path, without_batch)
    assert "field 'batch' must be an integer >= 1, got '2'" in bad(tmp_path, {**measured, "batch": "2"})
    assert "field 'times_s[1]' must be a number, got None" in bad(
        tmp_path, {**measured, "times_s": [1.0, None]}
    )
    assert "field 'step_bytes.total' is missing" in bad(
        tmp_path, {**measured, "step_bytes": {"self_cache": 1, "cross_cache": 2}}
    )
    assert "field 'extra' is not one of time_per_sample_s, " in bad(tmp_path, {**measured, "extra": 1})
    predicted["prediction"]["meshes"][1]["prefill"]["flops"] = "many"
    assert "field 'prediction.meshes[1].prefill.flops' must be a number, got 'many'" in bad(
        tmp_path, predicted
    )
    assert "not JSON" in bad(tmp_path, '{"batch": ')
    assert "field 'record' must be a JSON object, got []" in bad(tmp_path, "[]")
    assert timing.read(tmp_path / "none" / "timing.json") is None


def test_the_report_reads_a_time_run_through_the_record_and_names_a_bad_one(tmp_path):
    run = Run("time_x", "time", {}, (), {"model": "MQA"})
    d = tmp_path / run.name
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"status": "done"}))
    (d / "timing.json").write_text(text("predicted.json"))
    rec = records.read_run(tmp_path, run)
    assert rec.timing == TimingRecord.from_dict(json.loads(text("predicted.json")))
    assert rec.time == rec.timing.time_per_sample_s and rec.times == ()
    assert rec.prefill_times == (rec.timing.prefill_per_sample_s,)
    assert rec.floor_times == (rec.timing.read_once_floor(),) and rec.predicted is rec.timing.prediction
    (d / "timing.json").write_text(json.dumps({**json.loads(text("measured.json")), "output_len": 0}))
    with pytest.raises(ValueError, match=r"time_x/timing.json: field 'output_len' must be an integer >= 1"):
        records.read_run(tmp_path, run)
    (d / "timing.json").unlink()  # a done time run without one: named (sweep redoes it)
    with pytest.raises(ValueError, match=r"time_x/timing.json is missing, though its run is done"):
        records.read_run(tmp_path, run)
    other = Run("eval_x", "evaluate", {}, (), {})  # a run of another stage has none: no time
    (tmp_path / other.name).mkdir()
    (tmp_path / other.name / "run.json").write_text(json.dumps({"status": "done"}))
    (tmp_path / other.name / "results.json").write_text(json.dumps({"primary": 1.0}))
    assert records.read_run(tmp_path, other).timing is None
