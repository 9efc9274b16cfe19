"""The shared base train config: every field ``gqa_jax.training.train`` reads, with T5's defaults.
configs/pretrain.py, uptrain.py and finetune.py start from ``get_config()`` here (they load this
file by its path next to theirs, so any working directory works).

    python -m gqa_jax data build-suite     # once: the stdlib suite and its vocabulary (~1 min)
    python -m gqa_jax train --config configs/base.py --workdir runs/pt --config.num_train_steps=400 \\
        --config.batch_size=16 --config.input_length=128

On its own it is configs/pretrain.py without a variant (tiny preset, span corruption on
``stdlib_span``), so that command is the measured pre-training run: its runtime and losses are in
docs/results/training.md.

Fields (override any with ``--config.FIELD=VALUE`` or ``--config.FIELD VALUE``; a field that
defaults to None is a typed placeholder and takes only a value of its type):

    recipe            "pretrain" | "uptrain" | "finetune"
    task              a key of gqa_jax.data.tasks.TASKS, or a task file (my_task.py: gqa_jax.data.user_tasks);
                      span corruption for pre-/uptraining
    data_dir          (str) TFDS data dir (default $GQA_JAX_DATA_DIR, $TFDS_DATA_DIR, ~/tensorflow_datasets)
    vocab             (str) SentencePiece model (default for stdlib_* tasks: the suite's vocabulary)
    init_from         (str) fine-tuning: a gqa_jax checkpoint (<workdir>/model), HF T5 dir, T5X checkpoint_N
    seed              PRNG seed: the initial weights, the data order, uptrain's method=random
    model.*           (str) preset (None: "tiny" from random weights; a run that starts from a
                      checkpoint takes its shape, and a preset or shape field is then an error)
                      + ModelConfig overrides (None = the preset's / checkpoint's value):
                      d_model, d_ff, num_encoder_layers, num_decoder_layers, num_heads, head_dim
                      (int: a new shape, trained from scratch only), num_kv_heads (int),
                      grouped_attentions (tuple of attention names),
                      dropout_rate, dtype and param_dtype (str), remat (str: what each layer
                      keeps for the backward pass, none|full|save_dots|save_dots_no_batch; memory
                      for recomputation, same results; applies to loaded checkpoints too),
                      scan_layers (bool: the layers as one lax.scan, compiled once; same results);
                      from a checkpoint only dropout_rate, dtype, remat and scan_layers apply
                      (num_kv_heads, grouped_attentions, param_dtype must equal the checkpoint's)
    optimizer.*       warmup_steps (rsqrt schedule), learning_rate (fine-tuning's rate), schedule
                      (str, fine-tuning only: "constant", the paper's and the default, or "linear":
                      learning_rate at step 0 decaying to 0 at num_train_steps; pre- and uptraining
                      use T5's rsqrt)
    uptrain.*         source (str: MHA checkpoint), num_kv_heads, method (a name of
                      gqa_jax.conversion.names(): mean, the paper's, and more; docs/checkpoints.md),
                      attentions (tuple), alpha, original_steps, source_step (int: schedule offset;
                      default original_steps): the run trains round(alpha x original_steps) steps;
                      calibration_batches (a method that calibrates: compare / fit heads by their activations
                      on that many batches of calibration_batch_size rows of calibration_task (str;
                      default: task), at input_length, shuffled by seed; 0: by weights alone)
    batch_size        global rows per step; num_microbatches splits it for gradient accumulation
    mesh              "DATAxMODEL" device mesh (e.g. "1x8", "2x4"): params, optimizer state,
                      activations and the KV cache sharded by gqa_jax.sharding.RULES, batch rows
                      over data; "" = one device. A multi-host run sets the mesh over all hosts'
                      devices and starts every process with GQA_JAX_COORDINATOR/NUM_PROCESSES/
                      PROCESS_ID (or GQA_JAX_DISTRIBUTED=auto on TPU pods; docs/sharding.md)
    fsdp              parameters and optimizer state also split over data (their d_model axis;
                      sharding.FSDP_RULES), gathered per layer: less memory per device, same results
    pack              several examples per row (segment ids), as T5X packs
    input_length, target_length   (int) override the task's lengths (None: the task's)
    num_train_steps, z_loss
    log_every, checkpoint_every, keep_checkpoints   (each >= 1; checkpoints are also written at
                      step 0, at every evaluation and at the end)
    eval_every        evaluate every N steps and at the end (0: only at the end, -1: never);
                      eval_at_start also scores the starting point (step 0); eval_examples caps
                      the dev examples decoded, eval_batch_size rows per decoding batch
    progress          a tqdm progress bar on stderr
    profile_steps     "A:B": a jax.profiler trace of steps A to B (metrics.jsonl's step numbers) in
                      WORKDIR/tensorboard, for TensorBoard's profile plugin or XProf; "": none
    restart_from_scratch  train from step 0 in a workdir that holds an earlier run's metrics but
                      no checkpoint to resume (its files are moved to previous/<time>/)

``parse_variant(variant, known, file)`` is the variant parser of the configs that build on this
one (``configs/x.py:key=value,key=value``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ml_collections import config_dict


def get_config(variant: str = "") -> config_dict.ConfigDict:
    parse_variant(variant, (), __file__)  # no variant keys
    c = config_dict.ConfigDict()
    c.recipe = "pretrain"
    c.task = "stdlib_span"
    c.data_dir = config_dict.placeholder(str)
    c.vocab = config_dict.placeholder(str)
    c.init_from = config_dict.placeholder(str)
    c.seed = 0
    c.batch_size = 32
    c.num_microbatches = 1
    c.mesh = ""
    c.fsdp = False
    c.pack = True
    c.input_length = config_dict.placeholder(int)  # None: the task's (span corruption derives the targets')
    c.target_length = config_dict.placeholder(int)
    c.num_train_steps = 1000
    c.z_loss = 1e-4
    c.model = config_dict.ConfigDict(
        {
            "preset": config_dict.placeholder(str),  # None: tiny from scratch, else the checkpoint's
            # the preset's shape, overridden field by field (None: the preset's)
            "d_model": config_dict.placeholder(int),
            "d_ff": config_dict.placeholder(int),
            "num_encoder_layers": config_dict.placeholder(int),
            "num_decoder_layers": config_dict.placeholder(int),
            "num_heads": config_dict.placeholder(int),
            "head_dim": config_dict.placeholder(int),
            "num_kv_heads": config_dict.placeholder(int),
            "grouped_attentions": config_dict.placeholder(tuple),
            "dropout_rate": 0.0,
            "dtype": config_dict.placeholder(str),
            "param_dtype": config_dict.placeholder(str),
            "remat": config_dict.placeholder(str),  # none | full | save_dots | save_dots_no_batch
            "scan_layers": config_dict.placeholder(bool),
        }
    )
    c.optimizer = config_dict.ConfigDict(
        {"warmup_steps": 10_000, "learning_rate": 1e-3, "schedule": config_dict.placeholder(str)}
    )
    c.uptrain = config_dict.ConfigDict(
        {
            "source": config_dict.placeholder(str),
            "num_kv_heads": 1,
            "method": "mean",
            "attentions": config_dict.placeholder(tuple),
            "alpha": 0.05,
            "original_steps": 1000,
            "source_step": config_dict.placeholder(int),
            "calibration_batches": 0,  # 0: no calibration (grouped and svd by weights alone)
            "calibration_batch_size": 8,
            "calibration_task": config_dict.placeholder(str),  # None: the run's task
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
    c.profile_steps = ""
    c.restart_from_scratch = False
    return c


def parse_variant(variant: str, known: Sequence[str], file: str) -> dict[str, str]:
    """``"a=1,b=x"`` -> ``{"a": "1", "b": "x"}``: the part after ``:`` in ``--config file.py:...``.

    A key not in ``known`` is a ValueError naming ``file`` and the known keys."""
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in variant.split(","))):
        if "=" not in item:
            raise ValueError(f"config variant item {item!r} must look like key=value")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    unknown = sorted(set(out) - set(known))
    if unknown:
        name = f"configs/{Path(file).name}"
        raise ValueError(f"{name}: unknown variant keys {unknown}; known: {', '.join(known) or 'none'}")
    return out
