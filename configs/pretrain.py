"""Pre-train a T5.1.1 model from scratch with span corruption (T5's objective).

    python -m gqa_jax train --config configs/pretrain.py --workdir runs/pretrain_tiny
    python -m gqa_jax train --config configs/pretrain.py:model=small,task=c4_span --workdir DIR \\
        --config.vocab=/path/to/t5/sentencepiece.model

Defaults: the tiny preset on the embedded ``stdlib_span`` corpus (build it first with
``python -m gqa_jax data build-suite``), batch 32 packed rows of 512/114 tokens, Adafactor with
T5's rsqrt schedule (10k warm-up steps), no dropout. Variant keys: ``model`` (a preset),
``task``, ``kv`` (num_kv_heads of the grouped attentions), ``steps``.
"""

from gqa_jax.run_config import base_train_config, parse_variant


def get_config(variant: str = ""):
    v = parse_variant(variant)
    c = base_train_config()
    c.recipe = "pretrain"
    c.task = v.pop("task", "stdlib_span")
    c.model.preset = v.pop("model", "tiny")
    if "kv" in v:
        c.model.num_kv_heads = int(v.pop("kv"))
    c.num_train_steps = int(v.pop("steps", 1000))
    if v:
        raise ValueError(
            f"configs/pretrain.py: unknown variant keys {sorted(v)}; known: task, model, kv, steps"
        )
    return c
