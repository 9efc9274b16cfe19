"""Files read back that cannot be read: what is wrong with one, and setting it aside.

A damaged file is never deleted nor silently replaced: ``set_aside`` moves it beside itself to
``<name>.unreadable-<time>`` (kept byte for byte, where its owner finds it), and the caller says
so in one line. A train run does this for its workdir's records (``gqa_jax.training.workdir``),
the lock file (``gqa_jax.file_lock``), and the sweep runner for a done run's outputs
(``gqa_jax.experiments.runner``). A JSON record is readable when it parses to an object, a text
file when it is UTF-8, a numpy archive when numpy opens it, a gqa_jax checkpoint directory when
its ``checkpoint.json`` (written last) names the format and its ``config.json`` and ``params/``
are there. No JAX here: the runner checks files only.
"""

from __future__ import annotations

import io
import json
import time
from typing import Any

import numpy as np

from gqa_jax import paths

# gqa_jax.checkpoints.orbax's MARKER / FORMAT / CONFIG / PARAMS (tests/test_runner_roots.py checks)
CHECKPOINT_MARKER, CHECKPOINT_FORMAT = "checkpoint.json", {"format": "gqa_jax", "version": 1}
CHECKPOINT_FILES = ("config.json", "params")
SUFFIX = ".unreadable-"


def json_problem(path: Any) -> str | None:
    """What is wrong with the JSON object file ``path`` (``"is missing"``, ``"is unreadable
    (JSONDecodeError)"``); None when it parses to an object."""
    if not path.is_file():
        return "is missing"
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return f"is unreadable ({type(e).__name__})"
    return None if isinstance(value, dict) else "is unreadable (not a JSON object)"


def text_problem(path: Any) -> str | None:
    """What is wrong with the UTF-8 text file ``path``; None when it decodes."""
    try:
        path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return f"is unreadable ({type(e).__name__})"
    return None


def npz_problem(path: Any) -> str | None:
    """What is wrong with the numpy archive ``path``; None when numpy opens it."""
    try:
        with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as archive:
            archive.files  # noqa: B018  (opening it reads the archive's directory)
    except Exception as e:  # BadZipFile, EOFError, ValueError, a lone .npy array: not an archive
        return f"is unreadable ({type(e).__name__})"
    return None


def checkpoint_problem(path: Any) -> str | None:
    """What is wrong with the gqa_jax checkpoint directory ``path``; None when it is complete."""
    if not path.is_dir():
        return "is not a directory"
    marker = path / CHECKPOINT_MARKER
    if not marker.is_file():
        return f"is not a complete checkpoint (no {CHECKPOINT_MARKER})"
    try:
        if json.loads(marker.read_bytes()) != CHECKPOINT_FORMAT:
            return f"is not a gqa_jax checkpoint ({CHECKPOINT_MARKER} names another format)"
    except (OSError, ValueError):
        return f"is not a complete checkpoint ({CHECKPOINT_MARKER} is unreadable)"
    missing = [n for n in CHECKPOINT_FILES if not (path / n).exists()]
    return f"is not a complete checkpoint (no {', '.join(missing)})" if missing else None


def stamp() -> str:
    """The UTC time in the names of what is set aside: ``20261206-120000``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def fresh(path: Any) -> Any:
    """``path``, or ``path-2``, ``path-3``, ... the first that does not exist (two set-asides
    within a second)."""
    found, n = path, 2
    while found.exists():
        found, n = path.with_name(f"{path.name}-{n}"), n + 1
    return found


def aside_path(path: Any, when: str | None = None) -> Any:
    """Where ``set_aside`` puts ``path``: ``<name>.unreadable-<when>`` beside it (``when``:
    ``stamp()`` by default), a name nothing holds yet."""
    return fresh(path.with_name(f"{path.name}{SUFFIX}{when or stamp()}"))


def set_aside(path: Any, when: str | None = None) -> Any:
    """Move the file or directory ``path`` to ``aside_path(path, when)``; returns where it went."""
    aside = aside_path(path, when)
    paths.move(path, aside)
    return aside
