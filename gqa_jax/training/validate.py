"""Every train-config value checked before anything is built or written, each error naming the
field (``config.<dotted name>``), the value and what it may be.

``check_config(config)`` runs first in ``train()``. ``checkpoint_overrides(config, loaded)``
decides what ``config.model.*`` does to a model loaded from a checkpoint (fine-tuning's
``init_from``, uptraining's source): the options that do not change the weights (dropout,
activation dtype, remat, scan_layers) are applied, and the model's own fields (its preset and
shape, its K/V heads, which attentions are grouped, the stored dtype) are an error unless they
equal the checkpoint's: a fine-tuning run cannot change them, and an uptraining run changes the
K/V heads through ``config.uptrain``.
"""

from __future__ import annotations

from typing import Any

import jax

from gqa_jax import conversion, profiling, sharding
from gqa_jax.config import DTYPES, REMAT_POLICIES, ModelConfig
from gqa_jax.data import tasks as tasks_lib

RECIPES = ("pretrain", "uptrain", "finetune")
# ModelConfig fields a config may override to train a shape of its own (from scratch only)
SHAPE_FIELDS = ("d_model", "d_ff", "num_encoder_layers", "num_decoder_layers", "num_heads", "head_dim")
# Must be an integer >= 1; None or an integer >= 2.
POSITIVE = ("batch_size", "num_microbatches", "checkpoint_every", "log_every", "keep_checkpoints",
            "eval_examples", "eval_batch_size")  # fmt: skip
LENGTHS = ("input_length", "target_length")
FINETUNE_SCHEDULES = ("constant", "linear")  # optimizer.schedule (pre- and uptraining: rsqrt)


def _fail(name: str, value: Any, rule: str) -> None:
    raise ValueError(f"config.{name} must be {rule}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_numbers(config: Any) -> None:
    for name in POSITIVE:
        if not _is_int(config[name]) or config[name] < 1:
            _fail(name, config[name], "an integer >= 1")
    for name in LENGTHS:
        value = config[name]
        if value is not None and (not _is_int(value) or value < 2):
            _fail(name, value, "an integer >= 2 (tokens, EOS included), or None for the task's length")
    if not _is_int(config.eval_every) or config.eval_every < -1:
        _fail("eval_every", config.eval_every, "an integer: N > 0 every N steps, 0 only at the end, -1 never")
    if not _is_int(config.seed):
        _fail("seed", config.seed, "an integer")
    if not isinstance(config.z_loss, int | float) or not config.z_loss >= 0:
        _fail("z_loss", config.z_loss, "a number >= 0")
    opt = config.optimizer
    if not _is_int(opt.warmup_steps) or opt.warmup_steps < 1:
        _fail("optimizer.warmup_steps", opt.warmup_steps, "an integer >= 1")
    if not isinstance(opt.learning_rate, int | float) or not 0 < opt.learning_rate < float("inf"):
        _fail("optimizer.learning_rate", opt.learning_rate, "a finite number > 0")
    if opt.get("schedule") is not None:
        if config.recipe != "finetune":
            rule = f"None ({config.recipe} uses T5's rsqrt schedule; only fine-tuning takes one)"
            _fail("optimizer.schedule", opt.schedule, rule)
        if opt.schedule not in FINETUNE_SCHEDULES:
            _fail("optimizer.schedule", opt.schedule, f"one of {', '.join(FINETUNE_SCHEDULES)}")
    rate = config.model.dropout_rate
    if rate is not None and not (isinstance(rate, int | float) and 0 <= rate < 1):
        _fail("model.dropout_rate", rate, "a number in [0, 1)")
    for name in SHAPE_FIELDS + ("num_kv_heads",):
        value = config.model[name]
        if value is not None and (not _is_int(value) or value < 1):
            _fail(f"model.{name}", value, "an integer >= 1, or None for the preset's")
    for name in ("dtype", "param_dtype"):
        if config.model[name] is not None and config.model[name] not in DTYPES:
            _fail(f"model.{name}", config.model[name], f"one of {', '.join(DTYPES)} (or None)")
    if config.model.remat is not None and config.model.remat not in REMAT_POLICIES:
        _fail("model.remat", config.model.remat, f"one of {', '.join(REMAT_POLICIES)} (or None)")


def _check_uptrain(config: Any, task: Any) -> None:
    up = config.uptrain
    if not task.span_corruption:
        raise ValueError(f"uptraining continues span corruption; task {task.name} is not a corpus")
    if not up.source:
        raise ValueError("uptraining needs config.uptrain.source (an MHA checkpoint to convert)")
    if not isinstance(up.alpha, int | float) or not 0 <= up.alpha <= 1:
        _fail("uptrain.alpha", up.alpha, "a number in [0, 1] (0: convert only, no training step)")
    if not _is_int(up.original_steps) or up.original_steps < 1:
        _fail(
            "uptrain.original_steps", up.original_steps, "an integer >= 1 (the source's pre-training steps)"
        )
    if up.source_step is not None and (not _is_int(up.source_step) or up.source_step < 0):
        _fail("uptrain.source_step", up.source_step, "an integer >= 0, or None for original_steps")
    if not _is_int(up.num_kv_heads) or up.num_kv_heads < 1:
        _fail("uptrain.num_kv_heads", up.num_kv_heads, "an integer >= 1 (1: MQA)")
    if up.method not in conversion.names():
        _fail("uptrain.method", up.method, f"one of {', '.join(conversion.names())}")
    batches = up.calibration_batches
    if not _is_int(batches) or batches < 0:
        _fail("uptrain.calibration_batches", batches, "an integer >= 0 (0: no calibration)")
    if not _is_int(up.calibration_batch_size) or up.calibration_batch_size < 1:
        _fail("uptrain.calibration_batch_size", up.calibration_batch_size, "an integer >= 1")
    task_file = isinstance(up.calibration_task, str) and tasks_lib.is_task_file(up.calibration_task)
    if task_file:  # the task file's own errors and its files', before any work
        tasks_lib.open_files(tasks_lib.get_task(up.calibration_task), config.get("data_dir") or None)
    elif up.calibration_task is not None and up.calibration_task not in tasks_lib.TASKS:
        known = ", ".join(tasks_lib.TASKS)
        _fail(
            "uptrain.calibration_task",
            up.calibration_task,
            f"one of {known}, a task file, or None for config.task",
        )
    if batches and up.method not in conversion.calibrated():
        raise ValueError(
            f"config.uptrain.calibration_batches={batches} calibrates method "
            f"{' or '.join(conversion.calibrated())} only, not uptrain.method={up.method!r}: choose one of "
            "those methods or set --config.uptrain.calibration_batches=0"
        )
    for name, instead in (
        ("num_kv_heads", "uptrain.num_kv_heads"),
        ("grouped_attentions", "uptrain.attentions"),
    ):
        if config.model[name] is not None:
            raise ValueError(
                f"config.model.{name} does not apply to uptraining: the converted model's comes from "
                f"config.{instead}; drop --config.model.{name}"
            )


def starts_from(config: Any) -> str | None:
    """The checkpoint a run starts from: uptraining's source, else ``init_from`` (None: random)."""
    return config.uptrain.source if config.recipe == "uptrain" else config.init_from


def check_config(config: Any) -> None:
    """Clear errors for a config that cannot run (before anything is built or written)."""
    if config.recipe not in RECIPES:
        raise ValueError(f"config.recipe must be one of {', '.join(RECIPES)}, got {config.recipe!r}")
    task = tasks_lib.get_task(config.task)
    if config.recipe == "pretrain" and not task.span_corruption:
        raise ValueError(f"pre-training reads a span-corruption task, and {task.name} is not one")
    if config.recipe == "finetune" and task.span_corruption:
        raise ValueError(f"fine-tuning reads a sequence-to-sequence task; {task.name} is span corruption")
    if config.recipe == "uptrain":
        _check_uptrain(config, task)
    _check_numbers(config)
    profiling.parse_steps(config.get("profile_steps"), "config.profile_steps")
    source = starts_from(config)
    if source and config.recipe == "pretrain":
        raise ValueError(
            f"config.init_from={source!r} does not apply to pre-training (it starts from random "
            "weights): fine-tune from it (configs/finetune.py) or uptrain it (configs/uptrain.py)"
        )
    shape = [k for k in ("preset", *SHAPE_FIELDS) if config.model.get(k) is not None]
    if shape and source:
        raise ValueError(
            f"config.model.{shape[0]}={config.model[shape[0]]!r} sets a model shape, but this run starts "
            f"from {source}, which has its own: drop --config.model.{shape[0]}"
        )
    if config.batch_size % config.num_microbatches:
        raise ValueError(
            f"config.batch_size {config.batch_size} is not divisible by "
            f"num_microbatches {config.num_microbatches}"
        )
    if config.get("mesh"):
        data, _ = sharding.parse_mesh_shape(config.mesh)
        for name in ("batch_size", "eval_batch_size"):
            if int(config[name]) % data:
                raise ValueError(
                    f"config.{name}={config[name]} is not divisible by the data axis ({data}) of "
                    f"config.mesh={config.mesh!r}: choose a multiple of {data}"
                )
        if (config.batch_size // config.num_microbatches) % data:
            raise ValueError(
                f"micro-batches of {config.batch_size // config.num_microbatches} rows do not split over "
                f"the data axis ({data}) of config.mesh={config.mesh!r}: lower num_microbatches"
            )
    elif jax.process_count() > 1:
        raise ValueError(
            f"this is one of {jax.process_count()} processes, but config.mesh is empty: set a mesh over "
            "all their devices, e.g. --config.mesh=2x4"
        )
    if config.recipe != "uptrain" and (not _is_int(config.num_train_steps) or config.num_train_steps < 1):
        _fail("num_train_steps", config.num_train_steps, "an integer >= 1")
    tasks_lib.open_files(task, config.get("data_dir") or None)  # a task file's rows, before any work


def checkpoint_overrides(config: Any, loaded: ModelConfig, source: Any) -> dict[str, Any]:
    """The ``ModelConfig.replace`` fields ``config.model`` applies to ``loaded`` (the config of the
    checkpoint ``source``); a ValueError naming a field that would change the model itself."""
    model = config.model
    for name in ("num_kv_heads", "grouped_attentions", "param_dtype"):
        value = model.get(name)
        if value is None:
            continue
        value = tuple(value) if name == "grouped_attentions" else value
        if value != getattr(loaded, name):
            raise ValueError(
                f"config.model.{name}={value!r} does not apply to the checkpoint {source}, whose "
                f"{name} is {getattr(loaded, name)!r}: drop --config.model.{name}"
                + (
                    " (uptrain it to change the K/V heads: configs/uptrain.py)"
                    if name == "num_kv_heads"
                    else ""
                )
            )
    out: dict[str, Any] = {"dropout_rate": model.dropout_rate or 0.0}
    if model.get("dtype") is not None:
        out["dtype"] = model.dtype
    if model.get("remat") is not None:
        out["remat"] = model.remat
    if model.get("scan_layers") is not None:
        out["scan_layers"] = model.scan_layers
    return out
