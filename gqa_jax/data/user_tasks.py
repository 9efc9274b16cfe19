"""A researcher's own tasks, without editing the package: examples from JSON Lines, TSV or CSV files
(:func:`from_files`) or from any TFDS dataset by name (:func:`from_tfds`).

A task is declared in a task file, a Python file that sets ``TASK``::

    from gqa_jax.data import user_tasks

    TASK = user_tasks.from_files(
        "my_summaries", train="train.jsonl", validation="dev.jsonl", inputs="article",
        targets="summary", prefix="summarize: ", input_length=512, target_length=64, metric="rouge")

Every command that takes a task name takes the file's path instead (``data show my_task.py``,
``--config.task=my_task.py``, a sweep's ``--set task=my_task.py``): ``tasks.get_task`` loads it.
A relative file name in a task file is read against the task file's folder.

The files are read and checked when the task is made, before any other work: a missing file, an
empty split, a line that is not JSON (its file and line), a row without a named field and an
unknown metric each raise a one-line ``ValueError``. The checked rows stay in memory; each split
is read once per process.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax import metrics
from gqa_jax.data.span_corruption import span_corruption_lengths
from gqa_jax.data.tasks import SPLITS, Example, Task, task_file_folder

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".tsv": "tsv", ".csv": "csv"}


def _format(path: Path) -> str:
    if path.suffix.lower() not in FORMATS:
        raise ValueError(
            f"{path}: unknown file type {path.suffix or '(none)'!r}; a task's files are JSON Lines "
            f"(.jsonl), TSV (.tsv, a header row) or CSV (.csv, a header row)"
        )
    return FORMATS[path.suffix.lower()]


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {number}: not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}, line {number}: a JSON {type(row).__name__}, not an object")
            rows.append(row)
    return rows


def read_rows(path: str | os.PathLike, fields: Sequence[str]) -> list[dict[str, Any]]:
    """Every row of a JSON Lines, TSV or CSV file, checked to hold each of ``fields``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    kind = _format(path)
    if kind == "jsonl":
        rows = _jsonl_rows(path)
        first_line = 1
    else:
        with path.open(encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t" if kind == "tsv" else ","))
        first_line = 2  # after the header row
    if not rows:
        raise ValueError(f"{path}: no examples (an empty split)")
    for number, row in enumerate(rows, start=first_line):
        missing = [name for name in fields if row.get(name) is None]
        if missing:
            where = f"line {number}" if kind == "jsonl" else f"row {number}"
            raise ValueError(
                f"{path}, {where}: no field {missing[0]!r} (it has: {', '.join(map(str, row)) or 'none'})"
            )
    return rows


class _Rows(Sequence[Example]):
    """A split's checked rows, read by index like a TFDS data source."""

    def __init__(self, rows: list[dict[str, Any]]):
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index):  # noqa: ANN001 (an int or a slice, as a list's)
        return self._rows[index]


def _check_metric(name: str, metric: str | None, span_corruption: bool) -> None:
    if span_corruption:
        if metric is not None:
            raise ValueError(
                f"task {name}: span corruption is scored by its loss alone; drop metric={metric!r}"
            )
        return
    if metric not in metrics.METRICS:
        raise ValueError(f"task {name}: unknown metric {metric!r}; known: {', '.join(metrics.METRICS)}")


def _checked_lengths(
    name: str,
    targets: str | None,
    metric: str | None,
    input_length: int,
    target_length: int | None,
    span_corruption: bool,
    what: str,
) -> tuple[int, int]:
    """Both makers' checks (the metric, the targets ``what`` names, the lengths): the lengths to use."""
    _check_metric(name, metric, span_corruption)
    if not span_corruption and targets is None:
        raise ValueError(f"task {name}: a sequence-to-sequence task needs targets={what}")
    return _lengths(input_length, target_length, span_corruption)


def _lengths(input_length: int, target_length: int | None, span_corruption: bool) -> tuple[int, int]:
    if span_corruption:
        return input_length, span_corruption_lengths(input_length)[1]
    if target_length is None:
        raise ValueError("a sequence-to-sequence task needs target_length")
    return input_length, target_length


def from_files(
    name: str,
    *,
    inputs: str,
    targets: str | None = None,
    input_length: int,
    target_length: int | None = None,
    metric: str | None = None,
    prefix: str = "",
    span_corruption: bool = False,
    base: str | os.PathLike | None = None,
    description: str = "",
    **files: str | os.PathLike,
) -> Task:
    """A task whose splits are files: ``train=``, ``validation=``, ``test=`` (at least one).

    ``inputs`` / ``targets`` name the fields (JSON keys or header columns); ``span_corruption``
    pre-trains on the ``inputs`` text (no targets, no metric, the target length derived as T5's).
    ``metric``: a key of ``gqa_jax.metrics.METRICS``. Relative paths are read against ``base``
    (default: the task file's folder when a task file is loading, else the working directory).
    """
    unknown = sorted(set(files) - set(SPLITS))
    if unknown or not files:
        raise ValueError(f"task {name}: splits are given as {', '.join(f'{s}=FILE' for s in SPLITS)}; got "
                         f"{', '.join(unknown) or 'none'}")  # fmt: skip
    input_length, target_length = _checked_lengths(
        name, targets, metric, input_length, target_length, span_corruption, "FIELD"
    )
    root = Path(base) if base is not None else task_file_folder() or Path.cwd()
    fields = [inputs] + ([targets] if targets else [])
    splits = {
        split: _Rows(read_rows(root / Path(path).expanduser(), fields)) for split, path in files.items()
    }
    return Task(
        name=name,
        source=", ".join(str(root / Path(p).expanduser()) for p in files.values()),
        inputs=inputs,
        targets=None if span_corruption else targets,
        input_length=input_length,
        target_length=target_length,
        metric=metric,
        prefix=prefix,
        span_corruption=span_corruption,
        splits={s: s for s in files},
        examples=splits,
        description=description or f"files: {', '.join(files)}",
    )


def _builder_module(source: str) -> str:
    """The module that registers TFDS dataset ``source`` (``"xsum"``, ``"xsum/1.1.0"``): TFDS
    registers a builder when its module is imported, so its category packages are imported until
    the name is known; a name still unknown is an error naming TFDS's catalogue."""
    import importlib

    import tensorflow_datasets as tfds

    name = source.split("/")[0].split(":")[0]
    for category in (None, *_TFDS_CATEGORIES):
        if category is not None:
            try:
                importlib.import_module(f"tensorflow_datasets.{category}")
            except ImportError:  # a category whose extra dependencies are not installed
                continue
        try:
            return tfds.builder_cls(name).__module__
        except Exception:  # noqa: BLE001 (TFDS raises its own DatasetNotFoundError)
            continue
    raise ValueError(f"unknown TFDS dataset {name!r}: see https://www.tensorflow.org/datasets/catalog")


_TFDS_CATEGORIES = ("text", "summarization", "translate", "question_answering", "structured", "datasets")


def from_tfds(
    name: str,
    source: str,
    *,
    inputs: str,
    targets: str | None = None,
    input_length: int,
    target_length: int | None = None,
    metric: str | None = None,
    prefix: str = "",
    span_corruption: bool = False,
    splits: Mapping[str, str] | None = None,
    description: str = "",
) -> Task:
    """A task on TFDS dataset ``source`` (``"xsum"``, ``"scientific_papers/pubmed"``), read like
    the paper's datasets: ``data prepare TASK_FILE`` builds it as array_record, offline a prepared
    copy is read. ``inputs`` / ``targets``: its feature keys; ``splits``: our split name -> the
    dataset's (default: train, validation, test as they are)."""
    input_length, target_length = _checked_lengths(
        name, targets, metric, input_length, target_length, span_corruption, "FEATURE"
    )
    return Task(
        name=name,
        source=source,
        inputs=inputs,
        targets=None if span_corruption else targets,
        input_length=input_length,
        target_length=target_length,
        metric=metric,
        prefix=prefix,
        span_corruption=span_corruption,
        splits=dict(splits) if splits is not None else {s: s for s in SPLITS},
        tfds_module=_builder_module(source),
        description=description or f"TFDS {source}",
    )
