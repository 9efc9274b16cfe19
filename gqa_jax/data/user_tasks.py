"""A researcher's own tasks, without editing the package: examples from files as other tools write
them (:func:`from_files`: JSON Lines, JSON, CSV, TSV, Parquet; compressed, sharded) or from any TFDS
dataset by name (:func:`from_tfds`).

A task is declared in a task file, a Python file that sets ``TASK``::

    from gqa_jax.data import user_tasks

    TASK = user_tasks.from_files(
        "my_summaries", train="train.jsonl", validation="dev.jsonl", inputs="article",
        targets="summary", prefix="summarize: ", input_length=512, target_length=64, metric="rouge")

Every command that takes a task name takes the file's path instead (``data show my_task.py``,
``--config.task=my_task.py``, a sweep's ``--set task=my_task.py``): ``tasks.get_task`` loads it.
A relative file name in a task file is read against the task file's folder.

A task's files are found and named when the task is made; its rows are read when a split is first
opened (``tasks.open_files`` opens every split before a run's work): from the copy ``data prepare``
wrote as array_record (``task_records``, read by index), else whole into memory, once per process.
A file, line or field that cannot be read is a one-line ``ValueError`` naming it and the fix.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax import metrics
from gqa_jax.data import file_formats, task_records
from gqa_jax.data.span_corruption import span_corruption_lengths
from gqa_jax.data.tasks import SPLITS, Example, Task, task_file_folder
from gqa_jax.log import log

REFERENCES = "gqa_jax:references"  # a row's accepted answers, where its targets field holds a list
_KINDS = {type(None): "null", dict: "an object", list: "a list"}


def _texts(value: Any, path: Path, where: str, field: str, row: Mapping[str, Any]) -> list[str]:
    """A field's value as texts: a text as it is, a number or boolean as JSON writes it, a list as
    its items' texts; a missing field, a null, an object or a list of those is a ValueError."""
    where = f"{path}, {where}: "
    if field not in row:
        has = ", ".join(map(str, row)) or "none"
        raise ValueError(f"{where}no field {field!r} (it has: {has}): add it to every row, or name another")
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        raise ValueError(f"{where}field {field!r} is an empty list: give it a text")
    out = []
    for item in items:
        if isinstance(item, float) and math.isnan(item):
            item = None  # a missing value in a table (pandas writes NaN)
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, (bool, int, float)):
            out.append(json.dumps(item))
        elif isinstance(item, bytes):
            try:
                out.append(item.decode("utf-8"))
            except UnicodeDecodeError:
                raise ValueError(f"{where}field {field!r} holds bytes that are not UTF-8 text") from None
        else:
            what = _KINDS.get(type(item), type(item).__name__)
            verb = "holds" if isinstance(value, list) else "is"
            raise ValueError(
                f"{where}field {field!r} {verb} {what}, not text: give it a text or leave the row out "
                "(numbers and lists of texts are read as text: docs/data.md)"
            )
    return out


def _example(path: Path, where: str, row: Mapping[str, Any], inputs: str, targets: str | None) -> dict:
    """A row's texts: the inputs field (a list's items joined by spaces), the targets field (a
    list's first item; all its items are the accepted answers under ``REFERENCES``)."""
    example: dict[str, Any] = {inputs: " ".join(_texts(row.get(inputs), path, where, inputs, row))}
    if targets is not None:
        answers = _texts(row.get(targets), path, where, targets, row)
        example[targets] = answers[0]
        if len(answers) > 1:
            example[REFERENCES] = answers
    return example


def _references(example: Mapping[str, Any]) -> list[str]:
    return list(example.get(REFERENCES, ()))


class _Rows(Sequence[Example]):
    """A split's checked rows, read by index like a TFDS data source."""

    def __init__(self, rows: list[dict[str, Any]]):
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index):  # noqa: ANN001 (an int or a slice, as a list's)
        return self._rows[index]


class _FileSplits:
    """A task's splits read from files: from a prepared copy in the data directory where one was
    made from the files as they are, else read whole into memory (once per process)."""

    def __init__(self, name: str, files: dict[str, list[Path]], inputs: str, targets: str | None,
                 encoding: str):  # fmt: skip
        self.name, self.files, self.encoding = name, files, encoding
        self.inputs, self.targets = inputs, targets
        self._memory: dict[str, _Rows] = {}

    def examples(self, split: str) -> Iterator[dict[str, Any]]:
        """Split ``split``'s examples in order, each checked, read one at a time."""
        fields = [self.inputs] + ([self.targets] if self.targets else [])
        count = 0
        for path in self.files[split]:
            for where, row in file_formats.rows(path, fields, self.encoding):
                yield _example(path, where, row, self.inputs, self.targets)
                count += 1
        if not count:
            files = self.files[split]
            where = files[0] if len(files) == 1 else f"task {self.name}, split {split} ({len(files)} files)"
            raise ValueError(f"{where}: no examples (an empty split): give it a file with rows")

    def made_from(self) -> dict[str, Any]:
        """What a prepared copy of these splits is made from (``task_records``)."""
        files = {split: [[str(p), (st := p.stat()).st_size, st.st_mtime_ns] for p in paths]
                 for split, paths in self.files.items()}  # fmt: skip
        return {"files": files, "inputs": self.inputs, "targets": self.targets, "encoding": self.encoding}

    def open(self, split: str, data_dir: str | os.PathLike) -> Sequence[Example]:
        """``split``'s examples by index: the prepared copy's records, else the rows in memory."""
        copy = task_records.find(data_dir, self.name, self.made_from())
        if copy is not None:
            return task_records.open_split(copy, split)
        if split not in self._memory:
            self._memory[split] = _Rows(list(self.examples(split)))
        return self._memory[split]

    def prepare(self, data_dir: str | os.PathLike) -> dict[str, int]:
        """Write the prepared copy (every row checked; nothing left behind on an error)."""
        splits = {s: functools.partial(self.examples, s) for s in self.files}
        copy, counts, written = task_records.write(data_dir, self.name, self.made_from(), splits)
        log(f"task {self.name}: {'prepared' if written else 'found prepared'} in {copy}")
        return counts


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
    encoding: str = "utf-8",
    base: str | os.PathLike | None = None,
    description: str = "",
    **files: file_formats.Files,
) -> Task:
    """A task whose splits are files: ``train=``, ``validation=``, ``test=`` (at least one), each a
    file, a glob or a list of files (``gqa_jax.data.file_formats``).

    ``inputs`` / ``targets`` name the fields (JSON keys, header or Parquet columns); ``span_corruption``
    pre-trains on the ``inputs`` text (no targets, no metric, the target length derived as T5's).
    ``metric``: a key of ``gqa_jax.metrics.METRICS``. ``encoding``: the text files'. Relative paths
    are read against ``base`` (default: the task file's folder when a task file is loading, else the
    working directory).
    """
    unknown = sorted(set(files) - set(SPLITS))
    if unknown or not files:
        raise ValueError(f"task {name}: splits are given as {', '.join(f'{s}=FILE' for s in SPLITS)}; got "
                         f"{', '.join(unknown) or 'none'}")  # fmt: skip
    if not _NAME.fullmatch(name):
        raise ValueError(f"task name {name!r}: letters, digits, '_', '-' and '.' only (it names a folder)")
    input_length, target_length = _checked_lengths(
        name, targets, metric, input_length, target_length, span_corruption, "FIELD"
    )
    targets = None if span_corruption else targets
    root = Path(base).absolute() if base is not None else task_file_folder() or Path.cwd()
    paths = {}
    for split, spec in files.items():
        try:
            paths[split] = file_formats.split_files(spec, root)
        except ValueError as err:
            raise ValueError(f"task {name}, {split}=: {err}") from None
    named = [str(root / Path(f).expanduser()) for spec in files.values() for f in file_formats.names(spec)]
    return Task(
        name=name,
        source=", ".join(named),
        inputs=inputs,
        targets=targets,
        input_length=input_length,
        target_length=target_length,
        metric=metric,
        prefix=prefix,
        references=_references if targets is not None else None,
        span_corruption=span_corruption,
        splits={s: s for s in files},
        files=_FileSplits(name, paths, inputs, targets, file_formats.check_encoding(encoding)),
        description=description or f"files: {', '.join(files)}",
    )


_NAME = re.compile(r"[A-Za-z0-9_.-]+")


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
