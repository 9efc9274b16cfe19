"""The one logger: progress and status lines on stderr, written by process 0 only.

A leaf module (nothing from gqa_jax): every floor may use it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import jax

_LOGGED: set[Any] = set()


def log(msg: str) -> None:
    """Print ``msg`` to stderr (flushed), on process 0 only."""
    if jax.process_index() == 0:
        print(msg, file=sys.stderr, flush=True)


def log_once(key: Any, msg: str) -> None:
    """:func:`log` ``msg`` once per ``key``."""
    if key in _LOGGED:
        return
    _LOGGED.add(key)
    log(msg)


@contextlib.contextmanager
def native_noise_off_the_terminal() -> Iterator[None]:
    """What native code (libtpu's missing-TPU-environment warnings) writes straight to file
    descriptor 2 inside the block: caught, and passed on after it only when stderr is not a terminal
    (a run's log keeps it) or with ``GQA_JAX_DEBUG=1``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not os.isatty(2) or os.environ.get("GQA_JAX_DEBUG", "") not in ("", "0"):
                caught.seek(0)
                os.write(2, caught.read())
