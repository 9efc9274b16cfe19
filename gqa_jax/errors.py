"""The error a user can fix (``RunError``: one line that names what is wrong and how to fix it),
and ``Stopped``, a run's clean stop on a signal.

A leaf module (nothing from gqa_jax). The command line prints ``RunError`` (like ``ValueError``,
``FileNotFoundError`` and ``OSError``) as one line on stderr, without a traceback, unless
``--debug`` or ``GQA_JAX_DEBUG=1`` asks for it.
"""

from __future__ import annotations

import signal


class RunError(Exception):
    """A run cannot go on for a reason outside the code: a busy or unusable workdir, a file that
    cannot be read. Its message is the whole explanation."""


class Stopped(Exception):
    """The run stopped on a signal at ``step``, whose checkpoint is complete (a resume continues
    from it)."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum = step, signum
        name = signal.Signals(signum).name
        saved = f"checkpoint {step} is saved"
        super().__init__(f"stopped at step {step} on {name} ({saved}); resume with the same command")
