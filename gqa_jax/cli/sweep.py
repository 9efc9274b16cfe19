"""``sweep``: run a sweep file's runs in dependency order (``gqa_jax.experiments.runner``)."""

from __future__ import annotations

import argparse
import signal

from gqa_jax.cli import options

HELP = "run a sweep (experiments/<file>.py): every run in dependency order, finished ones skipped"


def add_args(p: argparse.ArgumentParser) -> None:
    options.add_sweep(p)
    p.add_argument("--root", required=True, help="where the run directories go (ROOT/<run name>)")
    p.add_argument("--dry-run", action="store_true", help="print every run's complete command, run nothing")
    only = "runs whose name matches this fnmatch pattern, and the runs they depend on"
    p.add_argument("--only", default=None, metavar="PATTERN", help=only)
    jobs = (
        "runs at once (local launcher): a run starts when its dependencies are done; time runs "
        "always run alone (default: %(default)s)"
    )
    p.add_argument("--jobs", type=options.positive_int, default=1, help=jobs)
    launcher = "local: here, --jobs at a time; tpu: one at a time through scripts/launch_tpu.sh"
    p.add_argument("--launcher", default="local", choices=("local", "tpu"), help=launcher)
    p.add_argument("--tpu", default=None, help="with --launcher tpu: the TPU VM name")
    p.add_argument("--zone", default=None, help="with --launcher tpu: its zone")
    options.add_redo_changed(p)


def run(args: argparse.Namespace) -> int:
    from gqa_jax.experiments import runner, sweep
    from gqa_jax.log import log

    if args.launcher == "tpu" and not (args.tpu and args.zone):
        raise ValueError("--launcher tpu needs --tpu NAME and --zone ZONE")
    tpu = ("--tpu", args.tpu, "--zone", args.zone) if args.launcher == "tpu" else ()
    s = sweep.load_sweep(args.sweep_file, args.sets)
    rc = runner.run_sweep(s, args.root, only=args.only, dry_run=args.dry_run, launcher=args.launcher,
                          tpu=tpu, jobs=args.jobs, redo_changed=args.redo_changed, log=log)  # fmt: skip
    if rc > 128:  # stopped by a signal, and said so: a late Ctrl-C while the process exits says nothing
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return rc
