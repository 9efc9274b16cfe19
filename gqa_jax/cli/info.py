"""``info``: parameter counts, K/V heads and KV-cache bytes of a T5.1.1 preset (nothing allocated)."""

from __future__ import annotations

import argparse

from gqa_jax.cli import options

HELP = "parameter counts, K/V heads and KV-cache bytes of a preset (nothing allocated)"


def add_args(p: argparse.ArgumentParser) -> None:
    from gqa_jax.config import ATTENTION_KINDS, PRESETS

    p.add_argument(
        "--preset",
        required=True,
        help=f"model preset: one of {', '.join(PRESETS)}, or 'all' for a table of the five T5.1.1 presets",
    )
    p.add_argument(
        "--num-kv-heads",
        type=int,
        default=None,
        help="K/V heads K of the grouped attentions (1 = MQA; must divide the query heads) "
        "(default: MHA, K = num_heads)",
    )
    p.add_argument(
        "--attentions",
        default=None,
        help=f"comma-separated attentions that use --num-kv-heads, from {','.join(ATTENTION_KINDS)}; "
        "'' for none (default: decoder_self,cross as in the paper)",
    )
    options.add_batch(p, default=1, help="batch size for the cache bytes (default: %(default)s)")
    options.add_input_len(
        p,
        default=2048,
        help="encoder length S of the cross-attention cache (default: %(default)s, as in the paper's Fig. 6)",
    )
    options.add_output_len(
        p,
        default=512,
        help="decoder length T of the self-attention cache (default: %(default)s, as in the paper's Fig. 6)",
    )
    from gqa_jax.kv_quant import CACHE_DTYPES

    options.add_dtype(
        p,
        default="bfloat16",
        choices=CACHE_DTYPES,
        help="cache element dtype; int8 / fp8 add a float32 scale per token and K/V head "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--mesh",
        default=None,
        metavar="DATAxMODEL",
        help="also show how the decode cache lies on this mesh's devices: its spec, shards and bytes "
        "per device (nothing allocated; e.g. 1x8)",
    )


def run(args: argparse.Namespace) -> int:
    from gqa_jax import sharding
    from gqa_jax.config import preset
    from gqa_jax.tools import info

    attentions = None if args.attentions is None else options.comma_list(args.attentions)
    cache_args = dict(
        batch=args.batch, input_len=args.input_len, output_len=args.output_len, dtype=args.dtype
    )
    if args.preset == "all":
        print(
            info.presets_report(num_kv_heads=args.num_kv_heads, grouped_attentions=attentions, **cache_args)
        )
        return 0
    overrides = {"num_kv_heads": args.num_kv_heads}
    if attentions is not None:
        overrides["grouped_attentions"] = attentions
    if args.mesh is not None:
        sharding.parse_mesh_shape(args.mesh)  # a bad mesh is one line, before any work
    config = preset(args.preset, **overrides)
    print(info.info_report(config, name=args.preset, mesh=args.mesh, **cache_args))
    return 0
