"""Uptrain: convert an MHA checkpoint to GQA-K / MQA and continue pre-training for alpha x steps.

    python -m gqa_jax train --config configs/uptrain.py:source=runs/pretrain_tiny/model,kv=1 \\
        --workdir runs/uptrain_tiny_mqa

The paper's recipe (section 2.1): mean-pool each group's K and V heads (``method``: mean, first
or random), then train ``round(alpha x original_steps)`` steps of the original pre-training
(span corruption, same schedule continued from the source's step). Variant keys: ``source``
(a gqa_jax checkpoint directory or HF T5 directory), ``kv`` (K/V heads, 1 = MQA), ``method``,
``alpha`` (paper: 0.05), ``original_steps`` (the source's pre-training steps), ``task``.
"""

from gqa_jax.run_config import base_train_config, parse_variant


def get_config(variant: str = ""):
    v = parse_variant(variant)
    c = base_train_config()
    c.recipe = "uptrain"
    c.task = v.pop("task", "stdlib_span")
    c.uptrain.source = v.pop("source", None)
    c.uptrain.num_kv_heads = int(v.pop("kv", 1))
    c.uptrain.method = v.pop("method", "mean")
    c.uptrain.alpha = float(v.pop("alpha", 0.05))
    c.uptrain.original_steps = int(v.pop("original_steps", 1000))
    if v:
        raise ValueError(
            f"configs/uptrain.py: unknown variant keys {sorted(v)}; "
            "known: source, kv, method, alpha, original_steps, task"
        )
    return c
