"""``python -m gqa_jax plan``: per-device memory of the sharded train step and the greedy decode
loop, compiled ahead of time on abstract shapes (no weights are allocated).

Both programs are built exactly as a run builds them: the train step is
``training.make_train_step`` with ``mesh=`` and the ``TrainState`` shardings of the rule table
(``training.state_shardings``): the batch rows over ``data``, the state donated, traced inside
``sharding.activation_sharding``; the decode loop is ``decoding.prefill_and_decode`` (greedy, prefill
included) with ``mesh=``. Their inputs are
``jax.ShapeDtypeStruct``s carrying those shardings; ``jax.jit(...).lower(...).compile()`` then
gives ``memory_analysis()``, which for an SPMD-partitioned program counts ONE device's buffers.

Per device, for each program:

  params, optimizer state  exact: every leaf's bytes divided by its shards (a dimension the mesh
                           axis does not divide is replicated, not divided), summed. With the batch
                           inputs they add up to the executable's argument size (checked).
  KV cache (formula)       ``cache.cache_layout``: ``cache.expected_cache_bytes / shards``, where a
                           K/V-head axis that ``model`` does not divide is held whole by every device.
  KV cache (compiled)      the decode executable's output cache arrays, at the shardings the
                           compiler gave them (checked against the formula).
  temporaries              ``memory_analysis().temp_size_in_bytes`` (activations, gradients, the
                           optimizer's intermediates, the loop's working buffers).
  total                    argument + output - alias (donated buffers reused) + temporaries +
                           generated code: everything the executable holds at once, an upper bound
                           of its peak.

The largest batch that fits ``--hbm-gib``: per device, memory is affine in the batch (params and
optimizer state fixed; activations, gradients' batch-shaped parts and the cache grow with the rows).
The plan compiles at the requested batch and at the smallest one (the data-axis size, times the
micro-batches for training), fits the line, predicts the largest multiple of that size that fits,
and verifies it by compiling at that batch and the next multiple (when they disagree, it refits
between the compiled batches either side of the limit, at most ``MAX_REFITS`` times). When
nothing fits, the smallest batch's compile is the verification. The report says which batches
were compiled and how long each took.

The numbers are XLA's buffer assignment on the backend the plan runs on. On CPU (the default here,
with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` to simulate N devices) the fusion,
scheduling and layouts differ from TPU / GPU, so temporaries are indicative; params, optimizer
state and the cache are exact everywhere. XLA:CPU computes bfloat16 matmuls in float32, which
makes float32 copies of their bfloat16 operands: the plan keeps these per decode step rather than
hoisted out of the loop (``compiled_memory.CPU_COMPILE_OPTIONS``), but the train step's
temporaries on CPU still hold some float32 where a TPU holds bfloat16. Run the same command on
the target machine for its compiler's numbers, or give ``topology`` (``--topology v4:2x4x4``):
the mesh is then built over that TPU slice's devices (``tools.tpu_topology``: libtpu on this
host, no TPU attached) and the TPU compiler compiles the programs; its executable pads arguments
and outputs to the chip's memory tiles (``checks`` allow for it).

``decode`` (``--decode paper``): the decode loop as the paper's code ran it (an instrument,
``config.PAPER_SWITCHES``); its optimized HLO then says where the compiler put the per-step cross
K/V projection (in the loop or hoisted) and the one-hot cache write (``tools.loop_hlo``).

The measuring side is ``tools.compiled_memory``, the batch search ``tools.batch_search``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from gqa_jax import cache as kvcache
from gqa_jax import decode_inputs, decoding, kv_quant, training
from gqa_jax import model as model_lib
from gqa_jax import sharding as sharding_lib
from gqa_jax.cache import ONE_HOT_SCOPE
from gqa_jax.config import OUR_DECODE, ModelConfig, decode_switches, preset
from gqa_jax.model import CROSS_RECOMPUTE_SCOPE, EOS_ID
from gqa_jax.tools import loop_hlo, tpu_topology
from gqa_jax.tools.batch_search import search_batch
from gqa_jax.tools.compiled_memory import (
    GIB,
    argument_bytes,
    compile_lowered,
    cost,
    device_bytes,
    memory,
    over_hbm,
    with_shardings,
)

DEFAULT_HBM_GIB = 32.0  # TPU v4, the paper's chip (v5p: 95, H100: 80)
PROGRAMS = ("train", "decode")


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    preset: str
    num_kv_heads: int | None
    mesh: str
    batch: int
    input_len: int
    output_len: int
    hbm_gib: float | None = None  # None: the TPU chip's with ``topology``, else DEFAULT_HBM_GIB
    dtype: str = "bfloat16"  # activations; the decode params and the KV cache
    cache_dtype: str | None = None  # the decode loop's KV cache (None: dtype; int8 / fp8: kv_quant)
    cache_layout: str = "auto"  # the decode layout (docs/sharding.md), or "heads": K/V heads over model only
    param_dtype: str = "float32"  # the train step's params (and so its optimizer state)
    num_microbatches: int = 1
    remat: str = "none"  # the train step's rematerialization policy (ModelConfig.remat)
    fsdp: bool = False  # the train state also split over data (sharding.FSDP_RULES)
    scan_layers: bool = False  # the train step's layers as one lax.scan (ModelConfig.scan_layers)
    programs: tuple[str, ...] = PROGRAMS
    batch_search: tuple[str, ...] = PROGRAMS  # programs whose largest fitting batch is searched
    topology: str | None = None  # a TPU slice (tools.tpu_topology): its devices and compiler, not this host's
    decode: str = OUR_DECODE  # the decode loop's: ours, or the paper's decode (config.decode_switches)


CACHE_LAYOUTS = (
    "auto",
    "heads",
)  # the decode layout, or the K/V heads over model alone (replicated where K < model)


# ------------------------------------------------------------------------------- the setup
@dataclasses.dataclass
class _Setup:
    """Everything both programs need, built once (abstract: shapes and shardings only)."""

    settings: PlanSettings
    train_config: ModelConfig
    decode_config: ModelConfig
    mesh: Any
    data: int
    hbm_gib: float = DEFAULT_HBM_GIB
    tpu: Any = None  # tpu_topology.TpuSlice with --topology
    optimizer: Any = None
    rules: Any = None  # the train step's rule table
    train_graphdef: Any = None
    train_state: Any = None  # abstract TrainState with shardings
    state_shardings: Any = None
    decode_graphdef: Any = None
    decode_params: Any = None  # abstract params (model dtype) with shardings
    param_replicated: list = dataclasses.field(default_factory=list)


def check_settings(settings: PlanSettings) -> tuple[ModelConfig, ModelConfig, Any]:
    """Configs and mesh, with clear errors before anything slow happens."""
    unknown = [p for p in (*settings.programs, *settings.batch_search) if p not in PROGRAMS]
    if unknown:
        raise ValueError(f"unknown program(s) {unknown}; choose from {', '.join(PROGRAMS)}")
    if not settings.programs:
        raise ValueError("nothing to plan: give at least one program (train, decode)")
    if settings.hbm_gib is not None and not settings.hbm_gib > 0:
        raise ValueError(f"--hbm-gib must be positive, got {settings.hbm_gib}")
    for name in ("batch", "input_len", "output_len", "num_microbatches"):
        value = getattr(settings, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    kv_quant.check_cache_dtype(settings.cache_dtype)
    decode_switches(settings.decode)
    if settings.cache_layout not in CACHE_LAYOUTS:
        raise ValueError(f"--cache-layout {settings.cache_layout!r}; choose from {', '.join(CACHE_LAYOUTS)}")
    overrides: dict[str, Any] = {
        "dtype": settings.dtype,
        "param_dtype": settings.param_dtype,
        "remat": settings.remat,
        "scan_layers": settings.scan_layers,
    }
    if settings.num_kv_heads is not None:
        overrides["num_kv_heads"] = settings.num_kv_heads
    train_config = preset(settings.preset, **overrides)
    decode_config = train_config.replace(param_dtype=settings.dtype, remat="none", scan_layers=False)
    mesh = _mesh(settings)
    data = mesh.shape["data"]
    if settings.batch % data:
        raise ValueError(
            f"batch {settings.batch} is not divisible by the data axis size {data} of mesh {settings.mesh}: "
            f"choose a multiple of {data}"
        )
    rows = data * settings.num_microbatches
    if "train" in settings.programs and settings.batch % rows:
        raise ValueError(
            f"batch {settings.batch} is not divisible by data axis {data} x num_microbatches "
            f"{settings.num_microbatches} = {rows}: each micro-batch's rows must split over the data axis"
        )
    return train_config, decode_config, mesh


def _mesh(settings: PlanSettings) -> Any:
    """This host's devices, or with ``topology`` the TPU slice's (the mesh must hold all of them)."""
    if settings.topology is None:
        return sharding_lib.make_mesh(settings.mesh)
    tpu = tpu_topology.slice_devices(settings.topology)
    data, model = sharding_lib.parse_mesh_shape(settings.mesh)
    if data * model != tpu.chips:
        raise ValueError(
            f"mesh {settings.mesh} has {data * model} devices but TPU slice {tpu.name} has {tpu.chips} "
            f"chips: give --mesh DATAxMODEL with DATA x MODEL = {tpu.chips} (e.g. {tpu.chips}x1)"
        )
    return sharding_lib.make_mesh(settings.mesh, devices=tpu.devices)


def _setup(settings: PlanSettings) -> _Setup:
    train_config, decode_config, mesh = check_settings(settings)
    s = _Setup(settings, train_config, decode_config, mesh, mesh.shape["data"])
    if settings.topology is not None:
        s.tpu = tpu_topology.slice_devices(settings.topology)
    chip_hbm = s.tpu.chip.hbm_gib if s.tpu is not None else DEFAULT_HBM_GIB
    s.hbm_gib = settings.hbm_gib if settings.hbm_gib is not None else chip_hbm
    if "train" in settings.programs:
        s.optimizer = training.make_optimizer(training.OptimizerConfig())
        s.rules = sharding_lib.train_rules(settings.fsdp, train_config.d_model, mesh)
        s.train_graphdef, _ = training.split_model(model_lib.abstract(train_config))
        abstract = jax.eval_shape(lambda: training.init_state(model_lib.build(train_config), s.optimizer, 0))
        s.state_shardings = training.state_shardings(abstract, mesh, s.rules)
        s.train_state = with_shardings(abstract, s.state_shardings)
        _, s.param_replicated = sharding_lib.param_shardings(abstract.params, mesh, s.rules)
    if "decode" in settings.programs:
        s.decode_graphdef, params = training.split_model(model_lib.abstract(decode_config))
        shardings, replicated = sharding_lib.param_shardings(params, mesh)
        s.decode_params = with_shardings(params, shardings)
        if not s.param_replicated:
            s.param_replicated = replicated
    return s


# ------------------------------------------------------------------------------- programs
def train_batch(setup: _Setup, batch: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The train step's abstract batch (the features of ``bench_train.synthetic_batch``)."""
    s = setup.settings
    rows = sharding_lib.batch_sharding(setup.mesh)
    features = (
        ("encoder_input_tokens", s.input_len, jnp.int32),
        ("decoder_input_tokens", s.output_len, jnp.int32),
        ("decoder_target_tokens", s.output_len, jnp.int32),
        ("decoder_loss_weights", s.output_len, jnp.float32),
    )
    return {k: jax.ShapeDtypeStruct((batch, n), dt, sharding=rows) for k, n, dt in features}


def compile_train(setup: _Setup, batch: int) -> dict[str, Any]:
    """Lower and compile the sharded train step at ``batch`` rows; its memory per device."""
    jitted = training.make_train_step(
        setup.train_graphdef, setup.optimizer, mesh=setup.mesh, state_shardings=setup.state_shardings,
        num_microbatches=setup.settings.num_microbatches, dropout=False, rules=setup.rules,
    )  # fmt: skip
    inputs = train_batch(setup, batch)
    start = time.perf_counter()
    state = setup.train_state
    try:
        compiled = compile_lowered(jitted.lower(state, inputs), _platform(setup.mesh))
    except Exception as err:  # the TPU compiler refuses a program over the chip's HBM
        if (over := over_hbm(err)) is None:
            raise
        parts = {
            "inputs_bytes": device_bytes(inputs),
            "params_bytes": device_bytes(state.params),
            "optimizer_bytes": device_bytes(state.opt_state),
            "other_state_bytes": device_bytes((state.step, state.rng)),
        }
        return _refused(batch, time.perf_counter() - start, parts, over)
    seconds = time.perf_counter() - start
    return {
        "batch": batch,
        "compile_s": seconds,
        "memory": memory(compiled),
        "cost": cost(compiled),
        "arguments_bytes": argument_bytes(compiled, (state, inputs)),
        "outputs_bytes": device_bytes(compiled.out_info),
        "num_outputs": len(jax.tree.leaves(compiled.out_info)),
        "inputs_bytes": device_bytes(inputs),
        "params_bytes": device_bytes(state.params),
        "optimizer_bytes": device_bytes(state.opt_state),
        "other_state_bytes": device_bytes((state.step, state.rng)),
    }


def _refused(batch: int, seconds: float, parts: dict[str, int], over: dict[str, Any]) -> dict[str, Any]:
    """A program the TPU compiler refused: its logical arguments (``parts``: inputs, params,
    optimizer and other state) and the temporaries the compiler named (total = their sum, a lower
    bound); no executable, so no outputs or cost."""
    argument = sum(parts.values())
    mem = {"argument": argument, "output": 0, "alias": 0, "temp": over["temp"], "generated_code": 0}
    return {
        "batch": batch,
        "compile_s": seconds,
        "memory": {**mem, "host": 0, "total": argument + over["temp"]},
        "cost": {"flops": 0.0, "bytes_accessed": 0.0},
        "arguments_bytes": {"all": argument, "kept": argument},
        "outputs_bytes": 0,
        "num_outputs": 0,
        **parts,
        "refused": over["message"],
    }


def compile_decode(setup: _Setup, batch: int) -> dict[str, Any]:
    """Lower and compile the greedy decode loop (prefill + ``output_len`` steps) at ``batch`` rows
    (its cache on ``cache_layout``'s layout)."""
    mesh, s = setup.mesh, setup.settings
    cache_mesh = sharding_lib.heads_only(mesh) if s.cache_layout == "heads" else mesh
    replicated = NamedSharding(mesh, PartitionSpec())
    ids = jax.ShapeDtypeStruct((batch, s.input_len), jnp.int32, sharding=sharding_lib.batch_sharding(mesh))
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    temperature = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)
    rows = decode_inputs.prefill_rows(setup.decode_config, batch, s.input_len, mesh)  # a TPU's chunks
    start = time.perf_counter()
    config = decoding.decode_config(
        s.output_len, mesh=mesh, eos_id=EOS_ID, cache_dtype=s.cache_dtype, prefill_rows=rows, decode=s.decode
    )
    lowered = decoding.prefill_and_decode.lower(
        setup.decode_graphdef, setup.decode_params, ids, key, temperature, config=config, mesh=cache_mesh,
        rules=None,
    )  # fmt: skip
    try:
        compiled = compile_lowered(lowered, _platform(setup.mesh))
    except Exception as err:
        if (over := over_hbm(err)) is None:
            raise
        parts = {
            "inputs_bytes": device_bytes((ids, key, temperature)),
            "params_bytes": device_bytes(setup.decode_params),
        }
        return _refused(
            batch, time.perf_counter() - start, parts | {"optimizer_bytes": 0, "other_state_bytes": 0}, over
        )
    seconds = time.perf_counter() - start
    cache = compiled.out_info.cache  # the final DecodeState's cache, at the compiler's shardings
    self_bytes = device_bytes((cache.self_k, cache.self_v))
    cross_bytes = device_bytes((cache.cross_k, cache.cross_v))
    layout, replicated_cache = kvcache.cache_layout(
        setup.decode_config, cache_mesh, batch, s.input_len, s.output_len, s.cache_dtype or s.dtype,
        cross=not config.cross_recompute,
    )  # fmt: skip
    return {
        "batch": batch,
        "prefill_rows": rows,  # None: the encoder took the whole batch at once
        "compile_s": seconds,
        "memory": memory(compiled),
        "cost": cost(compiled),
        "arguments_bytes": argument_bytes(compiled, (setup.decode_params, ids, key, temperature)),
        "outputs_bytes": device_bytes(compiled.out_info),
        "num_outputs": len(jax.tree.leaves(compiled.out_info)),
        "inputs_bytes": device_bytes((ids, key, temperature)),
        "params_bytes": device_bytes(setup.decode_params),
        "optimizer_bytes": 0,
        "other_state_bytes": 0,
        "cache_compiled": {"self": self_bytes, "cross": cross_bytes, "total": self_bytes + cross_bytes},
        "cache_compiled_specs": {
            "self": str(jax.tree.leaves(cache.self_k[0])[0].sharding.spec),  # a quantized entry: its values
            "cross": str(jax.tree.leaves(cache.cross_k[0])[0].sharding.spec) if cache.cross_k else "none",
        },
        "cache_formula": {
            **{k: layout[k]["bytes_per_device"] for k in ("self", "cross")},
            "total": layout["self"]["bytes_per_device"] + layout["cross"]["bytes_per_device"],
        },
        "cache_layout": {
            k: {"spec": str(v["spec"]), "total_bytes": v["total_bytes"], "shards": v["shards"]}
            for k, v in layout.items()
        },
        "cache_replicated": [dataclasses.asdict(r) for r in replicated_cache],
        "cache_report": sharding_lib.replication_report(replicated_cache) if replicated_cache else "",
        **_paper_ops(compiled, config),
    }


def _paper_ops(compiled: Any, config: Any) -> dict[str, Any]:
    """The paper's decode: where the compiled loop has its per-step cross K/V projection (in the loop or
    hoisted, ``loop_hlo.where``) and its one-hot cache write (the fusions that write the cache)."""
    hlo = compiled.as_text() if config.cross_recompute or config.one_hot_write else ""
    found = {}
    if config.cross_recompute:
        found["cross_kv_projection"] = loop_hlo.where(hlo, CROSS_RECOMPUTE_SCOPE)
    if config.one_hot_write:
        found["one_hot_write"] = loop_hlo.where(hlo, ONE_HOT_SCOPE, ("fusion",))
    return found


COMPILERS: dict[str, Callable[[_Setup, int], dict[str, Any]]] = {
    "train": compile_train,
    "decode": compile_decode,
}


# ------------------------------------------------------------------------------- the plan
def plan(settings: PlanSettings, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Compile the programs on abstract shapes and collect their per-device memory."""
    start = time.perf_counter()
    s = settings
    setup = _setup(s)
    limit = int(setup.hbm_gib * GIB)
    log(
        f"set up {s.preset} K={setup.train_config.num_kv_heads} on mesh {s.mesh} "
        f"in {time.perf_counter() - start:.1f} s"
    )
    results: dict[str, Any] = {}
    for program in s.programs:
        cache: dict[int, dict[str, Any]] = {}

        def measure(batch: int, program: str = program, cache: dict = cache) -> int:
            if batch not in cache:
                log(f"compiling the {program} program at batch {batch} ...")
                cache[batch] = COMPILERS[program](setup, batch)
                m = cache[batch]["memory"]
                log(f"  {cache[batch]['compile_s']:.1f} s; total {m['total'] / GIB:.2f} GiB per device")
            return cache[batch]["memory"]["total"]

        measure(s.batch)
        row = dict(cache[s.batch])
        if program == "decode" and "refused" in row:  # a search may pass over one; the asked batch may not
            raise ValueError(
                f"the TPU compiler refused the decode loop at batch {s.batch}: {row['refused']} (try a "
                "smaller --batch, --cache-dtype int8 or a larger slice)"
            )
        row["fits"] = row["memory"]["total"] <= limit
        if program in s.batch_search:
            step = _step(setup, program)
            search = search_batch(measure, s.batch, step, limit, log)
            search["compiled_totals"] = {str(k): v for k, v in search["compiled_totals"].items()}
            row["largest_batch"] = search
        row["compiles"] = [
            {"batch": b, "compile_s": r["compile_s"], "total": r["memory"]["total"]}
            for b, r in sorted(cache.items())
        ]
        results[program] = row
    return {
        "settings": dataclasses.asdict(s),
        "config": setup.train_config.to_dict(),
        "mesh": {"data": setup.data, "model": setup.mesh.shape["model"]},
        "backend": _platform(setup.mesh),
        "device_kind": setup.mesh.devices.flat[0].device_kind,
        "topology": dataclasses.asdict(setup.tpu.chip) | {"name": setup.tpu.name} if setup.tpu else None,
        "hbm_gib": setup.hbm_gib,
        "hbm_bytes": limit,
        "replication": {
            "params": [dataclasses.asdict(r) for r in setup.param_replicated],
            "params_report": sharding_lib.replication_report(setup.param_replicated),
        },
        "programs": results,
        "checks": checks(results, _platform(setup.mesh)),
        "wall_s": time.perf_counter() - start,
    }


def _platform(mesh: Any) -> str:
    return mesh.devices.flat[0].platform


def _step(setup: _Setup, program: str) -> int:
    """Batch granularity: training's rows split over ``data`` and into micro-batches; a decode's a
    whole number of rows per device, so its cache's rows split evenly over ``data`` x
    ``autoregressive`` whatever K (a batch they do not divide holds copies of the cache)."""
    if program == "train":
        return setup.data * setup.settings.num_microbatches
    return setup.mesh.devices.size


def checks(results: dict[str, Any], platform: str = "cpu") -> list[dict[str, Any]]:
    """Consistency checks, bytes per device: what the shardings and the cache formula give vs the
    compiled executable (``memory_analysis`` and its output shardings). A TPU executable pads its
    arguments and outputs to the chip's memory tiles, so there the compiled sizes of those two
    checks are at least the logical bytes, not equal to them (the cache arrays stay exact)."""
    out = []
    padded = platform == "tpu"

    def check(program: str, what: str, expected: int, compiled: int, ok: bool | None = None) -> None:
        if padded and what.startswith(("arguments", "outputs")):
            what, ok = what + " (TPU: at least, arrays padded to memory tiles)", compiled >= expected
        ok = expected == compiled if ok is None else ok
        out.append({"program": program, "what": what, "expected": expected, "compiled": compiled, "ok": ok})

    for program, r in results.items():
        if "refused" in r:  # no executable to check against
            continue
        args, m = r["arguments_bytes"], r["memory"]
        parts = r["params_bytes"] + r["optimizer_bytes"] + r["other_state_bytes"] + r["inputs_bytes"]
        unused = args["all"] - args["kept"]
        dropped = f", less {unused:,} bytes of unused arguments jit dropped" if unused else ""
        what = f"arguments: params + optimizer state + step, rng + inputs, from the shardings{dropped}"
        ok = parts == args["all"] and args["kept"] == m["argument"]
        check(program, what + " = compiled argument size", parts - unused, m["argument"], ok)
        table = m["output"] - r["outputs_bytes"]  # XLA:CPU counts the output tuple's index table too
        pointers = table == 8 * r["num_outputs"]
        index = (
            f" + the output tuple's index table (8 bytes x {r['num_outputs']} outputs)" if pointers else ""
        )
        what = f"outputs: from the compiled output shardings{index} = compiled output size"
        check(
            program,
            what,
            r["outputs_bytes"] + (table if pointers else 0),
            m["output"],
            table == 0 or pointers,
        )
        if program == "decode":
            for kind in ("self", "cross"):
                what = (
                    f"KV cache {kind}: formula / shards (a replicated K/V-head axis not divided) "
                    "= the compiled output's cache arrays"
                )
                check(program, what, r["cache_formula"][kind], r["cache_compiled"][kind])
    return out
