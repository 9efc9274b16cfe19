"""The command line, one module per command (``python -m gqa_jax <command>``).

Each module declares ``HELP`` (its one-line summary), ``add_args(parser)`` (its arguments; heavy
imports inside, so that only the command being run pays for them) and ``run(args) -> exit code``;
a module with ``TAKES_EXTRA_ARGS = True`` gets the arguments argparse does not know as
``args.extra``. Options shared by several commands are declared once, in ``options``.
"""

COMMANDS = (
    "demo", "info", "convert", "data", "train", "evaluate", "time", "sweep", "report", "bench", "plan",
)  # fmt: skip
