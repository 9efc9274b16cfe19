"""``convert``: MHA -> GQA / MQA checkpoint conversion with a provenance manifest, or
``--check DST`` (re-derive DST from its manifest's source and compare bit for bit)."""

from __future__ import annotations

import argparse
import functools
import sys

from gqa_jax.cli import options

HELP = (
    "MHA -> GQA / MQA checkpoint conversion (mean pooling, the paper's, or another method of "
    "gqa_jax.conversion) with a manifest; or --check DST"
)
# Options that only apply to a calibrated conversion (given only with --calibration-batches).
CALIBRATION_OPTIONS = ("calibration_task", "calibration_batch_size", "calibration_input_length", "data_dir",
                       "vocab")  # fmt: skip


def add_args(p: argparse.ArgumentParser) -> None:
    from gqa_jax import conversion
    from gqa_jax.calibration import DEFAULT_BATCH_SIZE, DEFAULT_TASK
    from gqa_jax.config import ATTENTION_KINDS
    from gqa_jax.convert import DEFAULT_ATTENTIONS

    p.add_argument(
        "--src",
        help="source: a gqa_jax checkpoint, a HuggingFace T5 directory (safetensors or flax_model.msgpack) "
        "or a T5X checkpoint_N directory",
    )
    p.add_argument("--dst", help="destination gqa_jax checkpoint (gets manifest.json too)")
    p.add_argument(
        "--num-kv-heads",
        type=options.positive_int,
        help="target K/V heads K' of the converted attentions (1 = MQA); must divide the source's",
    )
    p.add_argument(
        "--method",
        choices=conversion.names(),
        help="new K/V head per group: "
        + "; ".join(f"{m.name}: {m.summary}" for m in conversion.METHODS)
        + " (docs/checkpoints.md)",
    )
    p.add_argument(
        "--attentions",
        default=None,
        help=f"comma-separated attentions to convert, from {','.join(ATTENTION_KINDS)} "
        f"(default: {','.join(DEFAULT_ATTENTIONS)} as in the paper)",
    )
    options.add_seed(
        p, help="PRNG seed of --method random and of the calibration batches' order (default: %(default)s)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing destination checkpoint")
    p.add_argument(
        "--calibration-batches",
        type=options.positive_int,
        metavar="N",
        help=f"calibrate --method {' or '.join(conversion.calibrated())} on N batches of data: heads are "
        "compared or fitted by their activations on those tokens, not by their weights; the "
        "statistics are stored in DST/calibration.npz (default: no calibration)",
    )
    p.add_argument(
        "--calibration-task",
        metavar="TASK",
        help=f"the task whose train split calibrates (default: {DEFAULT_TASK}, the span-corruption "
        "corpus of pre-training; `python -m gqa_jax data tasks` lists them)",
    )
    p.add_argument(
        "--calibration-batch-size",
        type=options.positive_int,
        metavar="B",
        help=f"rows per calibration batch (default: {DEFAULT_BATCH_SIZE})",
    )
    p.add_argument(
        "--calibration-input-length",
        type=options.positive_int,
        metavar="S",
        help="input tokens per calibration row (default: the task's)",
    )
    p.add_argument(
        "--data-dir",
        help="calibration: TFDS data dir holding the task (default: $GQA_JAX_DATA_DIR, $TFDS_DATA_DIR or "
        "~/tensorflow_datasets)",
    )
    p.add_argument(
        "--vocab",
        help="calibration: the SentencePiece model the source was trained with (default for stdlib_* "
        "tasks: the suite's vocabulary)",
    )
    p.add_argument(
        "--check",
        metavar="DST",
        help="instead of converting: re-derive DST from its manifest's source (and, if calibrated, its "
        "stored statistics) and compare bit for bit (exit 0 if it matches, 1 if not)",
    )


def run(args: argparse.Namespace) -> int:
    from gqa_jax import calibration, convert

    options_given = ("src", "dst", "num_kv_heads", "method", "attentions", "calibration_batches")
    given = [f for f in (*options_given, *CALIBRATION_OPTIONS) if getattr(args, f) is not None]
    try:
        if args.check is not None:
            if given or args.overwrite:
                names = [f"--{f.replace('_', '-')}" for f in given] or ["--overwrite"]
                raise ValueError(f"--check DST takes no other options (got {', '.join(names)})")
            problems = convert.check_conversion(args.check)
            if problems:
                print(f"FAILED: {args.check} does not match its re-derived conversion:")
                print("\n".join(f"  {p}" for p in problems))
                return 1
            print(f"OK: {args.check} is bit-identical to its re-derived conversion")
            return 0
        missing = [
            f"--{f.replace('_', '-')}" for f in ("src", "dst", "num_kv_heads", "method") if f not in given
        ]
        if missing:
            raise ValueError(f"missing {', '.join(missing)} (or use --check DST)")
        attentions = convert.DEFAULT_ATTENTIONS
        if args.attentions is not None:
            attentions = options.comma_list(args.attentions)
        calibrate = None
        if args.calibration_batches is not None:
            calibrate = functools.partial(
                calibration.gather,
                attentions=attentions,
                task=args.calibration_task or calibration.DEFAULT_TASK,
                data_dir=args.data_dir,
                vocab=args.vocab,
                batches=args.calibration_batches,
                batch_size=args.calibration_batch_size or calibration.DEFAULT_BATCH_SIZE,
                input_length=args.calibration_input_length,
                seed=args.seed,
            )
        else:
            stray = [f"--{f.replace('_', '-')}" for f in CALIBRATION_OPTIONS if f in given]
            if stray:
                raise ValueError(
                    f"{', '.join(stray)} only apply to a calibrated conversion: add --calibration-batches N"
                )
        path, manifest = convert.convert_checkpoint(
            args.src,
            args.dst,
            args.num_kv_heads,
            args.method,
            attentions=attentions,
            seed=args.seed,
            overwrite=args.overwrite,
            calibrate=calibrate,
        )
    except (FileNotFoundError, FileExistsError) as e:
        print(f"{options.PROG} convert: error: {e}", file=sys.stderr)
        return 2
    source = manifest["source"]
    print(f"converted {source['path']} ({source['kind']}) -> {path}")
    seed = f" (seed {manifest['seed']})" if manifest["seed"] is not None else ""
    print(f"  method {manifest['method']}{seed}")
    for kind, g in manifest["groups"].items():
        print(f"  {kind}: K/V heads {g['source_kv_heads']} -> {g['target_kv_heads']}, groups {g['groups']}")
    c = manifest["calibration"]
    if c is not None:
        print(
            f"  calibrated on {c['batches']} batch(es) of {c['batch_size']} rows of {c['task']} "
            f"({c['split']}, seed {c['seed']}): {c['tokens']['encoder']} encoder and "
            f"{c['tokens']['decoder']} decoder tokens; statistics {path / c['file']}"
        )
    print(f"  source params sha256 {manifest['source_params_sha256']}")
    print(f"  target params sha256 {manifest['target_params_sha256']}")
    print(f"  manifest {path / convert.MANIFEST}")
    return 0
