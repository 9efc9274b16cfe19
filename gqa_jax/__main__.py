"""``python -m gqa_jax <command>``: a thin command line over the library.

The commands are ``gqa_jax.cli.COMMANDS``, each a module ``gqa_jax/cli/<command>.py`` with its own
arguments and a one-line ``HELP``; ``python -m gqa_jax --help`` lists them with it, and
``python -m gqa_jax <command> --help`` gives a command's arguments. ``demo`` is the main job: the
embedded mini reproduction of the paper's pipeline, offline on a CPU.

Bad input (a wrong config or argument, a missing, unreadable or corrupt file, a busy, read-only or
full workdir) is one line on stderr and exit code 2, without a traceback; ``--debug`` (anywhere on
the line, or ``GQA_JAX_DEBUG=1``) shows the traceback too. A ``train`` stopped by SIGINT / SIGTERM
says at which step (exit code 128 + the signal's number).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from gqa_jax.cli import COMMANDS, options

PROG = options.PROG


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` -> the parsed arguments (``args.command`` names the command). A usage error, no
    command, or ``--help`` raises SystemExit with the exit code (2, 2, 0)."""
    parser = options.Parser(prog=PROG, description="Grouped-query attention for T5.1.1 in JAX / Flax NNX.")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show an error's traceback (anywhere on the line; or GQA_JAX_DEBUG=1)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    argv = list(argv)
    debug = "--debug" in argv  # before or after the command
    argv = [a for a in argv if a != "--debug"]
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
    args.debug = debug
    if extra and getattr(modules.get(args.command), "TAKES_EXTRA_ARGS", False):
        args.extra = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


# What to do about an OSError, by its errno.
_OS_HINTS = {
    errno.ENOSPC: "free some space or choose a path on another disk",
    errno.EDQUOT: "free some space or choose a path on another disk",
    errno.EROFS: "the file system is read-only: choose a writable path",
    errno.EACCES: "check the path's permissions or choose another path",
    errno.EPERM: "check the path's permissions or choose another path",
    errno.ENOTDIR: "a part of the path is a file, not a directory: choose another path",
    errno.EISDIR: "expected a file there, found a directory",
}


def error_line(e: BaseException) -> str:
    """The one line an error is reported as (an OSError with its file and what to do)."""
    if isinstance(e, OSError) and not isinstance(e, FileNotFoundError) and e.errno in _OS_HINTS:
        where = f" ({e.filename})" if e.filename else ""
        return f"{e.strerror or os.strerror(e.errno)}{where}: {_OS_HINTS[e.errno]}"
    return str(e) or type(e).__name__


def _quiet_late_callbacks(unraisable: Any) -> None:
    """``sys.unraisablehook`` without the echo of a failed orbax read: TensorStore's reads still
    in flight call back into orbax's event loop after it closed, and each prints this error."""
    if unraisable.exc_type is RuntimeError and str(unraisable.exc_value) == "Event loop is closed":
        return
    sys.__unraisablehook__(unraisable)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return its exit code."""
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help (0) or a usage error (2): return the code, never raise
        return e.code if isinstance(e.code, int) else 2
    from gqa_jax.errors import RunError, Stopped

    debug = args.debug or os.environ.get("GQA_JAX_DEBUG", "") not in ("", "0")
    hook, absl_logger = sys.unraisablehook, logging.getLogger("absl")
    level = absl_logger.level
    if not debug:
        sys.unraisablehook = _quiet_late_callbacks
        absl_logger.setLevel(logging.ERROR)  # orbax / TFDS chatter (--debug shows it)
        logging.getLogger("gcsfs").setLevel(logging.CRITICAL)  # its retries' tracebacks
    prefix = f"{PROG} {args.command}"
    try:
        return importlib.import_module(f"gqa_jax.cli.{args.command}").run(args)
    except Stopped as e:
        print(f"{prefix}: {e}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"{prefix}: interrupted; what was saved before is kept (a train run resumes from its last "
              "complete checkpoint with the same command)", file=sys.stderr)  # fmt: skip
        return 130
    except (ValueError, OSError, RunError) as e:
        if debug:
            traceback.print_exc()
        print(f"{prefix}: error: {error_line(e)}", file=sys.stderr)
        return 2
    finally:
        sys.unraisablehook = hook
        absl_logger.setLevel(level)


if __name__ == "__main__":
    if "--debug" not in sys.argv and os.environ.get("GQA_JAX_DEBUG", "") in ("", "0"):
        sys.unraisablehook = _quiet_late_callbacks  # also for the callbacks after main() returns
    sys.exit(main())
