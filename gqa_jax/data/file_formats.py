"""The files of a researcher's own task, as other tools write them: JSON Lines, a JSON array, CSV or
TSV with a header row, Parquet; text files maybe compressed (``.gz``, ``.bz2``, ``.xz``); one file,
a glob or a list of files per split.

:func:`rows` yields a file's rows one at a time (only a JSON array is read whole), each with where
it is (``line 12``; Parquet: ``row 3``). A file that cannot be read is a one-line ``ValueError``
naming the file, the line or row, the problem and the fix.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import glob
import gzip
import json
import lzma
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FORMATS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}
COMPRESSIONS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
KINDS = (
    "JSON Lines (.jsonl), JSON (.json), CSV (.csv) or TSV (.tsv) with a header row, or Parquet "
    "(.parquet); text files may be compressed (.gz, .bz2, .xz)"
)
_GLOB = re.compile(r"[*?[]")
_UNDECODED = re.compile("[\udc80-\udcff]")  # a byte the encoding could not decode (surrogateescape)
_SPACE = re.compile(r"\s*")
_FIELD_LIMIT = 2**31 - 1  # csv's default is 131072 characters: a whole document fits in a cell here
_FIX = "name the file's encoding, e.g. encoding='cp1252' (spreadsheets on Windows) or 'latin-1'"
_UNREADABLE = (OSError, EOFError, lzma.LZMAError, zlib.error)  # a damaged or mislabelled compressed file

Files = str | os.PathLike | Sequence[str | os.PathLike]


def _kind(path: Path) -> tuple[str, str]:
    """``(format, compression)`` of a file from its name (``train.jsonl.gz``: ``("jsonl", ".gz")``)."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSIONS else ""
    suffix = suffixes[-1] if suffixes else ""
    if suffix not in FORMATS:
        raise ValueError(f"{path}: unknown file type {suffix or '(none)'!r}; a task's files are {KINDS}")
    if FORMATS[suffix] == "parquet" and compression:
        raise ValueError(f"{path}: Parquet compresses inside the file; give the .parquet file uncompressed")
    return FORMATS[suffix], compression


def names(files: Files) -> list[str | os.PathLike]:
    """The file names and globs a split is given as (one, or a list)."""
    return [files] if isinstance(files, (str, os.PathLike)) else list(files)


def split_files(files: Files, root: Path) -> list[Path]:
    """The files a split names, each read against ``root``: one path, a glob (its matches in the
    order of their names) or a list of either (in the list's order)."""
    if not names(files):
        raise ValueError("an empty list of files; give a file, a glob or a list of files")
    out: list[Path] = []
    for name in names(files):
        path = root / Path(name).expanduser()
        if _GLOB.search(os.fspath(name)) and not path.is_file():  # a glob (not a name holding "[")
            found = sorted(Path(p) for p in glob.glob(os.fspath(path), recursive=True) if os.path.isfile(p))
            if not found:
                raise ValueError(f"{path}: no file matches this glob (relative names read against {root})")
            out += found
        elif not path.is_file():
            raise ValueError(f"{path}: no such file")
        else:
            out.append(path)
    for path in out:
        _kind(path)
    twice = sorted({str(p) for p in out if out.count(p) > 1})
    if twice:
        raise ValueError(f"{twice[0]}: named twice in one split; name each file once")
    return out


def check_encoding(encoding: str) -> str:
    """``encoding`` if Python knows it, else a ValueError with a few it knows."""
    try:
        codecs.lookup(encoding)
    except (LookupError, TypeError):
        raise ValueError(
            f"encoding {encoding!r} is unknown to Python; e.g. 'utf-8', 'utf-16', 'cp1252', 'latin-1'"
        ) from None
    return encoding


def rows(path: Path, fields: Sequence[str], encoding: str = "utf-8") -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` for each row of ``path``, in order; a CSV / TSV header and a Parquet schema
    must hold ``fields`` (rows hold what the file holds: the caller checks the values)."""
    form, compression = _kind(path)
    if form == "parquet":
        yield from _parquet(path, fields)
        return
    opener = COMPRESSIONS.get(compression, open)
    # utf-8-sig: UTF-8 with or without the byte-order mark spreadsheets write
    reading = "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding
    lines = _Lines(path, encoding)
    newline = "" if form in ("csv", "tsv") else None  # csv reads quoted newlines itself
    try:
        with opener(path, "rt", encoding=reading, errors="surrogateescape", newline=newline) as stream:
            if form == "jsonl":
                yield from _json_lines(path, lines.over(stream))
            elif form == "json":
                yield from _json(path, lines.over(stream))
            else:
                yield from _csv(path, lines, stream, fields, "\t" if form == "tsv" else ",")
    except UnicodeDecodeError as err:
        where = f"{path}, line {lines.number + 1}"
        raise ValueError(f"{where}: not {encoding} text ({err.reason}): {_FIX}") from None
    except _UNREADABLE as err:
        what = f"a {compression} file" if compression else "a file"
        raise ValueError(
            f"{path}, line {lines.number + 1}: cannot be read as {what} ({err}): is it whole, and "
            "compressed as its name says?"
        ) from None


class _Lines:
    """A text stream's lines, counted (``number``: the last one read), each checked to hold only
    text the file's encoding decodes."""

    def __init__(self, path: Path, encoding: str):
        self.path, self.encoding, self.number = path, encoding, 0

    def over(self, stream: Iterable[str]) -> Iterator[str]:
        for line in stream:
            self.number += 1
            bad = _UNDECODED.search(line)
            if bad:
                byte = ord(bad.group()) - 0xDC00
                utf16 = self.number == 1 and byte in (0xFF, 0xFE)
                fix = "it starts like UTF-16: encoding='utf-16'" if utf16 else _FIX
                raise ValueError(
                    f"{self.path}, line {self.number}: byte 0x{byte:02x} is not {self.encoding} text: {fix}"
                )
            yield line


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _json_lines(
    path: Path, lines: Iterable[str], start: int = 1, hint: str = ""
) -> Iterator[tuple[str, dict[str, Any]]]:
    for number, line in enumerate(lines, start=start):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}, line {number}: not JSON ({err.msg}, column {err.colno}): write one JSON object "
                f"per line{hint}"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(
                f"{path}, line {number}: {_json_type(row)}, not a JSON object: write one object per line, "
                '{"field": "text", ...}'
            )
        yield f"line {number}", row


def _json(path: Path, lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A ``.json`` file: one array of objects (read whole), or JSON Lines (read line by line)."""
    head: list[str] = []
    for line in lines:
        head.append(line)
        if line.strip():
            break
    if "".join(head).lstrip().startswith("["):
        yield from _json_array(path, "".join(head) + "".join(lines))
    else:
        hint = " (a .json file is one array of objects, or one object per line)"
        yield from _json_lines(path, head, 1, hint)
        yield from _json_lines(path, lines, len(head) + 1, hint)


def _json_array(path: Path, text: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The objects of one JSON array, each with the line it starts on."""
    decoder = json.JSONDecoder()
    pos, line, counted = _SPACE.match(text).end() + 1, 1, 0
    item = 0
    while True:
        pos = _SPACE.match(text, pos).end()
        line, counted = line + text.count("\n", counted, pos), pos
        if item == 0 and text.startswith("]", pos):
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {err.lineno}: not JSON ({err.msg}, column {err.colno})") from None
        item += 1
        if not isinstance(value, dict):
            raise ValueError(
                f"{path}, line {line}: item {item} of the array is {_json_type(value)}, not a JSON object: "
                'each item is one example, {"field": "text", ...}'
            )
        yield f"line {line}", value
        pos = _SPACE.match(text, pos).end()
        if text.startswith(",", pos):
            pos += 1
        elif text.startswith("]", pos):
            break
        else:
            raise ValueError(f"{path}, line {text.count(chr(10), 0, pos) + 1}: not JSON (',' or ']' expected "
                             f"after item {item} of the array)")  # fmt: skip
    if _SPACE.match(text, pos + 1).end() != len(text):
        raise ValueError(f"{path}, line {text.count(chr(10), 0, pos) + 1}: not JSON (more after the array's "
                         "closing ']'): a .json file holds one array")  # fmt: skip


def _csv(
    path: Path, lines: _Lines, stream: Iterable[str], fields: Sequence[str], delimiter: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The rows of a CSV / TSV file under its header row (fields of any length, quoted newlines)."""
    csv.field_size_limit(_FIELD_LIMIT)
    kind_name = "TSV" if delimiter == "\t" else "CSV"
    fix = "quote a field that holds quotes, the delimiter or a newline, as spreadsheets do"
    reader = csv.reader(lines.over(stream), delimiter=delimiter, strict=True)
    try:
        header = next(reader, None)
        if header is None:
            return
        index = _columns(path, header, fields, delimiter)
        start = lines.number + 1
        for record in reader:
            if record:
                _check_width(path, start, record, header, index, fix)
                yield f"line {start}", {name: record[i] for name, i in index.items()}
            start = lines.number + 1
    except csv.Error as err:
        raise ValueError(f"{path}, line {lines.number}: not {kind_name} ({err}): {fix}") from None


def _columns(path: Path, header: list[str], fields: Sequence[str], delimiter: str) -> dict[str, int]:
    """Each field's column in ``header`` (its first), or a ValueError naming the header's columns."""
    index: dict[str, int] = {}
    for i, name in enumerate(header):
        index.setdefault(name, i)
    missing = [f for f in fields if f not in index]
    if missing:
        other = next((d for d in (";", "\t", ",", "|") if d != delimiter and d in "".join(header)), None)
        hint = f" (is it separated by {other!r}? .csv files are comma-, .tsv tab-separated)" if other else ""
        raise ValueError(
            f"{path}, line 1: no column {missing[0]!r} in the header row (it has: "
            f"{', '.join(map(repr, header))}){hint}: name one of its columns in inputs= / targets="
        )
    return {f: index[f] for f in fields}


def _check_width(
    path: Path, start: int, record: list[str], header: list[str], index: dict[str, int], fix: str
) -> None:
    """A row with a value where the header has no column, or without a value for a field, is refused."""
    extra = any(v.strip() for v in record[len(header) :])
    if extra or any(i >= len(record) for i in index.values()):
        raise ValueError(
            f"{path}, line {start}: {len(record)} field(s) where the header row has {len(header)}: {fix}"
        )


def _parquet(path: Path, fields: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The named columns of a Parquet file, a batch of rows at a time."""
    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{path}: not a Parquet file ({err}): write it with pyarrow or pandas") from None
    names = file.schema_arrow.names
    missing = [f for f in fields if f not in names]
    if missing:
        raise ValueError(
            f"{path}: no column {missing[0]!r} (it has: {', '.join(map(repr, names))}): name one of its "
            "columns in inputs= / targets="
        )
    number = 0
    try:
        for batch in file.iter_batches(batch_size=1024, columns=list(dict.fromkeys(fields))):
            for row in batch.to_pylist():
                number += 1
                yield f"row {number}", row
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{path}, row {number + 1}: cannot be read ({err}): is the file whole?") from None
