"""Training: the state, THE train step, evaluation, the run directory and the one ``train()`` loop.

Floors inside the package: ``state`` (TrainState, Adafactor, schedules, shardings) <- ``step``
(loss, ``make_train_step``) <- ``evaluation``, ``validate`` (config checks), ``workdir`` (its
files, checkpoints, restarts), ``lock`` (who holds the workdir) <- ``journal`` (undoing a failed
start), ``stops`` (SIGINT / SIGTERM) <- ``loop`` (``train()``). The names below are the package's
public API.
"""

from gqa_jax.training.evaluation import evaluate
from gqa_jax.training.loop import init_model, load_vocab, num_steps, train
from gqa_jax.training.state import (
    FINETUNE_LR,
    T5_WARMUP_STEPS,
    OptimizerConfig,
    TrainState,
    create_state,
    init_state,
    make_optimizer,
    make_schedule,
    split_model,
    state_shardings,
)
from gqa_jax.training.step import Z_LOSS, cross_entropy, make_eval_step, make_train_step, train_step
from gqa_jax.training.validate import RECIPES, check_config
from gqa_jax.training.workdir import RESTART_MAY_CHANGE

__all__ = [
    "FINETUNE_LR", "RECIPES", "RESTART_MAY_CHANGE", "T5_WARMUP_STEPS", "Z_LOSS", "OptimizerConfig",
    "TrainState", "check_config", "create_state", "cross_entropy", "evaluate", "init_model", "init_state",
    "load_vocab", "make_eval_step", "make_optimizer", "make_schedule", "make_train_step", "num_steps",
    "split_model", "state_shardings", "train", "train_step",
]  # fmt: skip
