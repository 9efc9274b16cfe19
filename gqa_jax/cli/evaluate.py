"""``evaluate``: score a checkpoint on a task's split by greedy decoding; writes results.json."""

from __future__ import annotations

import argparse

from gqa_jax.cli import options

HELP = "score a checkpoint on a task's split (greedy decoding, the task's metric): results.json"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", required=True, help="the run directory (results.json, decodes.jsonl)")
    p.add_argument(
        "--model",
        required=True,
        help="a gqa_jax checkpoint (e.g. RUN/best_model), HF T5 directory or T5X checkpoint_N",
    )
    options.add_task_examples(p, split_help="the split (default: %(default)s, as the paper)")
    p.add_argument(
        "--examples", type=options.positive_int, default=None, help="the first N examples (default: all)"
    )
    p.add_argument(
        "--batch-size", type=options.positive_int, default=32, help="rows per decode (default: 32)"
    )
    options.add_cache_dtype(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing results.json")


def run(args: argparse.Namespace) -> int:
    from gqa_jax.experiments.evaluate_stage import evaluate_checkpoint

    result = evaluate_checkpoint(
        args.workdir, args.model, args.task, split=args.split, examples=args.examples,
        batch_size=args.batch_size, data_dir=args.data_dir, vocab=args.vocab,
        input_length=args.input_length, target_length=args.target_length, cache_dtype=args.cache_dtype,
        overwrite=args.overwrite,
    )  # fmt: skip
    print(f"{result['task']} {result['split']}: {result['metric']} {result['primary']:.2f}, "
          f"teacher-forced loss {result['loss']:.4f} on {result['examples']} examples")  # fmt: skip
    return 0
