"""The embedded mini reproduction: ``python -m gqa_jax demo`` = build the data, run the
``experiments/mini.py`` sweep, write its report.

1. the stdlib suite's datasets the scale's tasks need and its vocabulary (``data build-suite``),
   if missing, so that no run builds them (runs may run two at a time);
2. the sweep, through the runner (``experiments.runner.run_sweep``): every run in its own
   directory under ``--root``, done runs skipped, an interrupted one resumed or redone;
3. the report (``experiments.report.write_report``): ``ROOT/report/report.md``, ``report.csv``
   and the figures' PNGs, with the paper's claims and their verdicts.

A second invocation with the same root finishes what the first left and rewrites the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gqa_jax import paths, shipped
from gqa_jax.data import stdlib_suite
from gqa_jax.data import tasks as tasks_lib
from gqa_jax.experiments import report, runner, sweep


def sweep_file() -> Path:
    """The shipped ``experiments/mini.py`` (of the checkout, or of the installed package)."""
    return shipped.resolve("mini", "experiments", "sweep file")


def run(
    root: str | Path = "runs/mini",
    *,
    data_dir: str | None = None,
    scale: str = "default",
    jobs: int = 2,
    redo_changed: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or finish) the mini reproduction under ``root`` and write its report; returns
    ``{"returncode", "report": {name: path}, "seconds", "root"}`` (the report is written even
    when a run failed: its numbers show as missing)."""
    t0 = time.time()
    mini_file = sweep_file()
    module = sweep.load_module(mini_file)
    if scale not in module.SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose from {', '.join(module.SCALES)}")
    data_dir = str(data_dir or tasks_lib.default_data_dir())
    if not paths.is_remote(data_dir):  # the runs start in another directory
        data_dir = str(Path(data_dir).expanduser().absolute())
    root = Path(root).expanduser().absolute()
    for flag, path in (("--root", root), ("--data-dir", data_dir)):  # before minutes of data building
        if not paths.is_remote(path) and Path(path).expanduser().is_file():
            raise ValueError(f"{flag} {path} is a file, not a directory")
    names, vocab_size = module.suite_needs({**module.PARAMS, "scale": scale})
    log(f"data: {data_dir}")
    stdlib_suite.build_suite(data_dir, names=names, log=log)
    vocab = stdlib_suite.suite_vocab(data_dir, vocab_size, log=log)
    sets = [f"scale={scale}", f"data_dir={data_dir}", f"vocab={vocab.path}"]
    mini = sweep.load_sweep(mini_file, sets)
    log(f"sweep {mini_file.name} ({len(mini.runs)} runs, scale {scale}) under {root}")
    rc = runner.run_sweep(mini, root, jobs=jobs, redo_changed=redo_changed, log=log)
    written = report.write_report(mini, root)
    return {"returncode": rc, "report": written, "seconds": time.time() - t0, "root": str(root)}
