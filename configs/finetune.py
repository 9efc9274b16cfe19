"""Fine-tune on a task (the paper's recipe: constant learning rate 0.001, dropout 0.1, greedy
decoding for evaluation, keep the checkpoint with the best dev score).

    python -m gqa_jax train --config configs/finetune.py:task=stdlib_docsum,init=runs/pt/model \\
        --workdir runs/ft --config.batch_size=16 --config.input_length=256 --config.num_train_steps=300 \\
        --config.eval_examples=200 --config.eval_every=100

From configs/pretrain.py's 400-step model (``runs/pt``): batch 16, 256 input tokens, 300 steps,
ROUGE-1 on 200 dev examples; its runtime and scores, and why the mini (experiments/mini.py)
fine-tunes at ``--config.optimizer.learning_rate=0.005`` falling linearly to 0
(``--config.optimizer.schedule=linear``) instead of the paper's constant 0.001, are in
docs/results/training.md.

Variant keys: ``task`` (a key of gqa_jax.data.tasks.TASKS or a task file), ``init`` (a gqa_jax checkpoint,
HF T5 directory or T5X checkpoint_N; without it the model starts from random weights), ``model`` (preset when
starting from scratch), ``steps``. The fields and their defaults: configs/base.py.
"""

from pathlib import Path

from gqa_jax import run_config


def get_config(variant: str = ""):
    base = run_config.load_module(Path(__file__).with_name("base.py"))  # configs load by path
    v = base.parse_variant(variant, ("task", "init", "model", "steps"), __file__)
    c = base.get_config()
    c.recipe = "finetune"
    c.task = v.get("task", "stdlib_docsum")
    c.init_from = v.get("init")
    c.model.preset = v.get("model")  # None: tiny from random weights (init= has its own shape)
    c.model.dropout_rate = 0.1
    c.optimizer.learning_rate = 1e-3
    c.pack = True
    c.eval_at_start = True  # the untrained score, for comparison
    c.num_train_steps = int(v.get("steps", 1000))
    return c
