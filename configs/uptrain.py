"""Uptrain: convert an MHA checkpoint to GQA-K / MQA and continue pre-training for alpha x steps.

    python -m gqa_jax train --config configs/uptrain.py:source=runs/pt/model,kv=1,original_steps=400 \\
        --workdir runs/up_mqa --config.batch_size=16 --config.input_length=128

The paper's recipe (section 2.1): mean-pool each group's K and V heads (``method``: mean; the
other methods of ``gqa_jax.conversion``: docs/checkpoints.md), then train
``round(alpha x original_steps)`` steps of the original pre-training (span corruption, same
schedule continued from the source's step). From configs/pretrain.py's 400-step run
(``runs/pt``), that command trains alpha 0.05 of 400 = 20 steps (``kv=2``: GQA-2; measured:
docs/results/training.md). ``alpha=0`` trains no step: the conversion is saved as ``model/`` and, with
``--config.eval_at_start=True``, scored on dev (the mini's Fig. 5 at alpha 0).

Variant keys: ``source`` (a gqa_jax checkpoint, HF T5 directory or T5X checkpoint_N), ``kv`` (K/V
heads, 1 = MQA), ``method``, ``alpha`` (paper: 0.05; 0: convert only), ``original_steps`` (the
source's pre-training steps; default 1000), ``task``, ``calibration`` (a method that calibrates:
batches of the task that calibrate the conversion; default 0, none). The fields and their defaults:
configs/base.py.
"""

from pathlib import Path

from gqa_jax import run_config


def get_config(variant: str = ""):
    base = run_config.load_module(Path(__file__).with_name("base.py"))  # configs load by path
    keys = ("source", "kv", "method", "alpha", "original_steps", "task", "calibration")
    v = base.parse_variant(variant, keys, __file__)
    c = base.get_config()
    c.recipe = "uptrain"
    c.task = v.get("task", "stdlib_span")
    c.uptrain.source = v.get("source")
    c.uptrain.num_kv_heads = int(v.get("kv", 1))
    c.uptrain.method = v.get("method", "mean")
    c.uptrain.alpha = float(v.get("alpha", 0.05))
    c.uptrain.original_steps = int(v.get("original_steps", 1000))
    c.uptrain.calibration_batches = int(v.get("calibration", 0))
    return c
