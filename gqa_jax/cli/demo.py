"""``demo``: the embedded mini reproduction (``gqa_jax.reproduce``): the ``experiments/mini.py``
sweep on the Python stdlib, offline, and its report (Table 1, Figures 3-6, the paper's claims)."""

from __future__ import annotations

import argparse

from gqa_jax.cli import options

HELP = (
    "the mini reproduction: the experiments/mini.py sweep (pre-train, uptrain, fine-tune, time), its report"
)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root",
        "--workdir",
        dest="root",
        default="runs/mini",
        help="where the runs go (default: %(default)s)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="TFDS data dir for the stdlib suite (default: $GQA_JAX_DATA_DIR, $TFDS_DATA_DIR or "
        "~/tensorflow_datasets)",
    )
    p.add_argument(
        "--scale",
        default="default",
        help="default: the mini reproduction for a laptop CPU (its wall time: docs/experiments.md); quick: a "
        "smoke run of a few minutes; large: for a GPU or TPU host (experiments/mini.py has each scale's "
        "settings)",
    )
    p.add_argument(
        "--jobs", type=options.positive_int, default=2, help="runs at once (time runs run alone; default: 2)"
    )
    options.add_redo_changed(p)


def run(args: argparse.Namespace) -> int:
    from gqa_jax import reproduce
    from gqa_jax.log import log

    result = reproduce.run(
        args.root,
        data_dir=args.data_dir,
        scale=args.scale,
        jobs=args.jobs,
        redo_changed=args.redo_changed,
        log=log,
    )
    print(result["report"]["report.md"].read_text(), flush=True)
    minutes, where = result["seconds"] / 60, result["report"]["report.md"].parent
    log(f"mini reproduction: {minutes:.1f} min; report in {where}")
    return result["returncode"]
