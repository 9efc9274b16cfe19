"""``bench``: benchmarks. ``bench decode`` (cache vs none, MHA / GQA / MQA, the floor,
HuggingFace), ``bench train`` (tokens/s and MFU against the measured matmul peak), ``bench step``
(where a decode step's time goes, op by op), ``bench cache`` (a quantized KV cache's decodes against
the float cache's on a trained model). Markdown tables on stdout, progress on stderr."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from gqa_jax.cli import options

HELP = (
    "benchmarks: `bench decode` (KV cache vs none, MHA / GQA / MQA, the floor, HuggingFace), "
    "`bench train` (tokens/s, MFU), `bench step` (a decode step op by op), `bench cache` (int8 / fp8 "
    "KV cache vs float on a trained model)"
)


def add_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    _add_decode_args(sub)
    _add_train_args(sub)
    _add_step_args(sub)
    _add_cache_args(sub)


def run(args: argparse.Namespace) -> int:
    return {"decode": _run_decode, "train": _run_train, "step": _run_step, "cache": _run_cache}[
        args.bench_command
    ](args)


def _add_decode_shape_args(p: argparse.ArgumentParser) -> None:
    """The model and shapes of `bench decode` and `bench step`."""
    from gqa_jax.config import PRESETS

    p.add_argument("--preset", default="small", choices=PRESETS, help="model shape (default: %(default)s)")
    options.add_batch(p, default=8, help="batch size B (default: %(default)s)")
    options.add_input_len(p, default=512)
    p.add_argument(
        "--new-tokens",
        type=options.positive_int,
        default=64,
        help="new tokens T per row (default: %(default)s)",
    )
    p.add_argument(
        "--kv-heads",
        default=None,
        help="comma-separated K/V head counts, divisors of num_heads; N (MHA) is always added "
        "(default: N, N/2, N/4, 1 rounded down to divisors, deduplicated: 6,3,1 for small)",
    )


# ---------------------------------------------------------------------------------- decode
def _add_decode_args(sub: Any) -> None:
    from gqa_jax.config import DTYPES

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
        "--runs", type=options.positive_int, default=5, help="timed runs per median (default: %(default)s)"
    )
    d.add_argument(
        "--runs-a",
        type=options.positive_int,
        default=3,
        help="timed runs of table a's cached rows at lengths other than --new-tokens (default: %(default)s)",
    )
    d.add_argument(
        "--uncached-runs",
        type=options.positive_int,
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
    options.add_dtype(
        d, default="float32", choices=DTYPES, help="parameter and activation dtype (default: %(default)s)"
    )
    options.add_cache_dtype(d)
    options.add_seed(d)
    options.add_json(d)


def _run_decode(args: argparse.Namespace) -> int:
    from gqa_jax.tools import bench_decode, bench_decode_report

    res = bench_decode.run_decode_bench(
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
        cache_dtype=args.cache_dtype,
        seed=args.seed,
    )
    print(bench_decode_report.report(res), flush=True)
    options.write_json(res, args.json)
    return 0


# ------------------------------------------------------------------------------------ step
def _add_step_args(sub: Any) -> None:
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
        "--shape",
        default=None,
        metavar="FIELD=N,...",
        help="ModelConfig fields replaced in the preset, e.g. the mini's XXL role: "
        "vocab_size=8000,d_model=128,d_ff=256,num_heads=8,head_dim=16,num_encoder_layers=2,"
        "num_decoder_layers=2 (default: the preset as it is)",
    )
    s.add_argument(
        "--top", type=options.positive_int, default=16, help="groups shown per model (default: %(default)s)"
    )
    options.add_dtype(s, default="float32", choices=DTYPES, help="dtype (default: %(default)s)")
    options.add_cache_dtype(s)
    options.add_seed(s)
    options.add_json(s)
    s.add_argument(
        "--keep-trace", metavar="DIR", default=None, help="keep each model's jax.profiler trace in DIR/kv<K> "
        "(open with `tensorboard --logdir DIR/kv<K>` or xprof; default: deleted)",
    )  # fmt: skip


def _run_step(args: argparse.Namespace) -> int:
    from gqa_jax.log import log
    from gqa_jax.tools import bench_step

    if args.keep_trace is not None:
        options.check_writable_dir(args.keep_trace, "--keep-trace")
    shape = _shape(args.shape, args.preset)
    res = bench_step.run_step_bench(
        preset_name=args.preset, shape=shape, batch=args.batch, input_len=args.input_len,
        new_tokens=args.new_tokens, kv_heads=args.kv_heads, dtype=args.dtype, cache_dtype=args.cache_dtype,
        seed=args.seed, keep_trace=args.keep_trace, log=log,
    )  # fmt: skip
    print(bench_step.report(res, top=args.top), flush=True)
    options.write_json(res, args.json)
    return 0


def _shape(text: str | None, preset_name: str) -> dict[str, int]:
    """``--shape FIELD=N,...`` -> ModelConfig fields, checked by building the config (a ValueError
    naming the field) before any work."""
    from gqa_jax.config import ModelConfig, preset

    if text is None:
        return {}
    fields = sorted(f.name for f in dataclasses.fields(ModelConfig) if f.type == "int")
    shape = {}
    for item in options.comma_list(text):
        name, _, value = item.partition("=")
        if name not in fields or not value.strip().isdigit():
            raise ValueError(f"--shape {item!r}: give FIELD=N with FIELD one of {', '.join(fields)}")
        shape[name] = int(value)
    preset(preset_name, **shape)  # ModelConfig's own checks (heads dividing, ...)
    return shape


# ----------------------------------------------------------------------------------- train
def _add_train_args(sub: Any) -> None:
    from gqa_jax.config import DTYPES, PRESETS

    t = sub.add_parser(
        "train",
        help="training throughput: tokens/s and MFU against the measured matmul peak",
        description="Training benchmark: the real jitted train step (Adafactor, z-loss) on a fixed "
        "random batch per preset; tokens/s, model FLOP/s and MFU against the matmul peak measured in "
        "the same run (Markdown table on stdout, progress on stderr).",
    )
    t.add_argument("--presets", default="tiny,small", help="comma-separated presets (default: %(default)s)")
    options.add_batch(t, default=8, help="rows per step (default: %(default)s)")
    options.add_input_len(t, default=512)
    t.add_argument(
        "--target-len", type=options.positive_int, default=114, help="target length T (default: %(default)s)"
    )
    t.add_argument("--steps", type=options.positive_int, default=3, help="timed steps (default: %(default)s)")
    t.add_argument(
        "--peak-sizes",
        default=None,
        help="comma-separated N: the [N, N] x [N, N] matmuls whose best rate is the peak (default: "
        "1024,2048,3072; on a GPU or TPU also 8192)",
    )
    t.add_argument(
        "--microbatches", type=options.positive_int, default=1, help="gradient accumulation (default: 1)"
    )
    options.add_dtype(t, default="float32", choices=DTYPES, help="activations (default: %(default)s)")
    options.add_json(t)
    t.set_defaults(presets_choices=PRESETS)


def _run_train(args: argparse.Namespace) -> int:
    from gqa_jax.log import log
    from gqa_jax.tools import bench_models, bench_train

    presets = list(options.comma_list(args.presets))
    unknown = [p for p in presets if p not in args.presets_choices]
    if not presets or unknown:
        raise ValueError(
            f"--presets: unknown {unknown or presets}; choose from {', '.join(args.presets_choices)}"
        )
    sizes = None if args.peak_sizes is None else bench_models.parse_lengths(args.peak_sizes, "--peak-sizes")
    res = bench_train.run_train_bench(
        presets, batch=args.batch, input_len=args.input_len, target_len=args.target_len, steps=args.steps,
        dtype=args.dtype, num_microbatches=args.microbatches, peak_sizes=sizes, log=log,
    )  # fmt: skip
    print(bench_train.report(res), flush=True)
    options.write_json(res, args.json)
    return 0


# ----------------------------------------------------------------------------------- cache
def _add_cache_args(sub: Any) -> None:
    from gqa_jax.kv_quant import QMAX

    c = sub.add_parser(
        "cache",
        help="a quantized KV cache against the float cache: token agreement and score on a task",
        description="Decodes a task's dev examples with a trained checkpoint once with the float KV "
        "cache and once per --cache-dtypes; prints the share of positions and rows that agree, the "
        "scores and their paired per-example difference (Markdown on stdout, progress on stderr).",
    )
    c.add_argument("--model", required=True, help="a gqa_jax checkpoint (e.g. RUN/best_model), HF or T5X")
    options.add_task_examples(c)
    c.add_argument(
        "--examples", type=options.positive_int, default=64, help="the first N examples (default: 64)"
    )
    c.add_argument(
        "--batch-size", type=options.positive_int, default=32, help="rows per decode (default: 32)"
    )
    c.add_argument(
        "--cache-dtypes",
        default="int8",
        help=f"comma-separated quantized cache dtypes, from {', '.join(QMAX)} (default: %(default)s)",
    )
    options.add_json(c)


def _run_cache(args: argparse.Namespace) -> int:
    from gqa_jax.log import log
    from gqa_jax.tools import bench_cache

    res = bench_cache.run_cache_bench(
        model_path=args.model, task_name=args.task, cache_dtypes=options.comma_list(args.cache_dtypes),
        split=args.split, examples=args.examples, batch_size=args.batch_size, data_dir=args.data_dir,
        vocab=args.vocab, input_length=args.input_length, target_length=args.target_length, log=log,
    )  # fmt: skip
    print(bench_cache.report(res), flush=True)
    options.write_json(res, args.json)
    return 0
