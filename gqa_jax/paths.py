"""Paths the user gives (workdirs, checkpoints, conversion outputs, sweep roots): a local
directory or a Google Cloud Storage URL (``gs://bucket/run``).

``resolve`` returns an ``etils.epath.Path``: a local path made absolute (``~`` expanded), or the
URL kept as a URL. ``pathlib`` would quietly turn ``gs://b/run`` into a local directory ``gs:/b/run``
under the current directory, where a TPU worker's run is lost; an ``epath.Path`` reads and writes
the bucket itself (through gcsfs), and TensorStore and orbax write arrays there directly.

Object stores differ from a disk in two ways the writers here care about: an object is written
whole (there is no append, so a growing file is rewritten, see ``append_text``), and a rename is a
copy and a delete per object (so a directory cannot be renamed atomically, see ``move``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import tempfile
import urllib.parse
from typing import Any

from etils import epath

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
SCHEMES = ("gs",)  # the URL schemes tested here (gcsfs for files, TensorStore's gcs driver for arrays)


def resolve(path: str | os.PathLike, what: str) -> epath.Path:
    """``path`` as an ``epath.Path``: absolute when local, the URL itself when remote; ``what``
    names it in errors (an empty path, an unsupported URL scheme, gs:// without gcsfs)."""
    text = os.fspath(path)
    if not text:
        raise ValueError(f"{what} is an empty path; give a directory, e.g. runs/my_run or gs://bucket/run")
    url = _URL.match(text)
    if url is None:
        return epath.Path(os.path.abspath(os.path.expanduser(text)))
    scheme = url.group(1).lower()
    if scheme not in SCHEMES:
        raise ValueError(
            f"{what} {text!r}: {scheme}:// paths are not supported; use a local directory or "
            + " / ".join(f"{s}://bucket/path" for s in SCHEMES)
        )
    if not text[len(url.group(0)) :].strip("/"):
        raise ValueError(f"{what} {text!r} names no bucket: give gs://bucket/path")
    if importlib.util.find_spec("gcsfs") is None and importlib.util.find_spec("tensorflow") is None:
        raise ValueError(
            f"{what} {text!r} is on Google Cloud Storage, which needs gcsfs: pip install gcsfs "
            "(it is in requirements.txt)"
        )
    return epath.Path(text)


def absolute(value: Any, *, is_path: bool = False) -> Any:
    """A value the user typed that names a local path, made absolute against the working directory
    with ``~`` expanded (runs started in another directory read it the same): where ``is_path``
    (its field holds a path), or where it starts with ``~``, ``./`` or ``../`` or names a file or
    folder here. URLs and other values stay as they are."""
    if not isinstance(value, str) or not value or _URL.match(value):
        return value
    if is_path or value.startswith(("~", "./", "../")) or os.path.exists(value):
        return os.path.abspath(os.path.expanduser(value))
    return value


def local(path: str | os.PathLike, what: str, why: str) -> epath.Path:
    """``resolve`` for the paths that must be on this machine's disk; ``why`` says why in the error."""
    if is_remote(path):
        raise ValueError(f"{what} {os.fspath(path)!r} is a URL, but {why}: give a local directory")
    return resolve(path, what)


STORAGE_HOST = ("storage.googleapis.com", 443)  # where gcsfs and TensorStore send every gs:// request


def check_reachable(path: Any, what: str, timeout: float = 5.0) -> None:
    """For a gs:// ``path``: a ValueError within ``timeout`` seconds when Cloud Storage cannot be
    reached from here (gcsfs would retry for about a minute first). Local paths pass."""
    if not is_remote(path):
        return
    host = STORAGE_HOST
    if emulator := os.environ.get("STORAGE_EMULATOR_HOST"):  # gcsfs's own override (tests, emulators)
        url = urllib.parse.urlsplit(emulator if "://" in emulator else f"http://{emulator}")
        host = (url.hostname or "localhost", url.port or (443 if url.scheme == "https" else 80))
    try:
        socket.create_connection(host, timeout=timeout).close()
    except OSError as err:
        raise ValueError(
            f"{what} {os.fspath(path)} is on Google Cloud Storage, and {host[0]} cannot be reached "
            f"from this machine ({err.strerror or err}): check the network, or use a local directory"
        ) from None


def is_remote(path: Any) -> bool:
    """Whether ``path`` (a string or path) is a URL such as ``gs://bucket/x``."""
    return _URL.match(os.fspath(path)) is not None


def write_text_atomic(file: Any, text: str) -> None:
    """``write_bytes_atomic`` of ``text`` in UTF-8."""
    write_bytes_atomic(file, text.encode("utf-8"))


def write_bytes_atomic(file: Any, data: bytes) -> None:
    """Write ``data`` to ``file`` so that a reader sees the old content or the new, never part of
    it: on an object store an object is written whole; locally a temporary file beside it (same
    directory, so the rename is atomic) is written, synced and renamed over it."""
    if is_remote(file):
        epath.Path(file).write_bytes(data)
        return
    fd, tmp = tempfile.mkstemp(
        dir=os.fspath(epath.Path(file).parent), prefix=f".{os.path.basename(file)}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # as open() would make it (mkstemp's is 0600)
        os.replace(tmp, file)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)  # reading it means setting it: put it straight back
    os.umask(mask)
    return mask


def append_text(file: epath.Path, text: str) -> None:
    """Append ``text`` to ``file`` (created if missing). Locally an append; on an object store,
    where objects are written whole, the object is rewritten with ``text`` added."""
    if is_remote(file):
        old = file.read_text() if file.exists() else ""
        file.write_text(old + text)
        return
    with file.open("a") as f:
        f.write(text)


def move(src: epath.Path, dst: epath.Path) -> None:
    """Move the file or directory ``src`` to ``dst`` (which must not exist)."""
    if is_remote(src) or is_remote(dst):
        # gcsfs directly: epath's rename wants dst's parent to exist, and an object store has no
        # empty directories to make first. A copy and a delete per object.
        import fsspec

        fs, _ = fsspec.core.url_to_fs(os.fspath(src))
        fs.mv(os.fspath(src), os.fspath(dst), recursive=True)
        for instance in list(type(fs)._cache.values()):  # epath's own instance lists it too
            instance.invalidate_cache()
    else:
        os.replace(src, dst)
