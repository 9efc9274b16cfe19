"""Paths the user gives (workdirs, checkpoints, sweep roots): local or mounted directories.

Remote URLs such as ``gs://bucket/run`` are not supported yet, and ``pathlib`` would quietly turn
one into a local directory named ``gs:`` under the current directory, where a TPU worker's run is
lost. ``local`` refuses URLs (and empty strings) with an error that says what to do instead.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def local(path: str | os.PathLike, what: str) -> Path:
    """``path`` as an absolute local ``Path`` (``~`` expanded); ``what`` names it in errors."""
    text = os.fspath(path)
    if not text:
        raise ValueError(f"{what} is an empty path; give a directory, e.g. runs/my_run")
    if _URL.match(text):
        raise ValueError(
            f"{what} {text!r} is a URL: remote paths are not supported yet. Use a local directory, "
            "or mount the bucket (e.g. gcsfuse) and give its mount point."
        )
    return Path(text).expanduser().absolute()
