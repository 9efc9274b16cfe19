"""SentencePiece vocabulary with T5's sentinel ids, batched encode / decode, and training one.

Id layout (T5's, as seqio builds it from a SentencePiece model of ``sp_size`` pieces):

    0 pad, 1 eos, 2 unk                      (the SentencePiece model must put them there)
    3 .. sp_size - 1                          the model's other pieces
    sp_size .. sp_size + extra_ids - 1        sentinels; <extra_id_i> = sp_size + extra_ids - 1 - i
    sp_size + extra_ids .. vocab_size - 1     unused, padding ``vocab_size`` to a multiple of 128

so ``<extra_id_0>`` is the highest real id. For the public T5 model (32000 pieces): sentinels
32000 .. 32099, ``<extra_id_0>`` = 32099, ``vocab_size`` 32128. ``unpadded_size`` (32100) is the
``vocab_size`` that :func:`gqa_jax.data.span_corruption.span_corrupt` expects.

:func:`train_vocab` trains a unigram model T5-style (pad 0, eos 1, unk 2, no bos) with settings
for source code: no normalization, whitespace kept (runs of spaces are pieces of their own) and
byte fallback, so ``decode(encode(text)) == text`` for any text without U+2581 ("▁", which
SentencePiece uses for a space and so decodes as one). Newlines never appear inside a training
sentence (a sentence is a line); they encode as the byte piece ``<0x0A>``.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import json
import os
import random
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from gqa_jax import paths

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
NUM_EXTRA_IDS = 100  # T5's <extra_id_0> .. <extra_id_99>
VOCAB_MULTIPLE = 128  # vocab_size is padded to a multiple of this (32100 -> 32128 for T5)
HASH_CHARS = 16  # hex characters of content_hash()
# Lines train_vocab samples from a larger corpus: the same characters per token as training on every
# line, in less time (docs/data.md).
DEFAULT_MAX_SENTENCES = 200_000

# SentencePiece trainer settings of train_vocab (recorded in the JSON sidecar of each model).
TRAINER_OPTIONS: dict[str, Any] = {
    "model_type": "unigram",  # T5's
    "pad_id": PAD_ID,
    "eos_id": EOS_ID,
    "unk_id": UNK_ID,
    "bos_id": -1,  # T5 has no BOS
    "byte_fallback": True,  # a character outside the vocabulary becomes its UTF-8 bytes, never <unk>
    "normalization_rule_name": "identity",  # no NFKC: text comes back exactly as it went in
    "remove_extra_whitespaces": False,  # keep indentation and runs of spaces
    # Let runs of spaces be pieces ("▁▁▁▁"): indentation is one token, not one per space (docs/data.md).
    "allow_whitespace_only_pieces": True,
    "input_sentence_size": 0,  # train on every line given: train_vocab samples them itself
    # Prune in fewer, larger steps with one EM pass each (SentencePiece's defaults: 0.75, 2): faster,
    # the same characters per token (docs/data.md).
    "shrinking_factor": 0.5,
    "num_sub_iterations": 1,
}
_MAX_SENTENCE_BYTES = 4192  # SentencePiece's max_sentence_length: train_vocab leaves longer lines out


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _sidecar_path(model_path: Path) -> Path:
    """``<out>.json``: the training settings and corpus hash written next to a trained model."""
    return model_path.with_name(model_path.name + ".json")


class Vocabulary:
    """A SentencePiece model plus ``extra_ids`` sentinel ids at the top (see the module docstring).

    Picklable (the model travels as bytes), so it can go to data-loader worker processes.
    """

    def __init__(self, model_path: str | os.PathLike, extra_ids: int = NUM_EXTRA_IDS):
        path = paths.resolve(model_path, "SentencePiece model")  # local or gs://
        if not path.exists():
            raise FileNotFoundError(
                f"SentencePiece model {str(path)!r} does not exist; check the path, or train one with "
                "`python -m gqa_jax data train-vocab --corpus FILES --size 8000 --out FILE.model`"
            )
        if not path.is_file():
            raise ValueError(f"SentencePiece model {str(path)!r} is not a file (a directory?)")
        if not isinstance(extra_ids, int) or extra_ids < 0:
            raise ValueError(f"extra_ids must be an int >= 0, got {extra_ids!r}")
        proto = path.read_bytes()
        sp = spm.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(proto)
        except RuntimeError as e:
            raise ValueError(
                f"{str(path)!r} ({len(proto)} bytes) is not a SentencePiece model (could not parse it: "
                f"{str(e).strip()}); pass the .model file written by SentencePiece training"
            ) from None
        special = {"pad": (sp.pad_id(), PAD_ID), "eos": (sp.eos_id(), EOS_ID), "unk": (sp.unk_id(), UNK_ID)}
        wrong = [f"{name}_id={got} (need {want})" for name, (got, want) in special.items() if got != want]
        if wrong:
            raise ValueError(
                f"SentencePiece model {str(path)!r} has {', '.join(wrong)}; T5 vocabularies need pad 0, "
                "eos 1, unk 2: retrain it with pad_id=0 eos_id=1 unk_id=2 bos_id=-1 (as train_vocab does)"
            )
        self.path = str(path)
        self.sp_size = sp.get_piece_size()
        self.extra_ids = extra_ids
        self.vocab_size = _round_up(self.sp_size + extra_ids, VOCAB_MULTIPLE)
        self._sp = sp
        self._hash = hashlib.sha256(proto).hexdigest()[:HASH_CHARS]

    # ------------------------------------------------------------------------------- ids
    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def unpadded_size(self) -> int:
        """``sp_size + extra_ids``: ids below it are real (32100 for T5); the rest only pad the vocab."""
        return self.sp_size + self.extra_ids

    def sentinel_id(self, i: int) -> int:
        """Id of ``<extra_id_i>``: ``sp_size + extra_ids - 1 - i`` (``<extra_id_0>`` is the highest)."""
        if not 0 <= i < self.extra_ids:
            raise ValueError(
                f"sentinel index {i} out of range: this vocabulary has extra_ids={self.extra_ids}"
            )
        return self.unpadded_size - 1 - i

    def content_hash(self) -> str:
        """First 16 hex characters of the sha256 of the model file's bytes (for manifests)."""
        return self._hash

    def __repr__(self) -> str:
        return (
            f"Vocabulary(path={self.path!r}, sp_size={self.sp_size}, extra_ids={self.extra_ids}, "
            f"vocab_size={self.vocab_size})"
        )

    # ---------------------------------------------------------------------------- encode
    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (no EOS appended; never sentinel ids: ``"<extra_id_0>"`` is plain text)."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """:meth:`encode` of each text, in SentencePiece's threaded batch encoder.

        ``num_threads``: SentencePiece's (``None``: its default, all cores).
        """
        if isinstance(texts, str):
            raise ValueError("encode_batch takes a sequence of str, got one str; use encode() for one text")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"encode_batch: texts[{i}] is {type(text).__name__}, not str")
        if not texts:
            return []
        return self._sp.encode(texts, num_threads=-1 if num_threads is None else num_threads)

    # ---------------------------------------------------------------------------- decode
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of ``ids`` ``[L]``: up to the first EOS, pads dropped, sentinels as ``<extra_id_i>``.

        Ids in ``[unpadded_size, vocab_size)`` (vocabulary padding; a model may still predict them)
        decode as unk (SentencePiece renders it " ⁇ "); ids outside ``[0, vocab_size)`` are an error.
        """
        if np.ndim(ids) != 1:
            raise ValueError(f"decode takes 1-D ids, got shape {np.shape(ids)}; use decode_batch for [B, L]")
        return self.decode_batch([ids])[0]

    def decode_batch(self, batch: Sequence[Sequence[int]] | np.ndarray) -> list[str]:
        """:meth:`decode` of each row of ``batch``: a ``[B, L]`` array or a list of id lists (ragged ok)."""
        if isinstance(batch, np.ndarray) or hasattr(batch, "__array__"):
            batch = np.asarray(batch)
            if batch.ndim != 2:
                raise ValueError(f"decode_batch takes a [B, L] array, got shape {batch.shape}")
        # Each row becomes parts: str (a rendered sentinel) or int (an index into `runs`, a run of
        # ordinary ids decoded in one batched SentencePiece call).
        runs: list[list[int]] = []
        rows: list[list[str | int]] = []
        for r, row in enumerate(batch):
            ids = self._clean_row(row, r)
            sentinel_at = np.flatnonzero(ids >= self.sp_size)
            parts: list[str | int] = []
            start = 0
            for pos in [*sentinel_at.tolist(), ids.size]:
                if pos > start:
                    parts.append(len(runs))
                    runs.append(ids[start:pos].tolist())
                if pos < ids.size:
                    parts.append(f"<extra_id_{self.unpadded_size - 1 - int(ids[pos])}>")
                start = pos + 1
            rows.append(parts)
        texts = self._sp.decode(runs) if runs else []
        out = []
        for parts in rows:
            pieces = []
            for j, part in enumerate(parts):
                if isinstance(part, str):
                    pieces.append(part)
                    continue
                text = texts[part]
                # SentencePiece drops the leading "▁" of a sequence (its dummy prefix); after a
                # sentinel it is a real space, as if the sentinel were a piece of the model.
                if j > 0 and self._sp.id_to_piece(runs[part][0]).startswith("▁"):
                    text = " " + text
                pieces.append(text)
            out.append("".join(pieces))
        return out

    def _clean_row(self, row: Sequence[int] | np.ndarray, r: int) -> np.ndarray:
        """Row ``r`` as int64 ``[L']``: cut at the first EOS, pads dropped, padding ids -> unk."""
        ids = np.asarray(row)
        if ids.ndim != 1:
            raise ValueError(f"row {r} must be a 1-D sequence of ids, got shape {ids.shape}")
        if ids.size == 0:
            return np.zeros([0], np.int64)
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"row {r} must hold integer ids, got dtype {ids.dtype}")
        ids = ids.astype(np.int64)
        bad = (ids < 0) | (ids >= self.vocab_size)
        if bad.any():
            raise ValueError(
                f"row {r} has id {int(ids[bad][0])} at position {int(np.flatnonzero(bad)[0])}, outside "
                f"[0, vocab_size={self.vocab_size})"
            )
        eos = np.flatnonzero(ids == EOS_ID)
        if eos.size:
            ids = ids[: eos[0]]
        ids = ids[ids != PAD_ID]
        return np.where(ids >= self.unpadded_size, UNK_ID, ids)


def load_vocab(path: str | os.PathLike) -> Vocabulary:
    """The :class:`Vocabulary` of the SentencePiece model at ``path``, with T5's 100 sentinels."""
    return Vocabulary(path)


# -------------------------------------------------------------------------------------- training
class _Corpus:
    """The training lines: every non-blank line of the texts and files, sampled down to ``max_lines``.

    Sampling is ours (reservoir sampling with ``random.Random(seed)``), not SentencePiece's, whose
    sample differs from one process to the next whatever ``set_random_generator_seed`` says. Counts
    and hashes every line read, so the sidecar can name the corpus. No line at all is a ValueError.
    """

    def __init__(self, texts: Iterable[str] | None, corpus_files: Sequence[Path], max_lines: int, seed: int):
        self.count = 0  # non-blank lines read
        self.long = 0  # of which longer than SentencePiece's max_sentence_length: left out
        self.sha256 = hashlib.sha256()
        rng = random.Random(seed)
        self.lines: list[str] = []
        for line in self._read(texts, corpus_files):
            if len(self.lines) < max_lines:
                self.lines.append(line)
            else:  # Algorithm R: line number i (0-based) is kept with probability max_lines / (i + 1)
                j = rng.randrange(self.count - self.long)
                if j < max_lines:
                    self.lines[j] = line
        if not self.lines:
            left_out = f" ({self.long} lines longer than {_MAX_SENTENCE_BYTES} bytes are left out)"
            raise ValueError(
                "the corpus is empty: it has no non-blank lines to train on"
                f"{left_out if self.long else ''}; pass texts or --corpus files with text"
            )

    def _split(self, text: str) -> Iterator[str]:
        for line in text.splitlines():
            if line.strip():
                self.count += 1
                data = line.encode("utf-8", "surrogatepass")
                self.sha256.update(data + b"\n")
                if len(data) > _MAX_SENTENCE_BYTES:
                    self.long += 1
                else:
                    yield line

    def _read(self, texts: Iterable[str] | None, corpus_files: Sequence[Path]) -> Iterator[str]:
        for i, text in enumerate(texts or ()):
            if not isinstance(text, str):
                raise TypeError(f"train_vocab: texts item {i} is {type(text).__name__}, not str")
            yield from self._split(text)
        for path in corpus_files:
            try:
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        yield from self._split(line)
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"corpus file {str(path)!r} is not UTF-8 text ({e.reason} in a line near byte "
                    f"{e.start}); convert it to UTF-8 or leave it out"
                ) from None


def _rephrase_trainer_error(e: RuntimeError, size: int, num_lines: int) -> ValueError:
    """SentencePiece's RuntimeError as a ValueError that says what to change."""
    msg = str(e)
    if m := re.search(r"Vocabulary size too high \((\d+)\).*<= (\d+)", msg):
        return ValueError(
            f"size={size} is too large for this corpus ({num_lines} lines): SentencePiece finds at "
            f"most {m.group(2)} pieces in it; pass a smaller --size (<= {m.group(2)}) or a larger corpus"
        )
    if m := re.search(r"smaller than required_chars\. (\d+) vs (\d+)", msg):
        return ValueError(
            f"size={size} is too small for this corpus: it needs at least {m.group(2)} pieces (3 special, "
            f"256 bytes and its characters); pass --size >= {m.group(2)}"
        )
    return ValueError(f"SentencePiece training failed (size={size}, {num_lines} lines): {msg.strip()}")


def _check_train_args(texts: Iterable[str] | None, files: Sequence[Path], size: int, out: Path,
                      overwrite: bool, max_sentences: int, num_threads: int) -> None:  # fmt: skip
    """``train_vocab``'s arguments, each error saying what to pass instead."""
    if texts is None and not files:
        raise ValueError("train_vocab needs texts or corpus_files (--corpus); got neither")
    if isinstance(texts, str):
        raise ValueError("texts must be an iterable of documents, got one str; wrap it in a list")
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive int, got {size!r}")
    if max_sentences < 1 or num_threads < 1:
        raise ValueError(f"max_sentences and num_threads must be >= 1, got {max_sentences}, {num_threads}")
    for path in files:
        if not path.exists():
            raise FileNotFoundError(f"corpus file {str(path)!r} does not exist")
        if not path.is_file():
            raise ValueError(
                f"corpus file {str(path)!r} is not a file (to use a folder, pass a glob: DIR/**/*.py)"
            )
    if not overwrite:
        for path in (out, _sidecar_path(out)):
            if path.exists():
                raise FileExistsError(
                    f"{str(path)!r} already exists; pass overwrite=True (--overwrite) to replace it"
                )
    if out.is_dir():
        raise ValueError(
            f"out {str(out)!r} is a directory; pass a file name such as {str(out / 'spm.model')!r}"
        )


def _train_model(lines: list[str], options: dict[str, Any], num_threads: int) -> bytes:
    """The serialized SentencePiece model trained on ``lines`` with ``options``."""
    model = io.BytesIO()  # SentencePiece writes the serialized model here
    try:  # minloglevel 2: warnings and errors only
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                       num_threads=num_threads, minloglevel=2, **options)  # fmt: skip
    except RuntimeError as e:
        raise _rephrase_trainer_error(e, options["vocab_size"], len(lines)) from None
    return model.getvalue()


def train_vocab(
    texts: Iterable[str] | None = None,
    *,
    corpus_files: Sequence[str | os.PathLike] = (),
    size: int,
    out: str | os.PathLike,
    overwrite: bool = False,
    max_sentences: int = DEFAULT_MAX_SENTENCES,
    seed: int = 0,
    num_threads: int = 2,
) -> Vocabulary:
    """Train a SentencePiece unigram model of ``size`` pieces on ``texts`` and ``corpus_files``.

    Every non-blank line of the texts (documents) and UTF-8 files is a training sentence (lines over
    4192 bytes are left out, as SentencePiece would); of more than ``max_sentences`` lines, that many
    are sampled at random with ``seed``. The same input, ``seed``, ``num_threads`` and SentencePiece
    version give the same model bytes (the thread count changes the floating-point sums of EM).
    Settings: ``TRAINER_OPTIONS``.

    Writes ``out`` (the ``.model`` file) and ``<out>.json`` (settings, line count, corpus sha256),
    each by an atomic rename; an existing one is a ``FileExistsError`` unless ``overwrite``.
    Returns the :class:`Vocabulary` of ``out`` (``size`` pieces + 100 sentinels, padded to 128).
    """
    out = Path(out)
    files = [Path(p) for p in corpus_files]
    _check_train_args(texts, files, size, out, overwrite, max_sentences, num_threads)
    corpus = _Corpus(texts, files, max_sentences, seed)
    options = {**TRAINER_OPTIONS, "vocab_size": size}
    model = _train_model(corpus.lines, options, num_threads)
    info = {
        "sentencepiece_version": spm.__version__,
        "trainer_options": options,
        "max_sentences": max_sentences,
        "seed": seed,
        "num_threads": num_threads,
        "corpus_files": [str(p) for p in files],
        "corpus_lines": corpus.count,
        "corpus_lines_too_long": corpus.long,
        "corpus_lines_used": len(corpus.lines),
        "corpus_sha256": corpus.sha256.hexdigest(),
        "model_sha256": hashlib.sha256(model).hexdigest(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    if not overwrite and out.exists():  # appeared while we trained
        raise FileExistsError(f"{str(out)!r} already exists; pass overwrite=True (--overwrite) to replace it")
    paths.write_text_atomic(_sidecar_path(out), json.dumps(info, indent=2) + "\n")
    paths.write_bytes_atomic(out, model)  # last: an existing model file is always a complete one
    return Vocabulary(out)


# -------------------------------------------------------------------------------------------- CLI
def add_train_vocab_args(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m gqa_jax data train-vocab``."""
    parser.add_argument(
        "--corpus",
        nargs="+",
        required=True,
        metavar="FILE_OR_GLOB",
        help="UTF-8 text files, or globs (quoted; ** recurses), e.g. 'src/**/*.py'; every non-blank line "
        "is a training sentence",
    )
    parser.add_argument("--size", type=int, required=True, help="SentencePiece pieces, e.g. 8000")
    parser.add_argument("--out", required=True, help="the .model file to write (and OUT.json beside it)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument(
        "--max-sentences",
        type=int,
        default=DEFAULT_MAX_SENTENCES,
        help="train on at most this many lines, sampled at random (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the line sampling (default: %(default)s)"
    )
    parser.add_argument("--num-threads", type=int, default=2, help="trainer threads (default: %(default)s)")


def expand_corpus(patterns: Sequence[str]) -> list[Path]:
    """Files named by ``patterns`` (paths or globs, ``**`` recursive), sorted per pattern, deduplicated."""
    files: dict[Path, None] = {}
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise FileNotFoundError(f"--corpus {pattern!r} matches no files")
            files.update(dict.fromkeys(matches))
        else:
            files[Path(pattern)] = None  # train_vocab checks it exists and is a file
    return list(files)


def run_train_vocab(args: argparse.Namespace) -> int:
    """Train a vocabulary from ``args`` (see :func:`add_train_vocab_args`); print one summary line."""
    start = time.perf_counter()
    try:
        files = expand_corpus(args.corpus)
        vocab = train_vocab(
            corpus_files=files,
            size=args.size,
            out=args.out,
            overwrite=args.overwrite,
            max_sentences=args.max_sentences,
            seed=args.seed,
            num_threads=args.num_threads,
        )
    except (FileNotFoundError, FileExistsError) as e:  # the CLI reports ValueErrors in one line
        raise ValueError(str(e)) from None
    info = json.loads(_sidecar_path(Path(vocab.path)).read_text())
    print(
        f"trained {vocab.path}: {vocab.sp_size} pieces, vocab size {vocab.vocab_size} (+{vocab.extra_ids} "
        f"sentinels, padded to a multiple of {VOCAB_MULTIPLE}), {len(files)} files, "
        f"{info['corpus_lines']} lines, {time.perf_counter() - start:.1f} s"
    )
    return 0
