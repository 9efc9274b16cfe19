"""Run configs: python files with ``get_config(variant)``, and ``--config.a.b=value`` overrides.

``load("configs/finetune.py:task=stdlib_docsum,model=tiny", ["--config.batch_size=8"])`` imports
the file, calls ``get_config("task=stdlib_docsum,model=tiny")`` (or ``get_config()`` without a
variant), applies the overrides and returns an ``ml_collections.ConfigDict``. An override must
name an existing field (a typo is an error listing the fields); its value is parsed as a Python
literal and must fit the field's type (ints widen to floats; None fields take anything).
"""

from __future__ import annotations

import ast
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

import ml_collections


def parse_variant(variant: str) -> dict[str, str]:
    """``"a=1,b=x"`` -> ``{"a": "1", "b": "x"}`` (the part after ``:`` in ``--config file.py:...``)."""
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in variant.split(","))):
        if "=" not in item:
            raise ValueError(f"config variant item {item!r} must look like key=value")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def load_file(spec: str | os.PathLike) -> ml_collections.ConfigDict:
    """``path.py[:variant]`` -> the file's ``get_config(variant)``."""
    spec = str(spec)
    path, _, variant = spec.partition(".py:")
    path = path + ".py" if _ else path
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"config file {file} does not exist (expected configs/<name>.py[:variant])")
    module_spec = importlib.util.spec_from_file_location(f"gqa_jax_config_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ValueError(f"config file {file} has no get_config() function")
    config = module.get_config(variant) if variant else module.get_config()
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(f"{file}: get_config() must return an ml_collections.ConfigDict")
    return config


def _parse_value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string such as a path or a task name


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> ml_collections.ConfigDict:
    """Apply ``--config.a.b=value`` (or ``a.b=value``) overrides in place; returns ``config``."""
    for item in overrides:
        body = item[len("--config.") :] if item.startswith("--config.") else item
        if "=" not in body:
            raise ValueError(f"override {item!r} must look like --config.field=value")
        dotted, text = body.split("=", 1)
        *parents, leaf = dotted.split(".")
        node = config
        for name in parents:
            if name not in node or not isinstance(node[name], ml_collections.ConfigDict):
                raise ValueError(f"override {item!r}: {name!r} is not a config section")
            node = node[name]
        if leaf not in node:
            known = ", ".join(sorted(node))
            raise ValueError(f"override {item!r}: no field {dotted!r}; fields here: {known}")
        old, new = node[leaf], _parse_value(text)
        if old is not None and new is not None:
            if isinstance(old, float) and isinstance(new, int) and not isinstance(new, bool):
                new = float(new)
            elif isinstance(old, tuple) and isinstance(new, list):
                new = tuple(new)
            elif isinstance(old, str) and not isinstance(new, str):
                new = text
            if type(new) is not type(old) and not isinstance(old, ml_collections.ConfigDict):
                raise ValueError(
                    f"override {item!r}: {dotted} is {type(old).__name__} ({old!r}), got {type(new).__name__}"
                )
        with node.ignore_type():
            node[leaf] = new
    return config


def load(spec: str | os.PathLike, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    return apply_overrides(load_file(spec), overrides)


def base_train_config() -> ml_collections.ConfigDict:
    """Every field ``gqa_jax.training.train`` reads, with T5's defaults; configs/*.py start here.

    recipe            "pretrain" | "uptrain" | "finetune"
    task              a key of gqa_jax.data.tasks.TASKS (span corruption for pre-/uptraining)
    data_dir          TFDS data dir (default $GQA_JAX_DATA_DIR, $TFDS_DATA_DIR, ~/tensorflow_datasets)
    vocab             SentencePiece model (default for stdlib_* tasks: the suite's vocabulary)
    init_from         fine-tuning: a gqa_jax checkpoint (e.g. <workdir>/model) or HF T5 directory
    model.*           preset + ModelConfig overrides (None = the preset's / checkpoint's value)
    optimizer.*       warmup_steps (rsqrt schedule), learning_rate (constant schedule: fine-tuning)
    uptrain.*         source (MHA checkpoint), num_kv_heads, method (mean|first|random),
                      attentions, alpha, original_steps, source_step (schedule offset; default
                      original_steps): the run trains round(alpha x original_steps) steps
    batch_size        global rows per step; num_microbatches splits it for gradient accumulation
    mesh              "DATAxMODEL" device mesh (e.g. "1x8", "2x4"): params, optimizer state,
                      activations and the KV cache sharded by gqa_jax.sharding.RULES, batch rows
                      over data; "" = one device. A multi-host run sets the mesh over all hosts'
                      devices and starts every process with GQA_JAX_COORDINATOR/NUM_PROCESSES/
                      PROCESS_ID (or GQA_JAX_DISTRIBUTED=auto on TPU pods; see the README)
    pack              several examples per row (segment ids), as T5X packs
    input_length, target_length   override the task's lengths (None: the task's)
    log_every, checkpoint_every, keep_checkpoints
    eval_every        evaluate every N steps and at the end (0: only at the end, -1: never);
                      eval_at_start also scores the starting point (step 0); eval_examples caps
                      the dev examples decoded
    """
    c = ml_collections.ConfigDict()
    c.recipe = "pretrain"
    c.task = "stdlib_span"
    c.data_dir = None
    c.vocab = None
    c.init_from = None
    c.seed = 0
    c.batch_size = 32
    c.num_microbatches = 1
    c.mesh = ""
    c.pack = True
    c.input_length = None  # None: the task's (span corruption derives the targets' length)
    c.target_length = None
    c.num_train_steps = 1000
    c.z_loss = 1e-4
    c.model = ml_collections.ConfigDict(
        {
            "preset": "tiny",
            "num_kv_heads": None,
            "grouped_attentions": None,
            "dropout_rate": 0.0,
            "dtype": None,
            "param_dtype": None,
        }
    )
    c.optimizer = ml_collections.ConfigDict({"warmup_steps": 10_000, "learning_rate": 1e-3})
    c.uptrain = ml_collections.ConfigDict(
        {
            "source": None,
            "num_kv_heads": 1,
            "method": "mean",
            "attentions": None,
            "alpha": 0.05,
            "original_steps": 1000,
            "source_step": None,
        }
    )
    c.log_every = 10
    c.checkpoint_every = 200
    c.keep_checkpoints = 3
    c.eval_every = 200
    c.eval_at_start = False
    c.eval_examples = 256
    c.eval_batch_size = 32
    c.progress = True
    return c
