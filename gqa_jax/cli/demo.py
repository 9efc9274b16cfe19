"""``demo``: the embedded mini reproduction of Table 1 (``gqa_jax.reproduce``): pre-train MHA,
uptrain to GQA-2 / MQA, fine-tune, ROUGE-1 and decoding time, on the Python stdlib, offline."""

from __future__ import annotations

import argparse

HELP = "the mini reproduction: pre-train, uptrain to GQA / MQA, fine-tune, score, time decoding"


def add_args(p: argparse.ArgumentParser) -> None:
    from gqa_jax.reproduce import SCALES

    p.add_argument("--workdir", default="runs/mini", help="where the runs go (default: %(default)s)")
    p.add_argument(
        "--data-dir",
        default=None,
        help="TFDS data dir for the stdlib suite (default: $GQA_JAX_DATA_DIR, $TFDS_DATA_DIR or "
        "~/tensorflow_datasets)",
    )
    p.add_argument(
        "--scale",
        default="default",
        choices=list(SCALES),
        help="default: about 13 minutes on 2 CPU cores (suite build included); quick: a smoke run of "
        "a minute or two",
    )


def run(args: argparse.Namespace) -> int:
    from gqa_jax import reproduce
    from gqa_jax.log import log

    result = reproduce.run(args.workdir, data_dir=args.data_dir, scale=args.scale, log=log)
    print(reproduce.table(result), flush=True)
    return 0
