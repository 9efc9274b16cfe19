"""The TPU compiler on this CPU host (libtpu from requirements-test.txt): ``plan --topology`` compiles
a tiny model's train step and decode loop for a v4 slice, and its numbers are the TPU executable's;
bad topologies, a mesh that does not match the slice and libtpu missing are one line each; a CPU
process with libtpu installed does not load it."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

from gqa_jax import backends
from gqa_jax.__main__ import main
from gqa_jax.errors import RunError
from gqa_jax.tools import plan, tpu_topology


def settings(**kw):
    fields = dict(preset="tiny", num_kv_heads=2, mesh="2x2", batch=8, input_len=16, output_len=8,
                  batch_search=(), topology="v4:2x2x1")  # fmt: skip
    return plan.PlanSettings(**{**fields, **kw})


@pytest.fixture(scope="module")
def tpu_plan():
    return plan.plan(settings())


def test_a_tiny_models_train_and_decode_compile_for_a_v4_slice(tpu_plan):
    res = tpu_plan
    assert res["backend"] == "tpu" and res["device_kind"] == "TPU v4"
    assert res["topology"]["name"] == "v4:2x2x1" and res["hbm_gib"] == 32.0  # the v4 chip's HBM
    assert res["mesh"] == {"data": 2, "model": 2}
    for program in ("train", "decode"):
        row = res["programs"][program]
        assert row["memory"]["total"] > 0 and row["fits"]
        assert row["cost"]["flops"] > 0 and row["cost"]["bytes_accessed"] > 0
    assert all(c["ok"] for c in res["checks"]), res["checks"]
    # the TPU pads arrays to its memory tiles: its argument bytes exceed the logical ones
    train_args = [c for c in res["checks"] if c["program"] == "train" and c["what"].startswith("arguments")]
    assert train_args[0]["compiled"] > train_args[0]["expected"] and "TPU" in train_args[0]["what"]


def test_the_tpu_executables_numbers_differ_from_xla_cpus(tpu_plan):
    """The same programs on one CPU device: other temporaries and arguments, the K/V cache the same
    (the CPU's 2 rows of 2 K/V heads; on 2x2 each chip's 4 rows of 1 head)."""
    cpu = plan.plan(settings(mesh="1x1", batch=2, topology=None))
    tpu_one = tpu_plan  # 2x2, batch 8
    assert cpu["backend"] == "cpu" and tpu_one["backend"] == "tpu"
    for program in ("train", "decode"):
        c, t = cpu["programs"][program], tpu_one["programs"][program]
        assert c["memory"]["temp"] != t["memory"]["temp"], program
        assert c["memory"]["argument"] != t["memory"]["argument"], program
    assert cpu["programs"]["decode"]["cache_compiled"] == tpu_one["programs"]["decode"]["cache_compiled"]


def test_bad_topologies_and_a_mismatched_mesh_are_one_line(capsys):
    with pytest.raises(ValueError, match=r"unknown TPU generation 'v9'.*v4, v5e, v5p"):
        tpu_topology.parse_topology("v9:2x2")
    with pytest.raises(ValueError, match=r"'v4-8' is not GENERATION:AxBxC"):
        tpu_topology.parse_topology("v4-8")
    with pytest.raises(ValueError, match=r"a v4 topology has 3 dimensions, AxBxC chips"):
        tpu_topology.parse_topology("v4:2x2")
    with pytest.raises(ValueError, match=r"libtpu does not know the TPU topology 'v4:1x1x1'"):
        tpu_topology.slice_devices("v4:1x1x1")  # smaller than a v4 host
    with pytest.raises(ValueError, match=r"mesh 1x8 has 8 devices but TPU slice v4:2x2x1 has 4 chips"):
        plan.check_settings(settings(mesh="1x8"))
    argv = ["plan", "--topology", "v9:2x2", "--preset", "tiny", "--batch", "8", "--mesh", "2x2"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown TPU generation 'v9'" in err[0]


def test_without_libtpu_the_error_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setattr(tpu_topology, "libtpu_installed", lambda: False)
    tpu_topology.slice_devices.cache_clear()
    with pytest.raises(RunError, match=r"needs libtpu.*pip install -r requirements-tpu.txt"):
        tpu_topology.slice_devices("v5e:2x4")
    assert main(["plan", "--topology", "v5e:2x4", "--preset", "tiny", "--batch", "8", "--mesh", "8x1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install -r requirements-tpu.txt" in err[0]


def test_a_cpu_process_with_libtpu_installed_does_not_load_it(monkeypatch):
    """libtpu is installed here (the tests need it), no TPU is attached: a gqa_jax process starts
    the CPU backend alone, without libtpu's warnings; a platform the user sets is kept (gqa_jax
    leaves JAX's choice unset: checked in this process, whose choice is cleared for it)."""
    code = "import gqa_jax, jax; print(jax.devices()[0].platform, jax.config.jax_platforms)"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["cpu", "cpu"]
    assert "TPU" not in out.stderr and "libtpu" not in out.stderr, out.stderr
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    chosen = jax.config.jax_platforms
    jax.config.update("jax_platforms", None)
    try:
        assert not backends.skip_absent_tpu() and jax.config.jax_platforms is None
    finally:
        jax.config.update("jax_platforms", chosen)


REFUSAL = (
    "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
    "(235.71G) exceeds available HBM (30.75G)."
)


def test_a_program_the_tpu_compiler_refuses_is_a_row_that_does_not_fit(monkeypatch):
    """The TPU compiler refuses a program whose temporaries exceed the chip's HBM (seen: the XXL
    train step without remat on v4:4x4x4): the train row keeps the numbers it names; a refused
    decode loop is one clear error. (The refusal is simulated here; the tiny programs fit.)"""
    from gqa_jax.tools import compiled_memory, plan_report

    over = compiled_memory.over_hbm(RuntimeError(REFUSAL))
    assert over["temp"] == int(235.71 * 2**30) and over["available"] == int(30.75 * 2**30)
    assert compiled_memory.over_hbm(RuntimeError("INTERNAL: something else")) is None

    def refuse(lowered, platform=None):
        raise RuntimeError(REFUSAL)

    monkeypatch.setattr(plan, "compile_lowered", refuse)
    res = plan.plan(settings(mesh="1x1", batch=2, topology=None, programs=("train",)))
    row = res["programs"]["train"]
    assert not row["fits"] and row["refused"] == REFUSAL and row["memory"]["temp"] == over["temp"]
    assert row["memory"]["total"] == row["memory"]["temp"] + row["memory"]["argument"] > 0
    assert res["checks"] == []  # no executable to check
    text = plan_report.report(res)
    assert "NO (refused)" in text and "The TPU compiler refused the train step at batch 2" in text
    with pytest.raises(ValueError, match=r"refused the decode loop at batch 2: RESOURCE_EXHAUSTED"):
        plan.plan(settings(mesh="1x1", batch=2, topology=None, programs=("decode",)))


def test_the_decode_batch_search_passes_over_a_batch_the_compiler_refuses(monkeypatch):
    """Searching the largest decode batch, a batch the TPU compiler refuses (seen: MQA-XXL at
    2048 / 512 on v4:2x2x2, batch 741) is a point that does not fit, not the end of the plan."""
    real = plan.compile_lowered

    def refuse_over_4_rows(lowered, platform=None):
        ids = [a for a in jax.tree.leaves(lowered.args_info) if str(a.dtype) == "int32" and len(a.shape) == 2]
        if ids[0].shape[0] > 4:
            raise RuntimeError(REFUSAL)
        return real(lowered, platform)

    monkeypatch.setattr(plan, "compile_lowered", refuse_over_4_rows)
    s = settings(
        mesh="1x1", batch=2, topology=None, programs=("decode",), batch_search=("decode",), hbm_gib=1.0
    )
    search = plan.plan(s)["programs"]["decode"]["largest_batch"]
    refused = [int(b) for b, total in search["compiled_totals"].items() if int(b) > 4]
    assert refused and all(search["compiled_totals"][str(b)] > 2**30 for b in refused)
    assert 2 <= search["largest_batch"] <= 4


def test_an_8x8_mesh_on_a_64_chip_v4_slice_which_jax_make_mesh_refuses():
    from gqa_jax import sharding

    devices = tpu_topology.slice_devices("v4:4x4x4").devices  # 4x4x4 chips: no axes multiply to 8
    with pytest.raises(NotImplementedError):
        jax.make_mesh((8, 8), sharding.MESH_AXES, devices=devices)
    grid = sharding.device_grid((8, 8), devices)
    assert grid.shape == (8, 8) and sorted(d.id for d in grid.flat) == sorted(d.id for d in devices)
    plan.check_settings(settings(preset="tiny", mesh="8x8", batch=64, topology="v4:4x4x4"))  # builds


def test_the_decode_layout_holds_a_share_of_the_cache_where_heads_only_holds_copies():
    """MQA on a 1x4 mesh of a v4 slice: the decode layout splits the cache's rows over the 4 chips
    (each holds a quarter, compiled as the formula says); ``--cache-layout heads`` keeps the layout
    before it, every chip holding the whole cache (the paper's section 2.2 waste, reported)."""
    rows = {}
    for layout in plan.CACHE_LAYOUTS:
        res = plan.plan(settings(num_kv_heads=1, mesh="1x4", programs=("decode",), cache_layout=layout))
        rows[layout] = res["programs"]["decode"]
    auto, heads = rows["auto"], rows["heads"]
    for kind in ("self", "cross"):
        assert auto["cache_layout"][kind]["shards"] == 4 and heads["cache_layout"][kind]["shards"] == 1
        assert (
            auto["cache_compiled"][kind] == auto["cache_formula"][kind] == heads["cache_compiled"][kind] // 4
        )
        assert "autoregressive" in auto["cache_compiled_specs"][kind]
    assert auto["cache_report"] == "" and "4 copies" in heads["cache_report"]
    with pytest.raises(ValueError, match="--cache-layout 'rows'; choose from auto, heads"):
        plan.check_settings(settings(cache_layout="rows"))
