"""``python -m gqa_jax <command>``: a thin command line over the library.

Commands:
  demo     the main job: the embedded mini reproduction of Table 1 (pre-train MHA, uptrain to
           GQA-2 / MQA, fine-tune, ROUGE-1 and decoding time), on the Python stdlib, offline.
  convert  MHA -> GQA / MQA checkpoint conversion with a provenance manifest (or --check DST).
  info     parameter counts, K/V heads and KV-cache bytes of a T5.1.1 preset (nothing allocated).
  bench    benchmarks: `bench decode` (cache vs none, MHA / GQA / MQA, the floor, HuggingFace),
           `bench train` (tokens/s and MFU against the measured matmul peak), `bench step`
           (where a decode step's time goes, op by op).
  data     tasks, dataset preparation, the embedded stdlib suite, vocabularies (``data --help``).
  train    pre-train, uptrain or fine-tune: --config configs/<file>.py[:variant] --workdir DIR.
  plan     per-device memory of the sharded train step and decode loop on a mesh, compiled ahead
           of time on abstract shapes (params, optimizer state, KV cache, temporaries, fits?,
           the largest batch that fits).

Each command is a pair (add its arguments to a parser, run it on the parsed args -> exit code)
in ``COMMANDS``. Bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

PROG = "python -m gqa_jax"


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr (exit code 2), without the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


# ------------------------------------------------------------------------------------ info
def _add_info_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--batch", type=_positive_int, default=1, help="batch size for the cache bytes (default: %(default)s)"
    )
    p.add_argument(
        "--input-len",
        type=_positive_int,
        default=2048,
        help="encoder length S of the cross-attention cache (default: %(default)s, as in the paper's Fig. 6)",
    )
    p.add_argument(
        "--output-len",
        type=_positive_int,
        default=512,
        help="decoder length T of the self-attention cache (default: %(default)s, as in the paper's Fig. 6)",
    )
    p.add_argument("--dtype", default="bfloat16", help="cache element dtype (default: %(default)s)")


def _run_info(args: argparse.Namespace) -> int:
    from gqa_jax import info
    from gqa_jax.config import preset

    attentions = None
    if args.attentions is not None:
        attentions = tuple(a.strip() for a in args.attentions.split(",") if a.strip())
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
    config = preset(args.preset, **overrides)
    print(info.info_report(config, name=args.preset, **cache_args))
    return 0


# ------------------------------------------------------------------------------------ demo
def _add_demo_args(p: argparse.ArgumentParser) -> None:
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


def _run_demo(args: argparse.Namespace) -> int:
    """The embedded mini reproduction of Table 1 (gqa_jax.reproduce)."""
    from gqa_jax import reproduce

    result = reproduce.run(args.workdir, data_dir=args.data_dir, scale=args.scale, log=_log_stderr)
    print(reproduce.table(result), flush=True)
    return 0


# --------------------------------------------------------------------------------- convert
def _add_convert_args(p: argparse.ArgumentParser) -> None:
    from gqa_jax.config import ATTENTION_KINDS
    from gqa_jax.convert import DEFAULT_ATTENTIONS, METHODS

    p.add_argument("--src", help="source: a gqa_jax checkpoint or a HuggingFace T5 directory (safetensors)")
    p.add_argument("--dst", help="destination gqa_jax checkpoint (gets manifest.json too)")
    p.add_argument(
        "--num-kv-heads",
        type=_positive_int,
        help="target K/V heads K' of the converted attentions (1 = MQA); must divide the source's",
    )
    p.add_argument(
        "--method", choices=METHODS, help="new K/V head per group: mean (the paper's), first, random"
    )
    p.add_argument(
        "--attentions",
        default=None,
        help=f"comma-separated attentions to convert, from {','.join(ATTENTION_KINDS)} "
        f"(default: {','.join(DEFAULT_ATTENTIONS)} as in the paper)",
    )
    p.add_argument("--seed", type=int, default=0, help="PRNG seed of --method random (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing destination checkpoint")
    p.add_argument(
        "--check",
        metavar="DST",
        help="instead of converting: re-derive DST from its manifest's source and compare bit for bit "
        "(exit 0 if it matches, 1 if not)",
    )


def _run_convert(args: argparse.Namespace) -> int:
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
            attentions = tuple(a.strip() for a in args.attentions.split(",") if a.strip())
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
        print(f"{PROG} convert: error: {e}", file=sys.stderr)
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


# ----------------------------------------------------------------------------------- bench
def _add_decode_shape_args(p: argparse.ArgumentParser) -> None:
    """The model and shapes of `bench decode` and `bench step`."""
    from gqa_jax.config import PRESETS

    p.add_argument("--preset", default="small", choices=PRESETS, help="model shape (default: %(default)s)")
    p.add_argument("--batch", type=_positive_int, default=8, help="batch size B (default: %(default)s)")
    p.add_argument(
        "--input-len", type=_positive_int, default=512, help="input length S (default: %(default)s)"
    )
    p.add_argument(
        "--new-tokens", type=_positive_int, default=64, help="new tokens T per row (default: %(default)s)"
    )
    p.add_argument(
        "--kv-heads",
        default=None,
        help="comma-separated K/V head counts, divisors of num_heads; N (MHA) is always added "
        "(default: N, N/2, N/4, 1 rounded down to divisors, deduplicated: 6,3,1 for small)",
    )


def _add_bench_args(p: argparse.ArgumentParser) -> None:
    from gqa_jax.config import DTYPES

    sub = p.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    d = sub.add_parser(
        "decode",
        help="decoding speed: cache vs none, MHA / GQA / MQA, the floor, HuggingFace generate",
        description="Decoding benchmark (Markdown tables on stdout, progress on stderr): a. with vs "
        "without KV cache; b. per K/V-head count: cache bytes, tokens/s, time per sample, TTFT, TPOT, "
        "p50/p95 step latency; c. time over the bandwidth / FLOP floor; d. HuggingFace generate on "
        "the same weights. Random weights; GQA / MQA are mean conversions of the MHA model.",
    )
    _add_decode_shape_args(d)
    d.add_argument(
        "--lengths",
        default="64,256,512",
        help="comma-separated output lengths of table a, with vs without cache (default: %(default)s)",
    )
    d.add_argument(
        "--runs", type=_positive_int, default=5, help="timed runs per median (default: %(default)s)"
    )
    d.add_argument(
        "--runs-a",
        type=_positive_int,
        default=3,
        help="timed runs of table a's cached rows at lengths other than --new-tokens (default: %(default)s)",
    )
    d.add_argument(
        "--uncached-runs",
        type=_positive_int,
        default=1,
        help="timed runs of the slow cache-free loop in table a (default: %(default)s)",
    )
    d.add_argument(
        "--uncached-budget",
        type=float,
        default=60.0,
        help="run the cache-free loop only where its expected time per run (prefill + T x one timed "
        "pass) is within this many seconds; other rows are not run (default: %(default)s)",
    )
    d.add_argument("--no-hf", action="store_true", help="skip table d (HuggingFace generate)")
    d.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="parameter and activation dtype (default: %(default)s)",
    )
    d.add_argument("--seed", type=int, default=0, help="weights and inputs seed (default: %(default)s)")
    d.add_argument("--json", default=None, metavar="OUT.json", help="also write every number to this file")
    _add_bench_train_args(sub)
    _add_bench_step_args(sub)


def _add_bench_step_args(sub: Any) -> None:
    from gqa_jax.config import DTYPES

    s = sub.add_parser(
        "step",
        help="where a decode step's time goes: the greedy loop profiled, op by op",
        description="Decode-step breakdown (Markdown tables on stdout, progress on stderr): the fused "
        "greedy loop of each model (MHA and its mean conversions) compiled, timed and traced with "
        "jax.profiler; the loop body's ops grouped by source line, op, output and largest input, "
        "with ms per step, MB of inputs per step and the rate they read at, beside the read-bandwidth "
        "probe of `bench decode`'s floor.",
    )
    _add_decode_shape_args(s)
    s.add_argument(
        "--top", type=_positive_int, default=16, help="groups shown per model (default: %(default)s)"
    )
    s.add_argument("--dtype", default="float32", choices=DTYPES, help="dtype (default: %(default)s)")
    s.add_argument("--seed", type=int, default=0, help="weights and inputs seed (default: %(default)s)")
    s.add_argument("--json", default=None, metavar="OUT.json", help="also write every number to this file")


def _add_bench_train_args(sub: Any) -> None:
    from gqa_jax.config import DTYPES, PRESETS

    t = sub.add_parser(
        "train",
        help="training throughput: tokens/s and MFU against the measured matmul peak",
        description="Training benchmark: the real jitted train step (Adafactor, z-loss) on a fixed "
        "random batch per preset; tokens/s, model FLOP/s and MFU against the matmul peak measured in "
        "the same run (Markdown table on stdout, progress on stderr).",
    )
    t.add_argument("--presets", default="tiny,small", help="comma-separated presets (default: %(default)s)")
    t.add_argument("--batch", type=_positive_int, default=8, help="rows per step (default: %(default)s)")
    t.add_argument(
        "--input-len", type=_positive_int, default=512, help="input length S (default: %(default)s)"
    )
    t.add_argument(
        "--target-len", type=_positive_int, default=114, help="target length T (default: %(default)s)"
    )
    t.add_argument("--steps", type=_positive_int, default=3, help="timed steps (default: %(default)s)")
    t.add_argument("--microbatches", type=_positive_int, default=1, help="gradient accumulation (default: 1)")
    t.add_argument("--dtype", default="float32", choices=DTYPES, help="activations (default: %(default)s)")
    t.add_argument("--json", default=None, metavar="OUT.json", help="also write every number to this file")
    t.set_defaults(presets_choices=PRESETS)


def _log_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _run_bench_train(args: argparse.Namespace) -> int:
    from gqa_jax import bench, bench_train

    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in args.presets_choices]
    if not presets or unknown:
        raise ValueError(
            f"--presets: unknown {unknown or presets}; choose from {', '.join(args.presets_choices)}"
        )
    res = bench_train.run_train_bench(
        presets, batch=args.batch, input_len=args.input_len, target_len=args.target_len, steps=args.steps,
        dtype=args.dtype, num_microbatches=args.microbatches, log=_log_stderr,
    )  # fmt: skip
    print(bench_train.report(res), flush=True)
    if args.json:
        bench.write_json(res, args.json)
        print(f"\nwrote {args.json}")
    return 0


def _run_bench_step(args: argparse.Namespace) -> int:
    from gqa_jax import bench, bench_step

    res = bench_step.run_step_bench(
        preset_name=args.preset, batch=args.batch, input_len=args.input_len, new_tokens=args.new_tokens,
        kv_heads=args.kv_heads, dtype=args.dtype, seed=args.seed, log=_log_stderr,
    )  # fmt: skip
    print(bench_step.report(res, top=args.top), flush=True)
    if args.json:
        bench.write_json(res, args.json)
        print(f"\nwrote {args.json}")
    return 0


def _run_bench(args: argparse.Namespace) -> int:
    from gqa_jax import bench

    if args.bench_command == "train":
        return _run_bench_train(args)
    if args.bench_command == "step":
        return _run_bench_step(args)
    res = bench.run_decode_bench(
        preset_name=args.preset,
        batch=args.batch,
        input_len=args.input_len,
        new_tokens=args.new_tokens,
        kv_heads=args.kv_heads,
        lengths=args.lengths,
        runs=args.runs,
        runs_a=args.runs_a,
        uncached_runs=args.uncached_runs,
        uncached_budget_s=args.uncached_budget,
        hf=not args.no_hf,
        dtype=args.dtype,
        seed=args.seed,
    )
    print(bench.report(res), flush=True)
    if args.json:
        bench.write_json(res, args.json)
        print(f"\nwrote {args.json}")
    return 0


# ------------------------------------------------------------------------------------ data
def _add_data_args(p: argparse.ArgumentParser) -> None:
    from gqa_jax.data.cli import add_data_args

    add_data_args(p)


def _run_data(args: argparse.Namespace) -> int:
    from gqa_jax.data.cli import run_data

    return run_data(args)


# ----------------------------------------------------------------------------------- train
def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", required=True, help="configs/<file>.py[:variant], e.g. configs/finetune.py:task=x"
    )
    p.add_argument("--workdir", required=True, help="run directory (an existing one is resumed)")
    p.set_defaults(overrides=[])
    p.epilog = (
        "Any --config.FIELD=VALUE overrides a config field, e.g. --config.batch_size=8 "
        "--config.model.num_kv_heads=2 (see gqa_jax.run_config.base_train_config for the fields)."
    )


def _run_train(args: argparse.Namespace) -> int:
    from gqa_jax import run_config, sharding, training

    # A multi-host run (GQA_JAX_COORDINATOR=... or GQA_JAX_DISTRIBUTED=auto) joins before any device use.
    sharding.initialize_distributed()
    config = run_config.load(args.config, args.overrides)
    summary = training.train(config, args.workdir)
    print(" ".join(f"{k}={v}" for k, v in summary.items()))
    return 0


# ------------------------------------------------------------------------------------ plan
def _add_plan_args(p: argparse.ArgumentParser) -> None:
    from gqa_jax.config import DTYPES, PRESETS
    from gqa_jax.plan import DEFAULT_HBM_GIB, PROGRAMS

    p.add_argument("--preset", required=True, choices=PRESETS, help="model shape")
    p.add_argument(
        "--num-kv-heads",
        type=_positive_int,
        default=None,
        help="K/V heads K of decoder self- and cross-attention (1 = MQA; must divide the query heads) "
        "(default: MHA, K = num_heads)",
    )
    p.add_argument("--mesh", default="1x8", help="DATAxMODEL devices (default: %(default)s)")
    p.add_argument(
        "--batch", type=_positive_int, required=True, help="rows per step, a multiple of the data axis size"
    )
    p.add_argument(
        "--input-len", type=_positive_int, default=2048, help="input length S (default: %(default)s)"
    )
    p.add_argument(
        "--output-len",
        type=_positive_int,
        default=512,
        help="target length of the train step and decoded tokens T (default: %(default)s)",
    )
    p.add_argument(
        "--hbm-gib",
        type=float,
        default=DEFAULT_HBM_GIB,
        help="memory per device, GiB (default: %(default)s, TPU v4; v5p 95, H100 80)",
    )
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=DTYPES,
        help="activations, decode params and KV cache (default: %(default)s)",
    )
    p.add_argument(
        "--param-dtype",
        default="float32",
        choices=DTYPES,
        help="the train step's params and optimizer state (default: %(default)s)",
    )
    p.add_argument(
        "--num-microbatches",
        type=_positive_int,
        default=1,
        help="gradient accumulation in the train step (default: %(default)s)",
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
    p.add_argument("--json", default=None, metavar="OUT.json", help="also write every number to this file")


def _run_plan(args: argparse.Namespace) -> int:
    from gqa_jax import bench, plan

    def names(text: str) -> tuple[str, ...]:
        return tuple(n.strip() for n in text.split(",") if n.strip() and n.strip() != "none")

    programs = names(args.programs)
    search = () if args.no_batch_search else tuple(p for p in names(args.batch_search) if p in programs)
    unknown = [n for n in (*programs, *names(args.batch_search)) if n not in plan.PROGRAMS]
    if unknown:
        raise ValueError(f"unknown program(s) {unknown}; choose from {', '.join(plan.PROGRAMS)}")
    settings = plan.PlanSettings(
        preset=args.preset, num_kv_heads=args.num_kv_heads, mesh=args.mesh, batch=args.batch,
        input_len=args.input_len, output_len=args.output_len, hbm_gib=args.hbm_gib, dtype=args.dtype,
        param_dtype=args.param_dtype, num_microbatches=args.num_microbatches, programs=programs,
        batch_search=search,
    )  # fmt: skip
    res = plan.plan(settings, log=_log_stderr)
    print(plan.report(res), flush=True)
    if args.json:
        bench.write_json(res, args.json)
        print(f"\nwrote {args.json}")
    return 0


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[..., int]]] = {
    "demo": (
        "the mini reproduction: pre-train, uptrain to GQA / MQA, fine-tune, score, time decoding",
        _add_demo_args,
        _run_demo,
    ),
    "info": (
        "parameter counts, K/V heads and KV-cache bytes of a preset (nothing allocated)",
        _add_info_args,
        _run_info,
    ),
    "convert": (
        "MHA -> GQA / MQA checkpoint conversion (mean, first, random) with a manifest; or --check DST",
        _add_convert_args,
        _run_convert,
    ),
    "data": (
        "data: `data tasks`, `data prepare TASK`, `data build-suite`, `data train-vocab`, `data show TASK`",
        _add_data_args,
        _run_data,
    ),
    "train": (
        "pre-train, uptrain or fine-tune (--config configs/<file>.py[:variant] --workdir DIR)",
        _add_train_args,
        _run_train,
    ),
    "bench": (
        "benchmarks: `bench decode` (KV cache vs none, MHA / GQA / MQA, the floor, HuggingFace), "
        "`bench train` (tokens/s, MFU), `bench step` (a decode step op by op)",
        _add_bench_args,
        _run_bench,
    ),
    "plan": (
        "per-device memory of the sharded train step and decode loop on a mesh, compiled ahead of time "
        "(params, optimizer state, KV cache, temporaries, fits?, largest batch)",
        _add_plan_args,
        _run_plan,
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return its exit code."""
    parser = _Parser(prog=PROG, description="Grouped-query attention for T5.1.1 in JAX / Flax NNX.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (help_text, add_args, _) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if chosen == name or chosen not in COMMANDS:  # only the command run imports its modules
            add_args(command)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and args.command == "train" and all(e.startswith("--config.") and "=" in e for e in extra):
            args.overrides = extra  # --config.FIELD=VALUE
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help (0) or a usage error (2): return the code, never raise
        return e.code if isinstance(e.code, int) else 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return COMMANDS[args.command][2](args)
    except (ValueError, FileNotFoundError) as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
