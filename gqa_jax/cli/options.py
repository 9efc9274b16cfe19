"""What several commands share, declared once: the parser class (an error is one line), the
positive-integer type, comma-separated lists, the options ``--batch``, ``--input-len``,
``--output-len``, ``--dtype``, ``--cache-dtype``, a task's examples (``--task``, ...), ``--seed``,
``--json``, and writing ``--json``'s file.

Each ``add_*`` takes the command's own default and help text (``%(default)s`` is filled in by
argparse); the option's name, type and metavar live here only.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

PROG = "python -m gqa_jax"


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr (exit code 2), without the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def comma_list(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")`` (blank items dropped)."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def add_batch(
    p: argparse.ArgumentParser, *, help: str, default: int | None = None, required: bool = False
) -> None:
    p.add_argument("--batch", type=positive_int, default=default, required=required, help=help)


def add_input_len(
    p: argparse.ArgumentParser, *, default: int, help: str = "input length S (default: %(default)s)"
) -> None:
    p.add_argument("--input-len", type=positive_int, default=default, help=help)


def add_output_len(p: argparse.ArgumentParser, *, default: int, help: str) -> None:
    p.add_argument("--output-len", type=positive_int, default=default, help=help)


def add_dtype(
    p: argparse.ArgumentParser, *, default: str, help: str, choices: Sequence[str] | None = None
) -> None:
    p.add_argument("--dtype", default=default, choices=choices, help=help)


def add_cache_dtype(p: argparse.ArgumentParser) -> None:
    from gqa_jax.kv_quant import CACHE_DTYPES

    p.add_argument(
        "--cache-dtype",
        default=None,
        choices=CACHE_DTYPES,
        help="the KV cache's dtype: int8 / fp8 store 1-byte elements and a float32 scale per token and "
        "K/V head (default: the model's dtype)",
    )


def decode_arg(text: str) -> str:
    """argparse type of ``--decode``: a decode's canonical name (``config.decode_switches``)."""
    from gqa_jax.config import decode_name, decode_switches

    try:
        return decode_name(decode_switches(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_decode(p: argparse.ArgumentParser) -> None:
    from gqa_jax.config import OUR_DECODE, PAPER_SWITCHES

    p.add_argument(
        "--decode",
        type=decode_arg,
        default=OUR_DECODE,
        metavar="ours|paper|SWITCH[+SWITCH]",
        help="the decode: ours, or the paper's (T5X's: an instrument to reproduce its timings, not a way "
        "to decode; the tokens are the same), or some of its switches joined by '+': "
        f"{', '.join(PAPER_SWITCHES)} (docs/decoding.md) (default: %(default)s)",
    )


def add_task_examples(
    p: argparse.ArgumentParser, *, split_help: str = "the split (default: %(default)s)"
) -> None:
    """A scored task's examples: ``--task``, ``--split``, ``--data-dir``, ``--vocab``,
    ``--input-length`` and ``--target-length`` (the evaluation's pipeline)."""
    p.add_argument(
        "--task", required=True, help="a task name (python -m gqa_jax data tasks) or a task file (my_task.py)"
    )
    p.add_argument("--split", default="validation", help=split_help)
    p.add_argument("--data-dir", default=None, help="TFDS data dir (default: $GQA_JAX_DATA_DIR, ...)")
    p.add_argument(
        "--vocab", default=None, help="SentencePiece model (default for stdlib tasks: the suite's)"
    )
    p.add_argument("--input-length", type=positive_int, default=None, help="default: the task's")
    p.add_argument("--target-length", type=positive_int, default=None, help="default: the task's")


def add_seed(
    p: argparse.ArgumentParser, *, help: str = "weights and inputs seed (default: %(default)s)"
) -> None:
    p.add_argument("--seed", type=int, default=0, help=help)


def output_file(text: str) -> str:
    """argparse type: a file a command writes at its end, checked before any work: not a folder, in
    a folder that exists and can be written."""
    import os

    path = os.path.expanduser(text)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        example = f"{text.rstrip('/')}/out.json"
        raise argparse.ArgumentTypeError(f"{text} is a folder: give a file name, e.g. {example}")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text}: its folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: its folder {folder} cannot be written")
    return path


def add_json(p: argparse.ArgumentParser) -> None:
    help = "also write every number to this file"
    p.add_argument("--json", default=None, type=output_file, metavar="OUT.json", help=help)


def write_json(result: Any, path: str | None) -> None:
    """Write ``--json``'s file (when given) and say so on stdout."""
    if path:
        from gqa_jax.tools import measurement

        measurement.write_json(result, path)
        print(f"\nwrote {path}")


def check_writable_dir(path: str, flag: str) -> None:
    """A folder a command will write into, created now; one line naming ``flag`` when it cannot be
    written (before any work)."""
    import tempfile
    from pathlib import Path

    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot write there ({err.strerror or err})") from None


def add_sweep(p: argparse.ArgumentParser) -> None:
    """``SWEEP`` (experiments/<file>.py) and ``--set KEY=VALUE`` (repeatable), as `sweep` and
    `report` take them: the same --set gives the same sweep."""
    p.add_argument(
        "sweep_file",
        metavar="SWEEP",
        help="a sweep file (experiments/<file>.py), or the name of a shipped one (mini, table1, "
        "fig4_conversion, fig5_alpha, fig6_groups): it works from any directory",
    )
    sets = "a sweep parameter (its PARAMS) or a field of every run that has it; repeatable"
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help=sets)


def add_redo_changed(p: argparse.ArgumentParser) -> None:
    """``--redo-changed``, as `sweep` and `demo` take it (``runner.changed_runs``)."""
    p.add_argument(
        "--redo-changed",
        action="store_true",
        help="run again the done runs whose command the sweep now gives otherwise (a changed --set, "
        "sweep file or data path) and the runs after them, their directories moved aside to "
        "<name>.changed-<time> (without it such runs are an error: a report would mix settings)",
    )
