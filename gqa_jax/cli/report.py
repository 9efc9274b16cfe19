"""``report``: a sweep's tables (Markdown + CSV) and figures (PNG) in the paper's layout, rebuilt
from its run directories alone (``gqa_jax.experiments.report``)."""

from __future__ import annotations

import argparse

from gqa_jax.cli import options

HELP = "a sweep's report: Table 1 / Figures 3-6 (Markdown, CSV, PNG) rebuilt from its run directories"


def add_args(p: argparse.ArgumentParser) -> None:
    options.add_sweep(p)
    p.add_argument("--root", required=True, help="the sweep's run directories (ROOT/<run name>)")
    p.add_argument(
        "--out", default=None, help="where report.md, report.csv and the PNGs go (default: ROOT/report)"
    )


def run(args: argparse.Namespace) -> int:
    from gqa_jax.experiments import report, sweep

    s = sweep.load_sweep(args.sweep_file, args.sets)
    report.check_runs(s, args.root)
    written = report.write_report(s, args.root, args.out)
    print(written["report.md"].read_text(), end="")
    print()
    for path in written.values():
        print(f"wrote {path}")
    return 0
