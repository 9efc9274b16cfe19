"""MediaSum (Zhu et al., 2021) as a TFDS dataset, ``mediasum``, built from the release files.

MediaSum is 463.6K NPR and CNN interview transcripts, each with a short abstractive summary. The
release (github.com/zcgzcgzcg1/MediaSum) is two files that the user downloads by hand (see
``MANUAL_DOWNLOAD_INSTRUCTIONS``):

- ``news_dialogue.json`` (~4 GB): a JSON list of interviews, each an object with ``"id"``,
  ``"summary"``, ``"utt"`` (utterance strings) and ``"speaker"`` (one name per utterance), plus
  ``"program"``, ``"date"``, ``"url"`` and ``"title"``, which are not used here.
- ``train_val_test_split.json``: ``{"train": [ids], "val": [ids], "test": [ids]}``
  (443,596 / 10,000 / 10,000 in the release; ``"val"`` becomes the TFDS split ``validation``).

Each example is ``{"id", "document", "summary"}`` (all ``Text``); the document is the transcript as
one line per utterance, ``"SPEAKER: utterance"``, joined with ``"\\n"``. A split holds its
interviews in the order of the split file (``disable_shuffling``: record ``i`` is the ``i``-th id
that was kept); the example key is the interview id. Build it with :func:`prepare_mediasum`
(array_record, so ``tfds.data_source`` reads it without TensorFlow)::

    from gqa_jax.data.mediasum import prepare_mediasum
    prepare_mediasum(data_dir="~/tensorflow_datasets", manual_dir="~/mediasum")
    tfds.data_source("mediasum", split="test", data_dir="~/tensorflow_datasets", download=False)

The records' fields come back as UTF-8 ``bytes`` (under ``tfds.testing.mock_data``: random ``str``).
Importing this module registers the builder with TFDS. (TFDS ships its own ``media_sum`` builder
for the same files; it needs Apache Beam, ``json.load``s the whole file, keeps the raw ``utt`` /
``speaker`` lists and calls the validation split ``val``.)

Memory. ``json.load`` of ``news_dialogue.json`` would need ~2.5x the file (~10 GB: its text plus
some 30M small string objects), so the file is parsed incrementally, one interview at a time
(:func:`iter_json_list`, stdlib only, ~130 MB/s), in one validation pass and then one pass per
split. A split's pass keeps only that split's formatted examples (about the size of their text),
and TFDS, to keep the split file's order, sorts the serialized split in memory when it writes the
shards. The time and memory this takes: docs/data.md.

Checks, all before anything is written: a missing manual directory or file is a
``FileNotFoundError``; a file that is not the expected JSON, an interview without a string id,
summary, utterances or speakers, ``len(utt) != len(speaker)``, an id listed twice, or more than
``MAX_MISSING_FRACTION`` of a split's ids absent from ``news_dialogue.json`` is a ``ValueError``
naming the file; a few absent ids are skipped with a warning that counts them.
"""

from __future__ import annotations

import collections
import json
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, TextIO

import tensorflow_datasets as tfds

DIALOGUES_FILE = "news_dialogue.json"
SPLITS_FILE = "train_val_test_split.json"
FEATURES = ("id", "document", "summary")
SPLITS = {"train": "train", "val": "validation", "test": "test"}  # release key -> TFDS split
MAX_MISSING_FRACTION = 0.01  # more absent ids than this means the two files do not belong together
CHUNK_CHARS = 1 << 20  # characters read at a time by iter_json_list
MAX_ELEMENT_CHARS = 1 << 28  # an "interview" longer than this means the file is broken, not big

HOMEPAGE = "https://github.com/zcgzcgzcg1/MediaSum"
MANUAL_DOWNLOAD_INSTRUCTIONS = f"""\
The manual directory (`manual_dir`) must hold the two files of the MediaSum release:

  * {DIALOGUES_FILE}: download the zip linked from {HOMEPAGE}/tree/main/data
    (data/README.md there points to a Google Drive file) and unzip it; the json is ~4 GB.
  * {SPLITS_FILE}: from the same folder, {HOMEPAGE}/tree/main/data.

Then build with `python -m gqa_jax data prepare mediasum --manual-dir THAT_DIR [--data-dir DATA_DIR]`.
"""

CITATION = """\
@inproceedings{zhu2021mediasum,
  title={{MediaSum}: A Large-scale Media Interview Dataset for Dialogue Summarization},
  author={Zhu, Chenguang and Liu, Yang and Mei, Jie and Zeng, Michael},
  booktitle={Proceedings of NAACL-HLT},
  pages={5927--5934},
  year={2021}
}"""

_NON_WHITESPACE = re.compile(r"[^ \t\n\r]")  # JSON whitespace is exactly these four characters


# --------------------------------------------------------------------------- incremental JSON parsing
class _JsonListReader:
    """Reads the elements of a top-level JSON list of objects from a text file, one at a time."""

    def __init__(self, f: TextIO, path: Path, chunk_chars: int, max_element_chars: int):
        self._f, self._path = f, path
        self._chunk_chars, self._max_element_chars = chunk_chars, max_element_chars
        self._decoder = json.JSONDecoder()
        self._buf, self._pos = "", 0  # unread text is self._buf[self._pos:]
        self._offset = 0  # characters of the file before self._buf[0], for error messages
        self._eof = False

    def _error(self, what: str, pos: int) -> ValueError:
        return ValueError(
            f"{self._path} is not a JSON list of objects: {what} at character {self._offset + pos}; "
            "the file may be truncated or not the MediaSum release file (re-download and unzip it)"
        )

    def _read_more(self, num_chars: int) -> bool:
        """Drops the consumed text and appends up to ``num_chars``; False at end of file."""
        if self._eof:
            return False
        self._offset += self._pos
        self._buf, self._pos = self._buf[self._pos :], 0
        text = self._f.read(num_chars)
        if not text:
            self._eof = True
            return False
        self._buf += text
        return True

    def _peek(self) -> str:
        """Skips whitespace and returns the next character, unconsumed ("" at end of file)."""
        while True:
            match = _NON_WHITESPACE.search(self._buf, self._pos)
            if match:
                self._pos = match.start()
                return self._buf[self._pos]
            self._pos = len(self._buf)
            if not self._read_more(self._chunk_chars):
                return ""

    def _object(self) -> dict[str, Any]:
        """Decodes the object starting at the current position, reading more text until it is whole."""
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as e:
                pending = len(self._buf) - self._pos
                if self._eof or pending > self._max_element_chars:
                    raise self._error(e.msg, e.pos) from e
                # Grow geometrically so a long element costs O(its length) re-parsing in all.
                self._read_more(max(self._chunk_chars, pending))
                continue
            self._pos = end
            return value

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._peek() != "[":
            raise self._error("expected '[' (the start of the list)", self._pos)
        self._pos += 1
        if self._peek() == "]":
            self._pos += 1
        else:
            while True:
                char = self._peek()
                if char != "{":
                    raise self._error(
                        f"expected an object, found {char or 'the end of the file'!r}", self._pos
                    )
                yield self._object()
                char = self._peek()
                if char not in (",", "]"):
                    raise self._error(
                        f"expected ',' or ']', found {char or 'the end of the file'!r}", self._pos
                    )
                self._pos += 1
                if char == "]":
                    break
        if self._peek():
            raise self._error("unexpected text after the list", self._pos)


def iter_json_list(
    path: str | os.PathLike,
    *,
    chunk_chars: int = CHUNK_CHARS,
    max_element_chars: int = MAX_ELEMENT_CHARS,
) -> Iterator[dict[str, Any]]:
    """The objects of a file holding one JSON list of objects, parsed incrementally.

    Memory is bounded by the largest element plus ``chunk_chars``, whatever the file size. The file
    is UTF-8 (a BOM is allowed). Raises a ``ValueError`` naming the file and the character offset if
    the text is not a JSON list of objects (including a truncated file, or an element longer than
    ``max_element_chars``, which is taken for a broken file rather than read whole).
    """
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
    path = Path(path)
    with open(path, encoding="utf-8-sig", newline="") as f:
        try:
            yield from _JsonListReader(f, path, chunk_chars, max_element_chars)
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text ({e}); is it the unzipped MediaSum json?") from e


# ----------------------------------------------------------------------------------- release files
def release_files(manual_dir: str | os.PathLike) -> tuple[Path, Path]:
    """``(news_dialogue.json, train_val_test_split.json)`` in ``manual_dir``; FileNotFoundError if absent."""
    manual_dir = Path(manual_dir).expanduser()
    if not manual_dir.is_dir():
        raise FileNotFoundError(
            f"MediaSum manual directory {manual_dir} does not exist.\n{MANUAL_DOWNLOAD_INSTRUCTIONS}"
        )
    paths = manual_dir / DIALOGUES_FILE, manual_dir / SPLITS_FILE
    for path in paths:
        if not path.is_file():
            zips = sorted(p.name for p in manual_dir.glob("*.zip"))
            hint = f" (unzip {', '.join(zips)} there first?)" if zips else ""
            raise FileNotFoundError(f"MediaSum file {path} not found{hint}.\n{MANUAL_DOWNLOAD_INSTRUCTIONS}")
    return paths


def read_split_ids(path: str | os.PathLike) -> dict[str, list[str]]:
    """The interview ids of each TFDS split (train / validation / test) in ``train_val_test_split.json``.

    Raises a ``ValueError`` naming the file if it is not JSON, lacks one of the keys
    ``"train"``, ``"val"``, ``"test"``, a value is not a non-empty list of strings, or an id repeats
    within a split. An id in two splits only warns (the split file is the paper's; keep it as is).
    """
    path = Path(path)
    try:
        with open(path, encoding="utf-8-sig") as f:
            raw = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); re-download {SPLITS_FILE} from {HOMEPAGE}") from e
    if not isinstance(raw, dict) or any(key not in raw for key in SPLITS):
        found = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"{path} must be a JSON object with keys {list(SPLITS)}, found {found}")
    split_ids = {}
    for key, split in SPLITS.items():
        ids = raw[key]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise ValueError(f"{path}: {key!r} must be a non-empty list of interview id strings")
        repeated = sorted(i for i, count in collections.Counter(ids).items() if count > 1)
        if repeated:
            raise ValueError(f"{path}: {len(repeated)} ids repeat within {key!r}, e.g. {repeated[:5]}")
        split_ids[split] = ids
    names = list(split_ids)
    for a, name_a in enumerate(names):
        for name_b in names[a + 1 :]:
            shared = set(split_ids[name_a]) & set(split_ids[name_b])
            if shared:
                warnings.warn(
                    f"{path}: {len(shared)} ids are in both {name_a} and {name_b}, e.g. {sorted(shared)[:5]}",
                    stacklevel=2,
                )
    return split_ids


def format_interview(
    interview: dict[str, Any], *, path: str | os.PathLike = DIALOGUES_FILE
) -> dict[str, str]:
    """One example ``{"id", "document", "summary"}`` of a release interview object.

    The document is ``"SPEAKER: utterance"`` per utterance, joined with ``"\\n"`` (text kept as is).
    Raises a ``ValueError`` naming the interview and ``path`` if a field is missing or of the wrong
    type, or ``utt`` and ``speaker`` differ in length.
    """
    name = interview.get("id")
    where = f"{path}: interview {name!r}"
    if not isinstance(name, str):
        raise ValueError(f"{where} has no string 'id'")
    summary, utt, speaker = (interview.get(k) for k in ("summary", "utt", "speaker"))
    if not isinstance(summary, str):
        raise ValueError(f"{where} has no string 'summary' (got {type(summary).__name__})")
    for key, value in (("utt", utt), ("speaker", speaker)):
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise ValueError(f"{where}: {key!r} must be a list of strings")
    if len(utt) != len(speaker):
        raise ValueError(f"{where} has len(utt)={len(utt)} != len(speaker)={len(speaker)}")
    document = "\n".join(f"{s}: {u}" for s, u in zip(speaker, utt, strict=True))
    return {"id": name, "document": document, "summary": summary}


def iter_interviews(path: str | os.PathLike, wanted: set[str]) -> Iterator[dict[str, str]]:
    """The formatted examples (:func:`format_interview`) of the interviews whose id is in ``wanted``.

    In file order, parsed incrementally. Every interview must have a string ``"id"``; the others
    are not looked into. ValueError naming the file on malformed JSON or a malformed wanted interview.
    """
    for index, interview in enumerate(iter_json_list(path)):
        name = interview.get("id")
        if not isinstance(name, str):
            raise ValueError(f"{path}: interview #{index} (0-based) has no string 'id' (got {name!r})")
        if name in wanted:
            yield format_interview(interview, path=path)


def check_coverage(
    split_ids: dict[str, list[str]], present: set[str], dialogues: Path
) -> dict[str, list[str]]:
    """Drops, per split, the ids absent from the dialogues file: a warning if few, a ValueError if many.

    "Many" is more than ``MAX_MISSING_FRACTION`` of the split, or all of it (an empty split is an
    error whatever the fraction). Returns the ids kept, in the split file's order.
    """
    kept = {}
    for split, ids in split_ids.items():
        missing = [i for i in ids if i not in present]
        if missing:
            message = (
                f"{len(missing)} of the {len(ids)} {split} ids in {SPLITS_FILE} are not in {dialogues}, "
                f"e.g. {missing[:5]}"
            )
            if len(missing) == len(ids):
                raise ValueError(f"{message}; the split would be empty: is {dialogues} the MediaSum release?")
            if len(missing) > MAX_MISSING_FRACTION * len(ids):
                raise ValueError(
                    f"{message}; more than {MAX_MISSING_FRACTION:.0%} missing means the two files do not "
                    f"belong together: take both from the same MediaSum release ({HOMEPAGE})"
                )
            warnings.warn(f"{message}; skipping them", stacklevel=2)
        kept[split] = [i for i in ids if i in present]
    return kept


# ------------------------------------------------------------------------------------ TFDS builder
class Mediasum(tfds.core.GeneratorBasedBuilder):
    """MediaSum: interview transcript ("SPEAKER: utterance" lines) -> abstractive summary."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES: ClassVar[dict[str, str]] = {"1.0.0": "Initial release."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = MANUAL_DOWNLOAD_INSTRUCTIONS

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="MediaSum (Zhu et al., 2021): NPR and CNN interview transcripts with summaries.",
            features=tfds.features.FeaturesDict({name: tfds.features.Text() for name in FEATURES}),
            supervised_keys=("document", "summary"),
            homepage=HOMEPAGE,
            citation=CITATION,
            disable_shuffling=True,  # keep the split file's order
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Iterator]:
        try:
            manual_dir = dl_manager.manual_dir
        except AssertionError as e:  # TFDS's way of saying the directory is missing or empty
            raise FileNotFoundError(str(e)) from e
        dialogues, splits_file = release_files(manual_dir)
        split_ids = read_split_ids(splits_file)
        # Validation pass: every wanted interview is well formed and appears once, before any writing.
        wanted = {i for ids in split_ids.values() for i in ids}
        present: set[str] = set()
        for example in iter_interviews(dialogues, wanted):
            if example["id"] in present:
                raise ValueError(f"{dialogues}: interview {example['id']!r} appears more than once")
            present.add(example["id"])
        kept = check_coverage(split_ids, present, dialogues)
        return {split: self._generate_examples(dialogues, ids) for split, ids in kept.items()}

    def _generate_examples(self, dialogues: Path, ids: list[str]) -> Iterator[tuple[str, dict[str, str]]]:
        """One pass over the dialogues keeping this split's examples, then them in ``ids`` order."""
        examples = {example["id"]: example for example in iter_interviews(dialogues, set(ids))}
        for name in ids:
            yield name, examples.pop(name)  # pop: memory goes down as TFDS takes the examples


def prepare_mediasum(data_dir: str | os.PathLike, manual_dir: str | os.PathLike) -> dict[str, int]:
    """Builds ``mediasum`` (array_record) into ``data_dir`` from the release files in ``manual_dir``.

    Idempotent: a dataset already built in ``data_dir`` is only read (``manual_dir`` is then not
    needed). Returns the number of examples per split, ``{"train": n, "validation": n, "test": n}``.
    A full build reads the ~4 GB JSON four times and needs ~6-7 GB of RAM (see the module docstring).
    """
    builder = Mediasum(data_dir=os.fspath(Path(data_dir).expanduser()))
    if not builder.is_prepared():
        manual_dir = Path(manual_dir).expanduser()
        release_files(manual_dir)  # our errors, before TFDS's
        config = tfds.download.DownloadConfig(manual_dir=os.fspath(manual_dir), try_download_gcs=False)
        builder.download_and_prepare(file_format="array_record", download_config=config)
    return {split: builder.info.splits[split].num_examples for split in SPLITS.values()}
