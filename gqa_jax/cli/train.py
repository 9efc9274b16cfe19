"""``train``: pre-train, uptrain or fine-tune, ``--config configs/<file>.py[:variant] --workdir DIR``
plus any ``--config.FIELD=VALUE`` / ``--config.FIELD VALUE`` overrides (``ml_collections``'
``config_flags`` on absl flags, through ``gqa_jax.run_config``)."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "pre-train, uptrain or fine-tune (--config configs/<file>.py[:variant] --workdir DIR)"
# The arguments argparse does not know are the --config.FIELD overrides: they go to absl.
TAKES_EXTRA_ARGS = True


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        required=True,
        help="configs/<file>.py[:variant], e.g. configs/finetune.py:task=x; or a shipped config's name "
        "(pretrain, uptrain, finetune, base), e.g. finetune:task=x, from any directory",
    )
    p.add_argument("--workdir", required=True, help="run directory (an existing one is resumed)")
    p.set_defaults(extra=[])
    p.epilog = (
        "Any --config.FIELD=VALUE or --config.FIELD VALUE overrides a config field, e.g. "
        "--config.batch_size=8 --config.model.num_kv_heads 2; a value must fit the field's type; a bool "
        "also --config.FIELD / --noconfig.FIELD; a tuple: the flag repeated or one literal "
        "--config.FIELD=\"('a', 'b')\" (the fields: configs/base.py)."
    )


def config(args: argparse.Namespace) -> Any:
    """The run's ``ConfigDict``: ``--config``'s file and variant with the overrides applied."""
    from gqa_jax import run_config

    return run_config.load(args.config, args.extra)


def run(args: argparse.Namespace) -> int:
    from gqa_jax import distributed, training

    cfg = config(args)  # a bad config fails here, before a multi-host run waits for its peers
    # A multi-host run (GQA_JAX_COORDINATOR=... or GQA_JAX_DISTRIBUTED=auto) joins before any device use.
    distributed.initialize_distributed()
    summary = training.train(cfg, args.workdir)
    print(" ".join(f"{k}={v}" for k, v in summary.items()))
    return 0
