"""bench step: HLO parsing and byte counting, and the profiled breakdown of a tiny decode loop."""

import json

import jax
import jax.numpy as jnp
import pytest
from jax.profiler import ProfileData

from gqa_jax import model as model_lib
from gqa_jax import profiling
from gqa_jax.__main__ import main
from gqa_jax.cache import expected_cache_bytes
from gqa_jax.config import preset
from gqa_jax.tools import decode_floor, hlo_profile


def test_shape_bytes():
    assert hlo_profile.shape_bytes("f32[8,512]{1,0}") == 8 * 512 * 4
    assert hlo_profile.shape_bytes("(s32[], bf16[3,4]{1,0}, /*index=2*/pred[5]{0})") == 4 + 24 + 5
    assert hlo_profile.shape_bytes("token[]") == 0


def test_an_in_place_write_counts_its_update_not_its_buffer():
    """A compiled dynamic-update-slice (the cache write) reads the update and the index; the
    buffer it writes into is not an input read, whether the op is fused or not."""
    write = jax.jit(lambda buf, upd, i: jax.lax.dynamic_update_slice(buf, upd, (i, 0)), donate_argnums=0)
    buf, upd = jnp.zeros((256, 64)), jnp.ones((1, 64))
    ops, _ = hlo_profile.parse_hlo(write.lower(buf, upd, 3).compile().as_text())
    writers = [op for op in ops.values() if op.opcode == "dynamic-update-slice" or op.calls]
    writers = [op for op in writers if hlo_profile.compact(op.shape) == "f32[256,64]"]
    assert writers, "no op writes the buffer"
    assert all(hlo_profile.input_bytes(op, ops) < 256 * 64 * 4 for op in writers)
    assert any(hlo_profile.input_bytes(op, ops) >= 64 * 4 for op in writers)


def test_a_lookup_counts_the_rows_it_takes_not_the_table():
    lookup = jax.jit(lambda table, ids: jnp.take(table, ids, axis=0) * 2.0)
    table, ids = jnp.ones((4096, 64)), jnp.arange(8)
    ops, _ = hlo_profile.parse_hlo(lookup.lower(table, ids).compile().as_text())
    readers = [op for op in ops.values() if any(ops[n].shape.startswith("f32[4096,64]") for n in op.operands)]
    assert readers  # the fusion, and the gather inside it
    assert all(0 < hlo_profile.input_bytes(op, ops) <= 8 * 64 * 4 + 8 * 4 for op in readers)


def test_bench_step_profiles_the_loop_body(tmp_path, capsys):
    """The loop body op by op, each step beside its roofline: at a preset with fields replaced
    (``--shape``) and an int8 cache, the summary's bytes are the bytes model's; a bad field is
    one line before any work."""
    assert main(["bench", "step", "--shape", "d_ff=x"]) == 2
    assert "--shape 'd_ff=x': give FIELD=N" in capsys.readouterr().err
    path = tmp_path / "step.json"
    args = [
        "--preset",
        "tiny",
        "--shape",
        "d_ff=48",
        "--batch",
        "2",
        "--input-len",
        "16",
        "--new-tokens",
        "3",
    ]
    args += ["--kv-heads", "1", "--cache-dtype", "int8"]
    code = main(
        ["bench", "step", *args, "--top", "5", "--json", str(path), "--keep-trace", str(tmp_path / "tr")]
    )
    assert code == 0
    for k in (4, 1):  # each model's trace kept where asked, in the layout TensorBoard's profile plugin reads
        (trace,) = profiling.trace_files(tmp_path / "tr" / f"kv{k}")
        planes = {plane.name: plane for plane in ProfileData.from_file(str(trace)).planes}
        assert sum(1 for line in planes["/host:CPU"].lines for _ in line.events) > 0
    out = capsys.readouterr().out
    assert "## MHA (K = 4)" in out and "## MQA (K = 1)" in out and "| source | op | output |" in out
    assert "| model | ms / step | MB / step | MFLOP / step | GB/s | share of the machine's |" in out
    res = json.loads(path.read_text())
    assert res["settings"]["cache_dtype"] == "int8" and res["rates"]["read_big"]["bytes"] >= 2**28
    assert res["rates"]["read_step"]["gb_s"] > 0 and res["rates"]["matmul"]["gflop_s"] > 0
    cfg = preset("tiny", d_ff=48)
    for k, m in res["models"].items():
        model = model_lib.build(preset("tiny", d_ff=48, num_kv_heads=int(k)))
        cache = expected_cache_bytes(model.config, 2, 16, 3, "int8")
        assert m["model"]["bytes"] == decode_floor.step_bytes(model, model.config, 2, cache)["total"]
        assert 0 < m["model"]["roofline_s"] and m["model"]["attention_roofline_s"] < m["model"]["roofline_s"]
        assert m["steps"] == 3 and m["wall_step_s"] > 0 and m["rows"]
        # every op of the body ran once per step: whole ops per step in every group
        assert all(r["ops_per_step"] == pytest.approx(round(r["ops_per_step"])) for r in m["rows"])
        assert sum(r["step_s"] for r in m["rows"]) == pytest.approx(m["ops_step_s"])
        # the step reads every decoder weight and the output layer at least once
        reads = decode_floor.step_reads(model, model.config, 2)["weight_bytes"]
        assert m["bytes_per_step"] >= reads
        head = f"f32[{cfg.vocab_size},{cfg.d_model}]", f"f32[{cfg.d_model},{cfg.vocab_size}]"
        head_rows = [r for r in m["rows"] if r["largest_input"] in head]
        assert any(r["bytes_per_step"] >= cfg.vocab_size * cfg.d_model * 4 for r in head_rows)
