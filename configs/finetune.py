"""Fine-tune on a task (the paper's recipe: constant learning rate 0.001, dropout 0.1, greedy
decoding for evaluation, keep the checkpoint with the best dev score).

    python -m gqa_jax train --config configs/finetune.py:task=stdlib_docsum,init=runs/pretrain_tiny/model \\
        --workdir runs/docsum_tiny

Variant keys: ``task`` (a key of gqa_jax.data.tasks.TASKS), ``init`` (a gqa_jax checkpoint or
HF T5 directory; without it the model starts from random weights), ``model`` (preset when
starting from scratch), ``steps``.
"""

from gqa_jax.run_config import base_train_config, parse_variant


def get_config(variant: str = ""):
    v = parse_variant(variant)
    c = base_train_config()
    c.recipe = "finetune"
    c.task = v.pop("task", "stdlib_docsum")
    c.init_from = v.pop("init", None)
    c.model.preset = v.pop("model", "tiny")
    c.model.dropout_rate = 0.1
    c.optimizer.learning_rate = 1e-3
    c.pack = True
    c.eval_at_start = True  # the untrained score, for comparison
    c.num_train_steps = int(v.pop("steps", 1000))
    if v:
        raise ValueError(
            f"configs/finetune.py: unknown variant keys {sorted(v)}; known: task, init, model, steps"
        )
    return c
