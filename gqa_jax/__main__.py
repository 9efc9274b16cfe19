"""``python -m gqa_jax <command>``: a thin command line over the library.

Commands (each in ``gqa_jax/cli/<command>.py``, with its own arguments):
  demo     the main job: the embedded mini reproduction of Table 1 (pre-train MHA, uptrain to
           GQA-2 / MQA, fine-tune, ROUGE-1 and decoding time), on the Python stdlib, offline.
  info     parameter counts, K/V heads and KV-cache bytes of a T5.1.1 preset (nothing allocated).
  convert  MHA -> GQA / MQA checkpoint conversion with a provenance manifest (or --check DST).
  data     tasks, dataset preparation, the embedded stdlib suite, vocabularies (``data --help``).
  train    pre-train, uptrain or fine-tune: --config configs/<file>.py[:variant] --workdir DIR
           [--config.FIELD=VALUE ...].
  bench    benchmarks: `bench decode`, `bench train`, `bench step`.
  plan     per-device memory of the sharded train step and decode loop on a mesh, compiled ahead
           of time on abstract shapes.

Bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gqa_jax.cli import COMMANDS, options

PROG = options.PROG


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` -> the parsed arguments (``args.command`` names the command). A usage error, no
    command, or ``--help`` raises SystemExit with the exit code (2, 2, 0)."""
    parser = options.Parser(prog=PROG, description="Grouped-query attention for T5.1.1 in JAX / Flax NNX.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    argv = list(argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    modules = {name: importlib.import_module(f"gqa_jax.cli.{name}") for name in COMMANDS}
    for name, module in modules.items():
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        if name == chosen:  # only the command run builds its arguments (and imports their modules)
            module.add_args(command)
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        raise SystemExit(2)
    if extra and getattr(modules.get(args.command), "TAKES_EXTRA_ARGS", False):
        args.extra = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return its exit code."""
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help (0) or a usage error (2): return the code, never raise
        return e.code if isinstance(e.code, int) else 2
    try:
        return importlib.import_module(f"gqa_jax.cli.{args.command}").run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
