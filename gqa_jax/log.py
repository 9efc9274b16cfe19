"""The one logger: progress and status lines on stderr, written by process 0 only.

A leaf module (nothing from gqa_jax): every floor may use it.
"""

from __future__ import annotations

import sys
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
