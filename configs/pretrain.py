"""Pre-train a T5.1.1 model from scratch with span corruption (T5's objective).

    python -m gqa_jax data build-suite     # once: the stdlib suite and its vocabulary (~1 min)
    python -m gqa_jax train --config configs/pretrain.py --workdir runs/pt \\
        --config.num_train_steps=400 --config.batch_size=16 --config.input_length=128

That is the measured run (the tiny preset on ``stdlib_span``, 400 steps of batch 16 at 128 input
tokens; its runtime and losses: docs/results/training.md). Its
``runs/pt/model`` is what configs/uptrain.py and configs/finetune.py start from.

Defaults (without the overrides: no measured numbers): the tiny preset on the embedded
``stdlib_span`` corpus, 1000 steps of batch 32 packed rows at the task's lengths, Adafactor with
T5's rsqrt schedule (10k warm-up steps), no dropout. A paper-size run, e.g.

    python -m gqa_jax train --config configs/pretrain.py:model=small,task=c4_span --workdir DIR \\
        --config.vocab=/path/to/t5/sentencepiece.model

Variant keys: ``model`` (a preset), ``task``, ``kv`` (num_kv_heads of the grouped attentions),
``steps``. The fields and their defaults: configs/base.py.
"""

from pathlib import Path

from gqa_jax import run_config


def get_config(variant: str = ""):
    base = run_config.load_module(Path(__file__).with_name("base.py"))  # configs load by path
    v = base.parse_variant(variant, ("task", "model", "kv", "steps"), __file__)
    c = base.get_config()
    c.recipe = "pretrain"
    c.task = v.get("task", "stdlib_span")
    c.model.preset = v.get("model", "tiny")
    if "kv" in v:
        c.model.num_kv_heads = int(v["kv"])
    c.num_train_steps = int(v.get("steps", 1000))
    return c
