"""``python -m gqa_jax time``: T_infer measured, the time per sample of greedy decoding at one input
and output length as the paper measures it (the largest batch that fits, up to 32 per chip),
written to ``DIR/timing.json`` (``gqa_jax.timing.TimingRecord``) for the experiments' report.

- The model: a preset's random weights (``model.build(config, seed=)``) or a gqa_jax checkpoint
  (``checkpoints.load``), parameters and activations cast to ``dtype``; the KV cache in ``cache_dtype``
  (None: ``dtype``; int8 / fp8: quantized, ``gqa_jax.kv_quant``).
- The inputs: random ids ``[batch, input_len]`` (``bench_models.random_ids``: no pad, no EOS);
  EOS is disabled (``bench_models.NEVER_EOS``) so every row decodes exactly ``output_len`` tokens
  (checked).
- The timing: ``decoding.greedy_decode`` (the fused loop, prefill included) under
  ``tools.measurement.measure``: one warm-up call (compile) excluded, then ``runs`` calls each ended by
  ``block_until_ready``; time per sample = median end-to-end time / batch. Inputs and parameters
  are on the devices before the clock starts. What the time is made of: the prefill alone (encoder
  + cross K/V projection + the empty cache: ``decoding.start``, the loop's own first program) timed
  by the same rule, and the decoder's steps alone: each repeat runs the prefill untimed, blocks,
  then times ``decoding.finish`` (the step loop) on that prefilled state (``steps_times_s``;
  ``steps_per_sample_s`` = their median / batch). So ``prefill_per_sample_s`` and
  ``steps_per_sample_s`` say whether a time is the encoder's or the cache's, each measured (not
  one as the difference of two medians).
- The bytes model (``step_bytes``): what one decoder step of the batch must read, the weights and
  the whole cache at the batch and lengths (``tools.decode_floor.step_bytes``, the bytes side of
  ``bench decode``'s floor; the cache by ``cache.expected_cache_bytes``), over all devices. The
  step's roofline (``step_roofline``): each op's bytes or FLOPs at the rates this machine reads a
  buffer of the step's size and multiplies, measured after the timing (one device's rates).
- The decode: ours, or (``decode``) the paper's decode or some of its switches, instruments that
  reproduce how T5X decoded (``config.PAPER_SWITCHES``; the record's ``decode`` names it); the
  bytes model and the roofline are our decode's.
- The batch: given, or ``auto`` = the largest that fits ``hbm_gib`` per device by the memory plan
  (``tools.plan``'s decode program, compiled ahead of time), at most 32 per device. With several
  devices the rows split over a ``data`` mesh axis of all of them (parameters replicated), so the
  batch is a multiple of the device count.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gqa_jax import cache as kvcache
from gqa_jax import decoding, kv_quant, paths
from gqa_jax import model as model_lib
from gqa_jax import sharding as sharding_lib
from gqa_jax.config import OUR_DECODE, PRESETS, ModelConfig, decode_name, decode_switches, divisors, preset
from gqa_jax.timing import TIMING_FILE, TimingRecord
from gqa_jax.tools.bench_models import NEVER_EOS, random_ids
from gqa_jax.tools.compiled_memory import GIB
from gqa_jax.tools.decode_floor import roofline_s, step_bytes, step_ops
from gqa_jax.tools.measurement import machine_info, matmul_rate, measure, probe_sizes, read_rate, to_json

DTYPES = ("bfloat16", "float32")
PER_DEVICE = 32  # the paper's cap: up to 32 samples per chip
RULE_GIVEN = "given"
RULE_AUTO = f"largest that fits, <= {PER_DEVICE} per device"


@dataclasses.dataclass(frozen=True)
class TimeSettings:
    workdir: str
    preset: str | None = None  # random weights of this preset ...
    num_kv_heads: int | None = None  # ... with K K/V heads (None: MHA)
    model: str | None = None  # ... or a gqa_jax checkpoint directory
    input_len: int = 2048
    output_len: int = 512
    batch: int | str = "auto"  # rows, or "auto"
    hbm_gib: float | None = None  # None: the device's memory when it reports it, else the plan's default
    dtype: str = "bfloat16"
    cache_dtype: str | None = None  # the KV cache's (None: dtype; int8 / fp8: gqa_jax.kv_quant)
    runs: int = 5
    seed: int = 0  # weights and inputs
    overwrite: bool = False
    predict: str | None = None  # a TPU slice: predict from its compiler (tools.t_infer_predict), not time
    mesh: str = "auto"  # with predict: DATAxMODEL over the slice's chips, or auto (every split, fastest)
    decode: str = OUR_DECODE  # ours, or the paper's decode (config.decode_switches): an instrument
    cache_layout: str = "auto"  # with predict: the decode layout, or "heads" (K/V heads over model alone)
    beam_search: bool = False  # with predict: each step a beam search's of one beam (T5X's default decode)


# ----------------------------------------------------------------------------- checks
def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")


def check_settings(s: TimeSettings) -> None:
    """Everything that can be checked before a model is built: one ValueError naming the problem."""
    if s.preset is not None and s.model is not None:
        raise ValueError("give either --preset (random weights) or --model CKPT_DIR, not both")
    if s.preset is None and s.model is None:
        raise ValueError("give --preset P (random weights) or --model CKPT_DIR (a gqa_jax checkpoint)")
    if s.model is not None and s.num_kv_heads is not None:
        raise ValueError("--num-kv-heads applies to --preset only: a checkpoint has its own K/V heads")
    if s.preset is not None and s.preset not in PRESETS:
        raise ValueError(f"unknown preset {s.preset!r}; known: {', '.join(PRESETS)}")
    for name in ("input_len", "output_len", "runs"):
        _positive(name, getattr(s, name))
    if s.batch != "auto":
        _positive("batch", s.batch)
    if s.dtype not in DTYPES:
        raise ValueError(f"dtype {s.dtype!r}; choose from {', '.join(DTYPES)}")
    kv_quant.check_cache_dtype(s.cache_dtype)
    decode_switches(s.decode)
    if s.hbm_gib is not None and not s.hbm_gib > 0:
        raise ValueError(f"--hbm-gib must be positive, got {s.hbm_gib}")
    if s.preset is not None and s.num_kv_heads is not None:
        n = preset(s.preset).num_heads
        if not isinstance(s.num_kv_heads, int) or s.num_kv_heads < 1 or n % s.num_kv_heads:
            raise ValueError(
                f"--num-kv-heads {s.num_kv_heads} does not divide num_heads={n} of preset {s.preset}: "
                f"choose from {divisors(n)}"
            )
    devices = jax.device_count()
    if s.batch != "auto" and s.batch % devices:
        raise ValueError(f"--batch {s.batch} is not a multiple of the {devices} devices the rows split over")


def check_workdir(workdir: str | os.PathLike, overwrite: bool) -> Path:
    """``workdir``'s timing file (the directory is created when the record is written); refuses a
    file, and an existing timing file unless ``overwrite``."""
    path = Path(workdir).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--workdir {path} is a file, not a directory")
    out = path / TIMING_FILE
    if out.exists() and not overwrite:
        raise ValueError(f"{out} already exists; pass --overwrite to replace it")
    return out


# ----------------------------------------------------------------------------- the model
def matching_preset(config: ModelConfig) -> str | None:
    """The preset whose shapes (at ``config``'s K) ``config`` has, dtypes and dropout aside."""
    norm = {"dtype": "float32", "param_dtype": "float32", "dropout_rate": 0.0}
    for name in PRESETS:
        try:
            candidate = preset(name, num_kv_heads=config.num_kv_heads, **norm)
        except ValueError:  # config's K does not fit this preset's heads: another shape
            continue
        if config.replace(**norm) == candidate:
            return name
    return None


def model_config(s: TimeSettings) -> ModelConfig:
    return preset(s.preset, num_kv_heads=s.num_kv_heads, dtype=s.dtype, param_dtype=s.dtype)


def load_model(path: str, dtype: str) -> tuple[ModelConfig, Any]:
    """A gqa_jax checkpoint's ``(config, model)``, parameters and activations cast to ``dtype``."""
    from gqa_jax import checkpoints

    model, config = checkpoints.load(path, param_dtype=dtype)  # cast as read: no stored-dtype copy
    config = config.replace(dtype=dtype)
    return config, model_lib.build(config, model)


# ----------------------------------------------------------------------------- the batch
def device_hbm_gib() -> float | None:
    """The memory JAX may use on the first device, GiB (None where it does not say: CPU)."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # some backends do not implement it
        return None
    limit = stats.get("bytes_limit")
    return limit / GIB if limit else None


def largest_batch(
    preset_name: str, config: ModelConfig, s: TimeSettings, hbm_gib: float, log: Callable[[str], None]
) -> int:
    """The paper's rule: the largest batch whose decode program fits ``hbm_gib`` per device by the
    memory plan, at most ``PER_DEVICE`` x the devices. One compile when the cap fits; else the
    plan's batch search from the smallest batch (one row per device)."""
    from gqa_jax.tools import plan

    devices = jax.device_count()
    cap = PER_DEVICE * devices

    def planned(batch: int, search: bool) -> dict[str, Any]:
        settings = plan.PlanSettings(
            preset=preset_name, num_kv_heads=config.num_kv_heads, mesh=f"{devices}x1", batch=batch,
            input_len=s.input_len, output_len=s.output_len, hbm_gib=hbm_gib, dtype=s.dtype,
            cache_dtype=s.cache_dtype, programs=("decode",), batch_search=("decode",) if search else (),
            decode=s.decode,
        )  # fmt: skip
        return plan.plan(settings, log=log)["programs"]["decode"]

    at_cap = planned(cap, search=False)
    if at_cap["fits"]:
        log(f"batch auto: the cap {cap} fits {hbm_gib:g} GiB per device")
        return cap
    found = planned(devices, search=True)["largest_batch"]
    if not found["largest_batch"]:
        raise ValueError(
            f"no batch fits {hbm_gib:g} GiB per device: the decode program of {preset_name} "
            f"K={config.num_kv_heads} at input {s.input_len}, output {s.output_len} needs more even at "
            f"batch {devices} ({found['how']}); raise --hbm-gib or shorten the lengths"
        )
    batch = min(found["largest_batch"], cap)
    log(f"batch auto: {batch} ({found['how']})")
    return batch


# ----------------------------------------------------------------------------- the timing
def measure_t_infer(settings: TimeSettings, log: Callable[[str], None] = lambda m: None) -> TimingRecord:
    """Measure T_infer as the module docstring says; write and return ``timing.json``'s record."""
    s = settings
    check_settings(s)
    out = check_workdir(s.workdir, s.overwrite)
    config, model, preset_name, weights = _model(s, log)
    batch, rule = _batch(s, config, preset_name, log)
    if model is None:
        model = model_lib.build(config, seed=s.seed)
    cache = kvcache.expected_cache_bytes(config, batch, s.input_len, s.output_len, s.cache_dtype or s.dtype)
    reads = step_bytes(model, config, batch, cache)
    graphdef, params = nnx.split(model)
    params, ids, mesh = _placed(params, random_ids(config.vocab_size, batch, s.input_len, s.seed))
    log(
        f"timing greedy decoding: batch {batch}, input {s.input_len}, output {s.output_len}, "
        f"{s.dtype}, KV cache {s.cache_dtype or s.dtype}, decode {s.decode}, {s.runs} runs after one warm-up"
    )
    timing = time_greedy(graphdef, params, ids, s, mesh)
    prefill_timing = time_prefill(graphdef, params, ids, s, mesh)
    steps_timing = time_steps(graphdef, params, ids, s, mesh)
    roofline = step_roofline(model, config, batch, (s.input_len, s.output_len), cache, s.dtype, log)
    record = TimingRecord(
        time_per_sample_s=timing["median_s"] / batch,
        times_s=tuple(timing["times_s"]),
        prefill_per_sample_s=prefill_timing["median_s"] / batch,
        prefill_times_s=tuple(prefill_timing["times_s"]),
        steps_per_sample_s=steps_timing["median_s"] / batch,
        batch=batch,
        batch_rule=rule,
        input_len=s.input_len,
        output_len=s.output_len,
        preset=preset_name or "custom",
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        dtype=s.dtype,
        cache_dtype=s.cache_dtype or s.dtype,
        weights=weights,
        machine=machine_info(),
        steps_times_s=tuple(steps_timing["times_s"]),
        step_bytes=reads,
        step_roofline=roofline,
        decode=record_decode(s.decode),
    )
    write_record(record, out)
    log(f"compile + first call {timing['first_s']:.2f} s (compile ~{timing['compile_s']:.2f} s, excluded)")
    return record


def step_roofline(
    model: Any,
    config: ModelConfig,
    batch: int,
    lengths: tuple[int, int],
    cache: dict[str, int],
    dtype: str,
    log: Callable[[str], None],
) -> dict[str, float]:
    """A decoder step's roofline (``decode_floor.roofline_s``) at the rates this machine reads a
    buffer of the step's bytes and multiplies a 2048^3 matmul, both measured now."""
    log("measuring this machine's read and matmul rates for the step's roofline ...")
    ops = step_ops(model, config, batch, lengths, cache)
    read = read_rate(sum(op["bytes"] for op in ops), 10)["gb_s"]
    matmul = matmul_rate(jnp.dtype(dtype), [probe_sizes(config.d_model, config.vocab_size)["n"]], 3)[
        "gflop_s"
    ]
    return {"roofline_s": roofline_s(ops, read, matmul), "read_gb_s": read, "matmul_gflop_s": matmul}


def _model(s: TimeSettings, log: Callable[[str], None]) -> tuple[ModelConfig, Any, str | None, str]:
    """``(config, model, preset, weights)``: a checkpoint loaded (the preset whose shapes it has,
    if any), or a preset's config whose random weights are built later (model None)."""
    if s.model is None:
        return model_config(s), None, s.preset, "random"
    start = time.perf_counter()
    config, model = load_model(s.model, s.dtype)
    weights = str(Path(s.model).expanduser().absolute())
    log(f"loaded {weights} in {time.perf_counter() - start:.1f} s")
    return config, model, matching_preset(config), weights


def _batch(
    s: TimeSettings, config: ModelConfig, preset_name: str | None, log: Callable[[str], None]
) -> tuple[int, str]:
    """``(batch, its rule)``: the given one, or auto's (:func:`largest_batch` on the device's memory)."""
    if s.batch != "auto":
        return s.batch, RULE_GIVEN
    if preset_name is None:
        raise ValueError(
            f"--batch auto plans the memory of a preset's shapes, and {s.model} matches no preset "
            f"({', '.join(PRESETS)}): give --batch N"
        )
    hbm = s.hbm_gib or device_hbm_gib()
    if hbm is None:
        from gqa_jax.tools.plan import DEFAULT_HBM_GIB

        hbm = DEFAULT_HBM_GIB
    return largest_batch(preset_name, config, s, hbm, log), RULE_AUTO


def _placed(params: Any, ids: Any) -> tuple[Any, Any, Any]:
    """``(params, ids, mesh)`` on the devices before the clock starts, as ``greedy_decode`` would
    place them: with several devices the rows split over a ``data`` mesh of all of them."""
    devices = jax.device_count()
    mesh = sharding_lib.make_mesh(f"{devices}x1") if devices > 1 else None
    if mesh is not None:
        params = sharding_lib.shard_params(params, mesh)
        ids = jax.device_put(ids, sharding_lib.batch_sharding(mesh))
    else:
        ids = jax.device_put(ids)
    jax.block_until_ready((params, ids))
    return params, ids, mesh


def record_decode(decode: str) -> str | None:
    """A timing record's ``decode``: None for ours (the field left out, as before it existed), else the
    decode's canonical name (the paper's decode or some of its switches)."""
    name = decode_name(decode_switches(decode))
    return None if name == OUR_DECODE else name


def time_greedy(graphdef: Any, params: Any, ids: Any, s: TimeSettings, mesh: Any) -> dict[str, Any]:
    """``measure``'s timing of the whole decode (``decoding.greedy_decode``, prefill included);
    checks that every row decoded ``output_len`` tokens."""

    def decode() -> Any:
        return decoding.greedy_decode(
            (graphdef, params), ids, s.output_len, eos_id=NEVER_EOS, mesh=mesh, cache_dtype=s.cache_dtype,
            decode=s.decode,
        )  # fmt: skip

    timing, result = measure(decode, s.runs)
    lengths = np.asarray(result.lengths)
    if not (lengths == s.output_len).all():
        raise RuntimeError(
            f"greedy_decode emitted {lengths.tolist()} tokens per row, expected {s.output_len}"
        )
    return timing


def _config(s: TimeSettings, mesh: Any) -> decoding.DecodeConfig:
    """``greedy_decode``'s settings of the timed decode on ``mesh`` (EOS never ends a row)."""
    return decoding.decode_config(
        s.output_len, mesh=mesh, eos_id=NEVER_EOS, cache_dtype=s.cache_dtype, decode=s.decode
    )


def time_prefill(graphdef: Any, params: Any, ids: Any, s: TimeSettings, mesh: Any) -> dict[str, Any]:
    """``measure``'s timing of the decode loop's prefill alone (``decoding.start``, with
    ``greedy_decode``'s settings on ``mesh``)."""
    config, key = _config(s, mesh), jax.random.key(0)
    timing, _ = measure(lambda: decoding.start(graphdef, params, ids, key, config=config, mesh=mesh), s.runs)
    return timing


def time_steps(graphdef: Any, params: Any, ids: Any, s: TimeSettings, mesh: Any) -> dict[str, Any]:
    """``measure``'s timing of the decoder's steps alone: each call runs the prefill
    (``decoding.start``) untimed and blocks on it, then times ``decoding.finish`` (the step loop,
    which donates its state: a fresh one per call) until ``output_len`` tokens are out. The weights
    are laid out for the steps once, before the clock (``decoding.step_weights``)."""
    config, output_len, runs = _config(s, mesh), s.output_len, s.runs
    key, temperature = jax.random.key(0), jnp.float32(0.0)
    weights = jax.block_until_ready(decoding.step_weights(graphdef, params, config))

    def steps(state: Any) -> Any:
        return decoding.finish(graphdef, weights, state, temperature, config=config, mesh=mesh)

    timing, state = measure(
        steps, runs, prepare=lambda: decoding.start(graphdef, params, ids, key, config=config, mesh=mesh)
    )
    lengths = np.asarray(state.lengths)
    if not (lengths == output_len).all():
        raise RuntimeError(f"the step loop emitted {lengths.tolist()} tokens per row, expected {output_len}")
    return timing


def write_record(record: TimingRecord, path: Path) -> None:
    """``record`` as JSON at ``path`` (``paths.write_text_atomic``), its directory created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_text_atomic(path, json.dumps(to_json(record.to_dict()), indent=1) + "\n")


def summary(record: TimingRecord, workdir: str | os.PathLike) -> str:
    """One line: what was timed, the time per sample, and where the record went."""
    r, path = record, Path(workdir).expanduser() / TIMING_FILE
    median = r.time_per_sample_s * r.batch
    return (
        f"time: {r.preset} K={r.num_kv_heads} of N={r.num_heads}, weights {r.weights}, {r.dtype}"
        + (f", KV cache {r.cache_dtype}" if r.cache_dtype not in (None, r.dtype) else "")
        + (f", decode {r.decode} (the paper's decode, an instrument)" if r.decode else "")
        + f", batch {r.batch} ({r.batch_rule}), input {r.input_len}, "
        f"output {r.output_len}: {r.time_per_sample_s * 1e3:.3f} ms per sample "
        f"(median {median:.4f} s of {len(r.times_s)} runs / {r.batch}; prefill "
        f"{r.prefill_per_sample_s * 1e3:.3f} ms, decoder steps {r.steps_per_sample_s * 1e3:.3f} ms) "
        f"-> {path}"
    )
