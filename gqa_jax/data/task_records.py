"""A file task's prepared copy: each split as array_record files of JSON records in the order of its
files, which training and evaluation read by index without holding the split in memory (the
paper's datasets are read the same way, through ``tfds.data_source``).

A copy lives in ``DATA_DIR/task_files/<task name>/<digest>/`` with ``manifest.json``; the digest is
of what the copy was made from (the files' paths, sizes and modification times, the fields and the
encoding read), so a copy is found only for the files as they are now.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from array_record.python import array_record_data_source, array_record_module

ROOT = "task_files"
MANIFEST = "manifest.json"
VERSION = 1  # the records' layout: bump when what a record holds changes
# Records per array_record file: its writer holds an index of the file's records (~100 bytes each)
SHARD = 1 << 20


def _digest(made_from: Mapping[str, Any]) -> str:
    text = json.dumps({"version": VERSION, **made_from}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _folder(data_dir: str | os.PathLike, name: str, made_from: Mapping[str, Any]) -> Path:
    """Where the copy of task ``name`` made from ``made_from`` lives (``made_from["files"]``: split
    -> ``[[path, size, mtime_ns], ...]``)."""
    return Path(data_dir) / ROOT / name / _digest(made_from)


def find(data_dir: str | os.PathLike, name: str, made_from: Mapping[str, Any]) -> Path | None:
    """The copy made from ``made_from``, else None; a ValueError where a copy of the same files
    exists that was made from them as they were before (reading them into memory instead could
    exhaust it). A data directory at a URL (``gs://``) holds none."""
    if "://" in str(data_dir):
        return None
    here = _folder(data_dir, name, made_from)
    if (here / MANIFEST).is_file():
        return here
    paths = _paths(made_from)
    for manifest in sorted(here.parent.glob(f"[!.]*/{MANIFEST}")):  # not a partial one
        before = json.loads(manifest.read_text())["made_from"]
        if _paths(before) == paths:
            raise ValueError(
                f"task {name}: its copy in {manifest.parent} was prepared from "
                f"{_changed(before, made_from)}: prepare it again (`python -m gqa_jax data prepare` on its "
                f"task file, --data-dir {data_dir}), or remove that folder to read the files into memory"
            )
    return None


def _paths(made_from: Mapping[str, Any]) -> dict[str, list[str]]:
    return {split: [f[0] for f in files] for split, files in made_from["files"].items()}


def _changed(before: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """What differs between two ``made_from``s of the same files, in words."""
    old = {f[0]: f[1:] for files in before["files"].values() for f in files}
    for files in now["files"].values():
        for path, *stat in files:
            if old.get(path) != stat:
                return f"{path} as it was before it changed"
    return "other fields or another encoding than the task file's now"


def write(
    data_dir: str | os.PathLike,
    name: str,
    made_from: Mapping[str, Any],
    splits: Mapping[str, Callable[[], Iterable[Mapping[str, Any]]]],
) -> tuple[Path, dict[str, int], bool]:
    """Write (once) the copy of task ``name``: ``splits[split]()`` yields its records in order.
    Returns the copy's folder, its records per split and whether it was written now (not found).
    Written in a temporary folder first and moved into place, so an error (a bad row) leaves
    nothing behind."""
    if "://" in str(data_dir):
        raise ValueError(f"task {name}: a prepared copy is written to a local --data-dir, not {data_dir}")
    final = _folder(data_dir, name, made_from)
    if (final / MANIFEST).is_file():
        return final, json.loads((final / MANIFEST).read_text())["examples"], False
    made = [p for p in final.parents[2::-1] if not p.exists()]  # data_dir, task_files, the task's
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.parent / f".{final.name}.partial-{os.getpid()}"
    try:
        partial.mkdir()
        shards = {s: _write_split(partial, s, rows()) for s, rows in splits.items()}
        counts = {s: sum(n for _, n in files) for s, files in shards.items()}
        manifest = {
            "task": name,
            "made_from": made_from,
            "examples": counts,
            "shards": shards,
            "version": VERSION,
        }
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        try:
            os.replace(partial, final)
        except OSError:
            if not (final / MANIFEST).is_file():
                raise
            shutil.rmtree(partial)  # another process made the same copy meanwhile
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        for path in made[::-1]:
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        raise
    return final, counts, True


def _write_split(folder: Path, split: str, records: Iterable[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """``split``'s records in files of ``SHARD`` records at most: ``[(file name, records)]``."""
    shards: list[tuple[str, int]] = []
    writer = None
    try:
        for record in records:
            if not shards or shards[-1][1] == SHARD:
                if writer is not None:
                    writer.close()
                shards.append((f"{split}-{len(shards):05d}.array_record", 0))
                writer = array_record_module.ArrayRecordWriter(str(folder / shards[-1][0]), "group_size:1")
            writer.write(json.dumps(record, ensure_ascii=False).encode())
            shards[-1] = (shards[-1][0], shards[-1][1] + 1)
    finally:
        if writer is not None:
            writer.close()
    return shards


class Records(Sequence[dict[str, Any]]):
    """One split of a prepared copy, read by index (``len``, ``[i]``) like a TFDS data source."""

    def __init__(self, paths: Sequence[Path]):
        self.path = paths[0].parent
        self._source = array_record_data_source.ArrayRecordDataSource([str(p) for p in paths])

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index):  # noqa: ANN001 (an int, as a list's)
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(f"record {index} of {len(self)} in {self.path}")
        return json.loads(self._source[position])


def open_split(copy: Path, split: str) -> Records:
    """Split ``split`` of the copy in folder ``copy``."""
    shards = json.loads((copy / MANIFEST).read_text())["shards"][split]
    return Records([copy / name for name, _ in shards])
