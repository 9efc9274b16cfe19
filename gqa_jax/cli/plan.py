"""``plan``: per-device memory of the sharded train step and decode loop on a mesh, compiled
ahead of time on abstract shapes (params, optimizer state, KV cache, temporaries, fits?, the
largest batch that fits)."""

from __future__ import annotations

import argparse

from gqa_jax.cli import options

HELP = (
    "per-device memory of the sharded train step and decode loop on a mesh, compiled ahead of time "
    "(params, optimizer state, KV cache, temporaries, fits?, largest batch)"
)


def add_args(p: argparse.ArgumentParser) -> None:
    from gqa_jax.config import DTYPES, PRESETS, REMAT_POLICIES
    from gqa_jax.tools.plan import DEFAULT_HBM_GIB, PROGRAMS

    p.add_argument("--preset", required=True, choices=PRESETS, help="model shape")
    p.add_argument(
        "--num-kv-heads",
        type=options.positive_int,
        default=None,
        help="K/V heads K of decoder self- and cross-attention (1 = MQA; must divide the query heads) "
        "(default: MHA, K = num_heads)",
    )
    p.add_argument("--mesh", default="1x8", help="DATAxMODEL devices (default: %(default)s)")
    p.add_argument(
        "--topology",
        default=None,
        help="compile for a TPU slice with libtpu's compiler on this host, no TPU needed (e.g. v4:2x4x4, "
        "v5e:2x4, v5p:2x2x1; chips): --mesh must hold all its chips; needs requirements-tpu.txt",
    )
    options.add_batch(p, required=True, help="rows per step, a multiple of the data axis size")
    options.add_input_len(p, default=2048)
    options.add_output_len(
        p, default=512, help="target length of the train step and decoded tokens T (default: %(default)s)"
    )
    p.add_argument(
        "--hbm-gib",
        type=float,
        default=None,
        help=f"memory per device, GiB (default: the TPU chip's with --topology, else {DEFAULT_HBM_GIB:g}, "
        "TPU v4; v5p 95, H100 80)",
    )
    options.add_dtype(
        p,
        default="bfloat16",
        choices=DTYPES,
        help="activations, decode params and KV cache (default: %(default)s)",
    )
    options.add_cache_dtype(p)
    options.add_decode(p)
    p.add_argument(
        "--param-dtype",
        default="float32",
        choices=DTYPES,
        help="the train step's params and optimizer state (default: %(default)s)",
    )
    p.add_argument(
        "--num-microbatches",
        type=options.positive_int,
        default=1,
        help="gradient accumulation in the train step (default: %(default)s)",
    )
    p.add_argument(
        "--remat",
        default="none",
        choices=REMAT_POLICIES,
        help="the train step's rematerialization: what each layer keeps for the backward pass "
        "(default: %(default)s, keeps every activation)",
    )
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="the train step's params and optimizer state also split over the data axis (FSDP)",
    )
    p.add_argument(
        "--scan-layers",
        action="store_true",
        help="the train step's layers as one lax.scan: one layer compiled instead of each",
    )
    p.add_argument(
        "--programs",
        default=",".join(PROGRAMS),
        help="comma-separated programs to compile, from train,decode (default: %(default)s)",
    )
    p.add_argument(
        "--batch-search",
        default=",".join(PROGRAMS),
        help="programs whose largest fitting batch is searched (2-4 more compiles each); '' or none "
        "for none (default: %(default)s)",
    )
    p.add_argument(
        "--no-batch-search", action="store_true", help="no batch search (same as --batch-search none)"
    )
    p.add_argument(
        "--cache-layout",
        default="auto",
        choices=("auto", "heads"),
        help="the decode cache's layout: auto, its K/V heads over model as far as K allows and its rows "
        "over the rest (docs/sharding.md); heads, the K/V heads over model alone, the cache replicated "
        "where K is smaller (to compare) (default: %(default)s)",
    )
    options.add_json(p)


def run(args: argparse.Namespace) -> int:
    from gqa_jax.log import log
    from gqa_jax.tools import plan, plan_report

    def names(text: str) -> tuple[str, ...]:
        return tuple(n for n in options.comma_list(text) if n != "none")

    programs = names(args.programs)
    search = () if args.no_batch_search else tuple(p for p in names(args.batch_search) if p in programs)
    unknown = [n for n in (*programs, *names(args.batch_search)) if n not in plan.PROGRAMS]
    if unknown:
        raise ValueError(f"unknown program(s) {unknown}; choose from {', '.join(plan.PROGRAMS)}")
    settings = plan.PlanSettings(
        preset=args.preset, num_kv_heads=args.num_kv_heads, mesh=args.mesh, batch=args.batch,
        input_len=args.input_len, output_len=args.output_len, hbm_gib=args.hbm_gib, dtype=args.dtype,
        cache_dtype=args.cache_dtype, param_dtype=args.param_dtype, num_microbatches=args.num_microbatches,
        remat=args.remat,
        fsdp=args.fsdp, scan_layers=args.scan_layers, programs=programs, batch_search=search,
        topology=args.topology, cache_layout=args.cache_layout, decode=args.decode,
    )  # fmt: skip
    res = plan.plan(settings, log=log)
    print(plan_report.report(res), flush=True)
    options.write_json(res, args.json)
    return 0
