"""``time``: time per sample of greedy decoding at one input / output length (compile excluded,
median of runs), with the paper's batch rule (the largest that fits, up to 32 per device) or a
given batch; writes ``DIR/timing.json`` and prints one line (``tools.t_infer``)."""

from __future__ import annotations

import argparse

from gqa_jax.cli import options

HELP = (
    "time per sample of greedy decoding at --input-len / --output-len (random weights of a preset "
    "or a checkpoint; batch given or the largest that fits, <= 32 per device) -> DIR/timing.json"
)


def batch_arg(text: str) -> int | str:
    """argparse type of ``--batch``: a positive integer or ``auto``."""
    return "auto" if text.strip().lower() == "auto" else options.positive_int(text)


def add_args(p: argparse.ArgumentParser) -> None:
    from gqa_jax.config import PRESETS
    from gqa_jax.timing import TIMING_FILE
    from gqa_jax.tools.plan import DEFAULT_HBM_GIB
    from gqa_jax.tools.t_infer import DTYPES

    p.add_argument("--workdir", required=True, help=f"run directory: gets {TIMING_FILE} (created if missing)")
    p.add_argument("--preset", default=None, choices=PRESETS, help="random weights of this model shape")
    p.add_argument(
        "--num-kv-heads",
        type=options.positive_int,
        default=None,
        help="K/V heads K of --preset's decoder self- and cross-attention (1 = MQA; must divide the "
        "query heads) (default: MHA, K = num_heads)",
    )
    p.add_argument(
        "--model", default=None, metavar="CKPT_DIR", help="a gqa_jax checkpoint instead of --preset"
    )
    options.add_input_len(p, default=2048)
    options.add_output_len(p, default=512, help="decoded tokens T, EOS disabled (default: %(default)s)")
    p.add_argument(
        "--batch",
        type=batch_arg,
        default="auto",
        metavar="N|auto",
        help="rows per decode, a multiple of the device count; auto = the largest whose decode program "
        "fits --hbm-gib per device by the memory plan, at most 32 per device (default: %(default)s)",
    )
    p.add_argument(
        "--hbm-gib",
        type=float,
        default=None,
        help="memory per device for --batch auto, GiB (default: what the device reports, else "
        f"{DEFAULT_HBM_GIB:g}, TPU v4)",
    )
    options.add_dtype(
        p,
        default="bfloat16",
        choices=DTYPES,
        help="parameters, activations and KV cache (default: %(default)s)",
    )
    options.add_cache_dtype(p)
    options.add_decode(p)
    p.add_argument(
        "--runs",
        type=options.positive_int,
        default=5,
        help="timed runs after the warm-up (default: %(default)s)",
    )
    options.add_seed(p)
    p.add_argument(
        "--predict",
        default=None,
        metavar="TOPOLOGY",
        help="predict T_infer for this TPU slice (e.g. v4:2x2x2, the paper's 8 chips) from its "
        "compiler's cost analysis on this host (roofline; libtpu: pip install -r requirements-tpu.txt) "
        "instead of timing: seconds per sample per chip, nothing is run",
    )
    p.add_argument(
        "--mesh",
        default="auto",
        metavar="DATAxMODEL|auto",
        help="with --predict: the mesh over the slice's chips, or auto = every DATA x MODEL split, "
        "the fastest kept (the paper's parallelism tuned per model) (default: %(default)s)",
    )
    p.add_argument(
        "--cache-layout",
        default="auto",
        choices=("auto", "heads"),
        help="with --predict: the decode cache's layout: auto, its K/V heads over the model axis as far as "
        "K allows and its rows over the rest (docs/sharding.md); heads, the K/V heads over the model axis "
        "alone, the cache replicated where K is smaller (as T5X's rules hold MQA's) (default: %(default)s)",
    )
    p.add_argument(
        "--beam-search",
        action="store_true",
        help="with --predict: each decode step a beam search's of one beam (T5X's EncoderDecoderModel "
        "decodes so by default) instead of a greedy step; with --decode paper its beams reordered by "
        "T5X's one-hot contraction",
    )
    p.add_argument("--overwrite", action="store_true", help=f"replace an existing {TIMING_FILE}")


def run(args: argparse.Namespace) -> int:
    from gqa_jax.log import log
    from gqa_jax.tools import t_infer

    if args.mesh != "auto" and args.predict is None:
        raise ValueError("--mesh applies to --predict only: a timed run splits its rows over every device")
    if args.cache_layout != "auto" and args.predict is None:
        raise ValueError("--cache-layout applies to --predict only: a timed run splits its rows over data")
    if args.beam_search and args.predict is None:
        raise ValueError("--beam-search applies to --predict only: time times greedy decoding")
    settings = t_infer.TimeSettings(
        workdir=args.workdir, preset=args.preset, num_kv_heads=args.num_kv_heads, model=args.model,
        input_len=args.input_len, output_len=args.output_len, batch=args.batch, hbm_gib=args.hbm_gib,
        dtype=args.dtype, cache_dtype=args.cache_dtype, runs=args.runs, seed=args.seed,
        overwrite=args.overwrite, predict=args.predict, mesh=args.mesh, decode=args.decode,
        cache_layout=args.cache_layout, beam_search=args.beam_search,
    )  # fmt: skip
    if args.predict is not None:
        from gqa_jax.tools import t_infer_predict

        record = t_infer_predict.predict_t_infer(settings, log=log)
        print(t_infer_predict.summary(record, args.workdir), flush=True)
        return 0
    record = t_infer.measure_t_infer(settings, log=log)
    print(t_infer.summary(record, args.workdir), flush=True)
    return 0
