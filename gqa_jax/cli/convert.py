"""``convert``: MHA -> GQA / MQA checkpoint conversion with a provenance manifest, or
``--check DST`` (re-derive DST from its manifest's source and compare bit for bit)."""

from __future__ import annotations

import argparse
import sys

from gqa_jax.cli import options

HELP = "MHA -> GQA / MQA checkpoint conversion (mean, first, random) with a manifest; or --check DST"


def add_args(p: argparse.ArgumentParser) -> None:
    from gqa_jax.config import ATTENTION_KINDS
    from gqa_jax.convert import DEFAULT_ATTENTIONS, METHODS

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
        choices=METHODS,
        help="new K/V head per group: mean (the paper's), first, random; grouped (groups by similarity), "
        "aligned (rotated onto the group's first head), svd (the group's best rank-H fit); "
        "docs/checkpoints.md",
    )
    p.add_argument(
        "--attentions",
        default=None,
        help=f"comma-separated attentions to convert, from {','.join(ATTENTION_KINDS)} "
        f"(default: {','.join(DEFAULT_ATTENTIONS)} as in the paper)",
    )
    options.add_seed(p, help="PRNG seed of --method random (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing destination checkpoint")
    p.add_argument(
        "--check",
        metavar="DST",
        help="instead of converting: re-derive DST from its manifest's source and compare bit for bit "
        "(exit 0 if it matches, 1 if not)",
    )


def run(args: argparse.Namespace) -> int:
    from gqa_jax import convert

    given = [
        f for f in ("src", "dst", "num_kv_heads", "method", "attentions") if getattr(args, f) is not None
    ]
    try:
        if args.check is not None:
            if given or args.overwrite:
                raise ValueError(
                    f"--check DST takes no other options (got {', '.join(given or ['overwrite'])})"
                )
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
        path, manifest = convert.convert_checkpoint(
            args.src,
            args.dst,
            args.num_kv_heads,
            args.method,
            attentions=attentions,
            seed=args.seed,
            overwrite=args.overwrite,
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
    print(f"  source params sha256 {manifest['source_params_sha256']}")
    print(f"  target params sha256 {manifest['target_params_sha256']}")
    print(f"  manifest {path / convert.MANIFEST}")
    return 0
