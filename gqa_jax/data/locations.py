"""Where data lives by default (a leaf: the tasks and the stdlib suite both ask it)."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> str:
    """``$GQA_JAX_DATA_DIR``, else ``$TFDS_DATA_DIR``, else TFDS's default ``~/tensorflow_datasets``."""
    for var in ("GQA_JAX_DATA_DIR", "TFDS_DATA_DIR"):
        if os.environ.get(var):
            return os.environ[var]
    return str(Path("~/tensorflow_datasets").expanduser())
