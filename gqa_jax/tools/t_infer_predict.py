"""``time --predict TOPOLOGY``: T_infer predicted for a TPU slice from its compiler, not measured.

The paper times decoding on 8 TPUv4 chips, the largest batch that fits up to 32 per chip, its
parallelism tuned per model, and reports time per sample per chip. With no TPU attached, the TPU
compiler on this host (``tools.tpu_topology``) compiles the two programs a decode is made of, as a
TPU would run them, for a mesh over the slice's devices:

- the prefill: encoder, every layer's cross-attention K/V projected once into the cache, the empty
  self-attention cache and the loop's state (``decoding.start``). A batch whose encoder logits
  exceed the TPU compiler's limit is encoded in row chunks on a TPU
  (``decode_inputs.prefill_rows``); ``cost_analysis`` counts a loop's body once, so one chunk is
  compiled and its cost scaled by the chunks (the record's ``prefill`` says so);
- one decode step: every row's next token, its K/V written into the cache (``decoding.step``, the
  state donated). A step's shapes do not depend on its position (it attends over the whole
  ``T_max`` cache, masked), so every step costs the same.

Each program's ``cost_analysis()`` gives one device's flops and bytes accessed (the partitioned
program, ``compiled_memory.cost``); the roofline time of a program is
``max(flops / peak, bytes / bandwidth)`` with the chip's documented bf16 peak and HBM bandwidth
(``tpu_topology.CHIPS``). A batch of ``B`` rows then takes ``prefill + T x step`` on every chip at
once, and the time per sample per chip (the paper's unit) is that time x chips / ``B``; both rules,
and the record written to ``DIR/timing.json``, are ``gqa_jax.timing``'s.

The batch: given, or ``auto``, the paper's rule: the largest multiple of the mesh's data axis, at
most 32 per chip, whose whole decode loop (``plan``'s decode program on that mesh, what
``greedy_decode`` runs, its prefill chunked where the TPU needs it) fits the chip's HBM; a loop
the compiler refuses does not fit. One compile
at the cap when it fits, else the plan's batch search (``batch_search``: memory is affine in the
batch). The prefill and step alone hold less than the loop (its carry, the tokens), so they are
compiled for their cost only, at the chosen batch. The mesh: given (``DATAxMODEL``, every chip),
or ``auto``, the paper's "parallelism tuned per model": every ``DATA x MODEL`` split of the chips,
each at its own batch, and the fastest kept (all of them in the record).

What a roofline leaves out (docs/experiments.md): the time ops wait on each other or on
collectives between chips (``cost_analysis`` counts neither the links' bandwidth nor latency),
kernels below peak, the host's dispatch, and that XLA counts bytes per op (fusion), an upper
bound of what crosses HBM when operands stay in on-chip memory.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from gqa_jax import beam_search, decode_inputs, decoding, training
from gqa_jax import cache as kvcache
from gqa_jax import model as model_lib
from gqa_jax import sharding as sharding_lib
from gqa_jax.config import ModelConfig
from gqa_jax.timing import TIMING_FILE, MeshRow, Prediction, Roofline, TimingRecord, per_sample_per_chip
from gqa_jax.tools import loop_hlo, plan, t_infer, tpu_topology
from gqa_jax.tools.batch_search import search_batch
from gqa_jax.tools.bench_models import NEVER_EOS
from gqa_jax.tools.compiled_memory import (
    GIB,
    compile_lowered,
    cost,
    device_bytes,
    memory,
    over_hbm,
    with_shardings,
)
from gqa_jax.tools.measurement import machine_info

RULE_AUTO = f"largest whose decode loop fits the chip, <= {t_infer.PER_DEVICE} per chip"
T5X_ALPHA = 0.6  # T5X's beam search's default length penalty (``beam_search(alpha=0.6)``)
MESH_AUTO = "auto"
WEIGHTS = "none: compiled shapes only"


def meshes(chips: int) -> list[str]:
    """Every ``DATAxMODEL`` split of ``chips`` devices, the most data-parallel first."""
    return [f"{chips // m}x{m}" for m in range(1, chips + 1) if chips % m == 0]


# ----------------------------------------------------------------------------- the programs
@dataclasses.dataclass
class _Mesh:
    """One mesh of the slice and its abstract parameters (shapes and shardings only)."""

    name: str
    config: ModelConfig
    mesh: Any
    data: int
    graphdef: Any
    params: Any
    # (batch, hoisted) -> programs
    compiled: dict[tuple[int, bool], dict[str, Any]] = dataclasses.field(default_factory=dict)
    loops: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)  # batch -> the loop's memory
    cache_mesh: Any = None  # the mesh the programs lay the cache out on (None: ``mesh``, the decode layout)

    @property
    def program_mesh(self) -> Any:
        return self.mesh if self.cache_mesh is None else self.cache_mesh


def _setup(config: ModelConfig, tpu: tpu_topology.TpuSlice, name: str, cache_layout: str = "auto") -> _Mesh:
    mesh = sharding_lib.make_mesh(name, devices=tpu.devices)
    graphdef, params = training.split_model(model_lib.abstract(config))
    shardings, _ = sharding_lib.param_shardings(params, mesh)
    m = _Mesh(name, config, mesh, mesh.shape["data"], graphdef, with_shardings(params, shardings))
    if cache_layout == "heads":  # the cache's K/V heads over the model axis alone, as plan's
        m.cache_mesh = sharding_lib.heads_only(mesh)
    return m


def _compile(lowered: Any) -> tuple[Any, dict[str, Any] | None]:
    """The TPU executable, or None and the compiler's refusal of a program over the chip's HBM."""
    try:
        return compile_lowered(lowered, "tpu"), None
    except Exception as err:
        if (over := over_hbm(err)) is None:
            raise
        return None, over


def compile_programs(m: _Mesh, batch: int, s: t_infer.TimeSettings, hoisted: bool = False) -> dict[str, Any]:
    """Compile the prefill and one decode step at ``batch`` rows on ``m``: their memory and cost.
    A prefill the TPU encodes in row chunks (``decode_inputs.prefill_rows``: the compiler's limit on
    the encoder's logits; a loop's body is counted once by ``cost_analysis``) is compiled for one
    chunk and its cost scaled by the chunks (``rows``, ``chunks`` and ``scaled`` say so; its memory
    is the chunk's); the step is compiled at ``batch``, on the state the chunks fill. A program the
    compiler refuses has ``refused`` (and the temporaries it named) and no cost. ``hoisted``: the
    paper's decode, whose compiled loop moved the per-step cross K/V projection out of its body
    (:func:`loop_memory`): the programs are those the loop runs, the projection in the prefill once and
    its results carried as a cross cache; ``step_in_loop`` is the step as written, projecting them."""
    if (batch, hoisted) in m.compiled:
        return m.compiled[batch, hoisted]
    rows = decode_inputs.prefill_rows(m.config, batch, s.input_len, m.mesh) or batch
    replicated = NamedSharding(m.mesh, PartitionSpec())
    ids = jax.ShapeDtypeStruct((rows, s.input_len), jnp.int32, sharding=sharding_lib.batch_sharding(m.mesh))
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    # greedy, EOS never ends a row: every step costs the same (the decode loop's programs, its kernel)
    asked = decoding.decode_config(
        s.output_len, mesh=m.mesh, eos_id=NEVER_EOS, cache_dtype=s.cache_dtype, decode=s.decode
    )
    config = dataclasses.replace(asked, cross_recompute=False) if hoisted else asked
    out: dict[str, Any] = {"batch": batch}
    start = time.perf_counter()
    compiled, refused = _compile(
        decoding.start.lower(m.graphdef, m.params, ids, key, config=config, mesh=m.program_mesh)
    )
    out["prefill"] = _program(compiled, refused, time.perf_counter() - start)
    if rows < batch and compiled is not None:
        chunks = batch // rows
        out["prefill"]["cost"] = {k: v * chunks for k, v in out["prefill"]["cost"].items()}
        out["prefill"] |= {
            "rows": rows,
            "chunks": chunks,
            "scaled": f"one chunk of {rows} rows, cost x {chunks}",
        }
    if compiled is None:
        out["step"] = {"refused": "not compiled: the prefill was refused", "total": out["prefill"]["total"]}
    else:
        state = jax.tree.map(lambda a: _rows_of(a, rows, batch), compiled.out_info)
        if s.beam_search:  # T5X's default decode: the search's first state, one beam per row
            state = _beam_state(state, s)
        out["step"] = _compile_step(m, state, config, s.beam_search)
        if hoisted:
            out["step_in_loop"] = _compile_step(m, _encoded_state(m, state, s), asked, s.beam_search)
    out["total"] = max(out["prefill"]["total"], out["step"]["total"])
    m.compiled[batch, hoisted] = out
    return out


def _compile_step(m: _Mesh, state: Any, config: Any, beams: bool = False) -> dict[str, Any]:
    """One decode step (``decoding.step``, or with ``beams`` a step of the beam search,
    ``beam_search.step``; the state donated) on the abstract ``state``: its program."""
    start = time.perf_counter()
    weights = decoding.step_weights(m.graphdef, m.params, config)  # as they are: a TPU's kernel is "einsum"
    if beams:
        lowered = beam_search.step.lower(
            m.graphdef, weights, state, config=config, alpha=T5X_ALPHA, mesh=m.program_mesh
        )
    else:
        temperature = jax.ShapeDtypeStruct((), jnp.float32, sharding=NamedSharding(m.mesh, PartitionSpec()))
        lowered = decoding.step.lower(
            m.graphdef, weights, state, temperature, config=config, mesh=m.program_mesh
        )
    compiled, refused = _compile(lowered)
    return _program(compiled, refused, time.perf_counter() - start)


def _beam_state(state: Any, s: t_infer.TimeSettings) -> Any:
    """The beam search's first state of one beam per row (``beam_search.initial_state``) from the
    prefill's abstract ``state``, at the shardings the TPU compiler gives it."""
    first = jax.jit(beam_search.initial_state, static_argnames=("beam_size", "max_decode_len"))
    lowered = first.lower(state.cache, beam_size=1, max_decode_len=s.output_len)
    return compile_lowered(lowered, "tpu").out_info


def _encoded_state(m: _Mesh, state: Any, s: t_infer.TimeSettings) -> Any:
    """A decode state with a cross cache as the paper's decode holds it instead: no cross K/V, the
    encoder output ``[B, S, D]`` (rows over ``data``, as the encoder leaves it)."""
    batch = state.cache.cross_mask.shape[0]
    rows = NamedSharding(m.mesh, PartitionSpec(sharding_lib.RULES["batch"], None, None))
    encoded = jax.ShapeDtypeStruct((batch, s.input_len, m.config.d_model), m.config.dtype, sharding=rows)
    return state.replace(cache=state.cache.replace(cross_k=(), cross_v=(), encoded=encoded))


def loop_memory(m: _Mesh, s: t_infer.TimeSettings, batch: int) -> dict[str, Any]:
    """The whole decode loop's memory per chip at ``batch`` (``plan``'s decode program on the same
    mesh: what ``greedy_decode`` runs), the fit the paper's batch rule asks for."""
    if batch not in m.loops:
        settings = plan.PlanSettings(
            preset=s.preset, num_kv_heads=m.config.num_kv_heads, mesh=m.name, batch=batch,
            input_len=s.input_len, output_len=s.output_len, dtype=s.dtype, cache_dtype=s.cache_dtype,
            programs=("decode",), batch_search=(), topology=s.predict, decode=s.decode,
            cache_layout=s.cache_layout,
        )  # fmt: skip
        start = time.perf_counter()
        try:
            row = plan.plan(settings)["programs"]["decode"]
            m.loops[batch] = {"total": row["memory"]["total"], "compile_s": row["compile_s"]}
            if "cross_kv_projection" in row:  # the paper's decode: where the loop has its projection
                m.loops[batch]["cross_kv_projection"] = row["cross_kv_projection"]["placement"]
        except ValueError as err:  # the compiler refused the loop over the chip's HBM
            if (over := over_hbm(err)) is None:
                raise
            # the temporaries it named plus the parameters: a lower bound the batch search fits a line to
            total = over["temp"] + device_bytes(m.params)
            m.loops[batch] = {"total": total, "refused": str(err), "compile_s": time.perf_counter() - start}
    return m.loops[batch]


_PROGRAMS = ("prefill", "step", "step_in_loop")  # what compile_programs compiles
_CHUNKED = ("memory", "rows", "chunks", "scaled")  # what the record keeps of a prefill beside its roofline


def _rows_of(info: Any, rows: int, batch: int) -> jax.ShapeDtypeStruct:
    """A compiled output of ``rows`` rows (the prefill's state: every array but the scalars leads
    with the rows) as the same array of ``batch`` rows, at the same sharding."""
    shape = tuple(info.shape)
    if shape and shape[0] == rows:
        shape = (batch, *shape[1:])
    return jax.ShapeDtypeStruct(shape, info.dtype, sharding=info.sharding)


def _program(compiled: Any, refused: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    if compiled is None:
        assert refused is not None
        return {"refused": refused["message"], "total": refused["temp"], "compile_s": seconds}
    mem = memory(compiled)
    return {"memory": mem, "total": mem["total"], "cost": cost(compiled), "compile_s": seconds}


# ----------------------------------------------------------------------------- one mesh
def _largest_batch(
    m: _Mesh, s: t_infer.TimeSettings, cap: int, chips: int, limit: int, log
) -> tuple[int, str]:
    """The paper's batch on ``m``: the cap when its whole decode loop fits, else the batch search's
    in whole rows per chip (0: none fits), so the cache's rows split evenly over ``data`` x
    ``autoregressive`` and a chunked prefill's chunks are not single rows (a prime batch's would
    be). A batch whose encoder would exceed the compiler's limit is compiled as the TPU runs it, its
    prefill in row chunks."""

    def loop_bytes(batch: int) -> int:
        log(f"  mesh {m.name}: compiling the decode loop at batch {batch} for its memory ...")
        total = loop_memory(m, s, batch)["total"]
        log(f"    {total / GIB:.2f} GiB per chip")
        return total

    if loop_bytes(cap) <= limit:
        return cap, f"{cap} fits"
    found = search_batch(loop_bytes, cap, chips, limit, log)  # whole rows per chip: chunks and shards even
    return min(found["largest_batch"], cap), found["how"]


def predict_mesh(m: _Mesh, s: t_infer.TimeSettings, tpu: tpu_topology.TpuSlice, limit: int, log) -> MeshRow:
    """The prediction on one mesh: its batch, the two programs' rooflines and the time per sample."""
    cap = t_infer.PER_DEVICE * tpu.chips // m.data * m.data  # <= 32 per chip, rows split over data
    if s.batch == "auto":
        batch, how = _largest_batch(m, s, cap, tpu.chips, limit, log)
    elif s.batch % m.data:
        why = f"batch {s.batch} does not split over the data axis {m.data}"
        return MeshRow(mesh=m.name, batch=s.batch, fits=False, why=why)
    else:
        batch, how = s.batch, t_infer.RULE_GIVEN
    if not batch:
        return MeshRow(mesh=m.name, batch=0, fits=False, why=f"no batch fits: {how}")
    loop = loop_memory(m, s, batch)
    if "refused" in loop:
        return MeshRow(mesh=m.name, batch=batch, fits=False, why=loop["refused"])
    placement = loop.get("cross_kv_projection")  # the paper's decode: in its compiled loop, or hoisted
    programs = compile_programs(m, batch, s, hoisted=placement == loop_hlo.HOISTED)
    layout, _ = kvcache.cache_layout(
        m.config, m.program_mesh, batch, s.input_len, s.output_len, s.cache_dtype or s.dtype
    )
    row = MeshRow(
        mesh=m.name, batch=batch, how=how, loop_total_bytes=loop["total"],
        cache_specs={kind: str(layout[kind]["spec"]) for kind in layout},  # the decode layout's
        fits=loop["total"] <= limit, cross_kv_projection=placement,
    )  # fmt: skip
    refused = [k for k in ("prefill", "step") if "refused" in programs[k]]
    if refused:
        why = f"the compiler refused the {refused[0]}: {programs[refused[0]]['refused']}"
        return dataclasses.replace(row, fits=False, why=why)
    chip = dataclasses.asdict(tpu.chip)
    prefill = Roofline.of(
        programs["prefill"]["cost"], chip, **{k: v for k, v in programs["prefill"].items() if k in _CHUNKED}
    )
    step = Roofline.of(programs["step"]["cost"], chip, memory=programs["step"]["memory"])
    in_loop = programs.get("step_in_loop", {})
    in_loop = Roofline.of(in_loop["cost"], chip, memory=in_loop["memory"]) if "cost" in in_loop else None
    wall = prefill.s + s.output_len * step.s
    return dataclasses.replace(
        row,
        prefill=prefill,
        step=step,
        step_in_loop=in_loop,
        batch_s=wall,
        time_per_sample_s=per_sample_per_chip(wall, tpu.chips, batch),
        prefill_per_sample_s=per_sample_per_chip(prefill.s, tpu.chips, batch),
        compile_s=sum(p[k].get("compile_s", 0.0) for p in m.compiled.values() for k in _PROGRAMS if k in p)
        + sum(x["compile_s"] for x in m.loops.values()),
    )


# ----------------------------------------------------------------------------- the stage
def check_settings(s: t_infer.TimeSettings) -> tpu_topology.TpuSlice:
    """Everything ``time --predict`` can check before it compiles: one clear error each."""
    if s.model is not None:
        raise ValueError(
            "--predict compiles a preset's shapes, so weights do not change it: give --preset P "
            "(with --num-kv-heads K) instead of --model"
        )
    t_infer.check_settings(dataclasses.replace(s, batch="auto"))  # the batch is checked per mesh
    if s.cache_layout not in plan.CACHE_LAYOUTS:
        raise ValueError(f"--cache-layout {s.cache_layout!r}; choose from {', '.join(plan.CACHE_LAYOUTS)}")
    _, shape = tpu_topology.parse_topology(s.predict)  # the name alone: before libtpu loads
    chips = math.prod(shape)
    if s.mesh != MESH_AUTO:
        data, model = sharding_lib.parse_mesh_shape(s.mesh)
        if data * model != chips:
            raise ValueError(
                f"--mesh {s.mesh} has {data * model} devices but TPU slice {s.predict} has {chips} "
                f"chips: give DATAxMODEL with DATA x MODEL = {chips} or auto (every split)"
            )
        if s.batch != "auto" and s.batch % data:
            raise ValueError(f"--batch {s.batch} does not split over mesh {s.mesh}'s data axis {data}")
    return tpu_topology.slice_devices(s.predict)


def predict_t_infer(s: t_infer.TimeSettings, log: Callable[[str], None] = lambda m: None) -> TimingRecord:
    """Predict T_infer as the module docstring says; write and return ``timing.json``'s record."""
    tpu = check_settings(s)
    out = t_infer.check_workdir(s.workdir, s.overwrite)
    start = time.perf_counter()
    config = t_infer.model_config(s)
    hbm = s.hbm_gib if s.hbm_gib is not None else tpu.chip.hbm_gib
    limit = int(hbm * GIB)
    names = meshes(tpu.chips) if s.mesh == MESH_AUTO else [s.mesh]
    log(
        f"predicting T_infer of {s.preset} K={config.num_kv_heads} on TPU {tpu.name} ({tpu.chips} x "
        f"{tpu.chip.device_kind}, {hbm:g} GiB each), input {s.input_len}, output {s.output_len}, "
        f"KV cache {s.cache_dtype or s.dtype}, mesh {', '.join(names)}"
    )
    rows = []
    for name in names:
        row = predict_mesh(_setup(config, tpu, name, s.cache_layout), s, tpu, limit, log)
        rows.append(row)
        if row.time_per_sample_s is not None:
            log(f"  mesh {name}: batch {row.batch}, {row.time_per_sample_s:.4g} s per sample per chip")
        else:
            log(f"  mesh {name}: {row.why}")
    fitting = [r for r in rows if r.fits and r.time_per_sample_s is not None]
    if not fitting:
        raise ValueError(
            f"no mesh of TPU slice {tpu.name} holds {s.preset} K={config.num_kv_heads} at input "
            f"{s.input_len}, output {s.output_len} in {hbm:g} GiB per chip: "
            + "; ".join(f"{r.mesh}: {r.why if r.why is not None else 'over the HBM'}" for r in rows)
            + " (try a larger slice, --cache-dtype int8 or shorter lengths)"
        )
    best = min(fitting, key=lambda r: r.time_per_sample_s)
    prediction = Prediction(
        topology=tpu.name, chips=tpu.chips, chip=dataclasses.asdict(tpu.chip), hbm_gib=hbm, mesh=best.mesh,
        unit="seconds per sample per chip: (prefill + output_len x step) x chips / batch",
        meshes=tuple(rows), wall_s=time.perf_counter() - start,
    )  # fmt: skip
    record = _record(s, config, best, prediction)
    t_infer.write_record(record, out)
    return record


def _record(
    s: t_infer.TimeSettings, config: ModelConfig, best: MeshRow, prediction: Prediction
) -> TimingRecord:
    """The timing record of the fastest mesh ``best``: its times, no repeats (nothing was run)."""
    return TimingRecord(
        time_per_sample_s=best.time_per_sample_s,
        times_s=(),
        prefill_per_sample_s=best.prefill_per_sample_s,
        prefill_times_s=(),
        steps_per_sample_s=best.time_per_sample_s - best.prefill_per_sample_s,
        batch=best.batch,
        batch_rule=RULE_AUTO if s.batch == "auto" else t_infer.RULE_GIVEN,
        input_len=s.input_len,
        output_len=s.output_len,
        preset=s.preset,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        dtype=s.dtype,
        cache_dtype=s.cache_dtype or s.dtype,
        decode=t_infer.record_decode(s.decode),
        beams=1 if s.beam_search else None,
        weights=WEIGHTS,
        machine=machine_info(),
        prediction=prediction,
    )


def summary(record: TimingRecord, workdir: str) -> str:
    """One line: what was predicted, the time per sample per chip, and where the record went."""
    r, p = record, record.prediction
    best = p.chosen
    return (
        f"time (predicted for TPU {p.topology}, {p.chips} x {p.chip['device_kind']}; not measured): "
        f"{r.preset} K={r.num_kv_heads} of N={r.num_heads}, {r.dtype}"
        + (f", KV cache {r.cache_dtype}" if r.cache_dtype != r.dtype else "")
        + (f", decode {r.decode} (the paper's, an instrument)" if r.decode else "")
        + (", beam search of one beam (T5X's default)" if r.beams else "")
        + (f", cache {best.cache_specs['self']}" if best.cache_specs else "")
        + (f"; its cross K/V projection {best.cross_kv_projection}" if best.cross_kv_projection else "")
        + f", mesh {p.mesh}, batch {r.batch}, input {r.input_len}, output {r.output_len}: "
        f"{r.time_per_sample_s * 1e3:.3f} ms per sample per chip (prefill "
        f"{r.prefill_per_sample_s * 1e3:.3f} ms, {best.prefill.bound}-bound; decoder steps "
        f"{r.steps_per_sample_s * 1e3:.3f} ms, {best.step.bound}-bound) -> "
        f"{Path(workdir).expanduser() / TIMING_FILE}"
    )
