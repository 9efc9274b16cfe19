"""The embedded offline task suite: four TFDS datasets built from the running Python's stdlib source.

Every machine that runs this package has a Python standard library, so the mini reproduction needs
no download. The suite mirrors the paper's task kinds and goes through the same TFDS code path
(array_record files read with ``tfds.data_source``) as the real datasets:

- ``stdlib_corpus``: one example per module file, ``{"path", "text"}``, for span-corruption
  pre-training.
- ``stdlib_docsum`` (short summarization, like CNN/DM): a function's source with its docstring
  removed -> the docstring's first sentence. ``{"id", "source", "summary"}``; ROUGE.
- ``stdlib_modsum`` (long-input summarization, like arXiv): a module's source with its docstring
  removed -> the module docstring's first paragraph. ``{"id", "source", "summary"}``; ROUGE.
- ``stdlib_qa`` (long-input QA, like TriviaQA): a module's source with one function's docstring
  removed, and that docstring's first sentence -> the function's name.
  ``{"id", "source", "question", "answer"}``; F1 / EM.

The files read and the extraction rules are in ``gqa_jax.data.stdlib_extract``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import tensorflow_datasets as tfds

from gqa_jax.data.locations import default_data_dir
from gqa_jax.data.stdlib_extract import (
    Module,
    docsum_examples,
    modsum_examples,
    parsed,
    qa_examples,
    read_files,
    source_settings,
    split_of,
    suite_config_name,
)

SUITE = ("stdlib_corpus", "stdlib_docsum", "stdlib_modsum", "stdlib_qa")
SPLITS = ("train", "validation", "test")
SUITE_VERSION = "1.0.0"  # bump when the extraction rules change
BUILD_COMMAND = "python -m gqa_jax data build-suite --data-dir DIR"
VOCAB_SIZE = 8_000


# ------------------------------------------------------------------------------------ TFDS builders
@dataclasses.dataclass(eq=False)
class StdlibConfig(tfds.core.BuilderConfig):
    """One stdlib snapshot: its source root, file limit and fingerprint (the name encodes both)."""

    root: str = ""
    max_files: int | None = None
    fingerprint: dict[str, Any] = dataclasses.field(default_factory=dict)


@functools.cache
def _config(root: str, max_files: int | None) -> StdlibConfig:
    """The config of a source root; one object per process, so TFDS sees the same config each time."""
    fp = read_files(root, max_files)[0]
    description = f"Python {fp['python_version']} stdlib at {root}: {fp['num_files']} files"
    return StdlibConfig(
        name=suite_config_name(fp), description=description, root=root, max_files=max_files, fingerprint=fp
    )


def _current_config() -> StdlibConfig:
    return _config(*source_settings())


class _StdlibBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Shared builder: the config defaults to this process's stdlib; subclasses pick the examples."""

    VERSION = tfds.core.Version(SUITE_VERSION)
    RELEASE_NOTES: ClassVar[dict[str, str]] = {SUITE_VERSION: "Initial release."}
    FEATURES: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, file_format: str | None = None, **kwargs: Any):
        # array_record by default: TFDS's default (tfrecord) cannot be written without TensorFlow.
        super().__init__(file_format=file_format or "array_record", **kwargs)

    def get_default_builder_config(self) -> StdlibConfig:
        """This process's stdlib (see the module doc for the environment variables)."""
        return _current_config()

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.__doc__,
            features=tfds.features.FeaturesDict({k: tfds.features.Text() for k in self.FEATURES}),
            metadata=tfds.core.MetadataDict(self.builder_config.fingerprint),
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[str, dict[str, str]]]]:
        del dl_manager  # nothing to download
        config = self.builder_config
        if read_files(config.root, config.max_files)[0] != config.fingerprint:
            raise ValueError(f"the files under {config.root} changed since config {config.name} was made")
        by_split: dict[str, list[dict[str, str]]] = {split: [] for split in SPLITS}
        for path, text, module in parsed(config.root, config.max_files):
            by_split[split_of(path)].extend(self._examples(path, text, module))
        # TFDS cannot write an empty split: leave it out (suite_data_source then names the others).
        return {split: self._generate_examples(rows) for split, rows in by_split.items() if rows}

    def _generate_examples(self, rows: list[dict[str, str]]) -> Iterator[tuple[str, dict[str, str]]]:
        for row in rows:
            yield row["id" if "id" in row else "path"], row

    def _examples(self, path: str, text: str, module: Module | None) -> Iterator[dict[str, str]]:
        raise NotImplementedError


class StdlibCorpus(_StdlibBuilder):
    """Python stdlib source, one example per module file ({"path", "text"}), for pre-training."""

    FEATURES = ("path", "text")

    def _examples(self, path: str, text: str, module: Module | None) -> Iterator[dict[str, str]]:
        yield {"path": path, "text": text}


class StdlibDocsum(_StdlibBuilder):
    """Short summarization: a function's source without its docstring -> the docstring's first sentence."""

    FEATURES = ("id", "source", "summary")

    def _examples(self, path: str, text: str, module: Module | None) -> Iterator[dict[str, str]]:
        return docsum_examples(module) if module else iter(())


class StdlibModsum(_StdlibBuilder):
    """Long-input summarization: a module's source without its docstring -> its first paragraph."""

    FEATURES = ("id", "source", "summary")

    def _examples(self, path: str, text: str, module: Module | None) -> Iterator[dict[str, str]]:
        return modsum_examples(module) if module else iter(())


class StdlibQa(_StdlibBuilder):
    """Long-input QA: a module's source + one function's docstring sentence -> the function's name."""

    FEATURES = ("id", "source", "question", "answer")

    def _examples(self, path: str, text: str, module: Module | None) -> Iterator[dict[str, str]]:
        return qa_examples(module) if module else iter(())


BUILDERS: dict[str, type[_StdlibBuilder]] = {
    "stdlib_corpus": StdlibCorpus,
    "stdlib_docsum": StdlibDocsum,
    "stdlib_modsum": StdlibModsum,
    "stdlib_qa": StdlibQa,
}


def _check_names(names: Sequence[str]) -> None:
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        raise ValueError(f"unknown suite datasets {unknown}; the suite is {list(SUITE)}")


def build_suite(
    data_dir: str | os.PathLike, *, names: Sequence[str] = SUITE, log: Callable[[str], Any] = print
) -> dict[str, dict[str, int]]:
    """Build (array_record) the datasets of ``names`` missing from ``data_dir``; examples per split.

    Idempotent: a dataset already built for this stdlib's config is only read. Returns
    ``{name: {split: num_examples}}`` over the splits that exist (empty ones are not written).
    """
    _check_names(names)
    counts = {}
    for name in names:
        builder = BUILDERS[name](data_dir=os.fspath(data_dir))
        if (Path(builder.data_dir) / "dataset_info.json").is_file():  # is_prepared(), minus a warning
            log(f"{name}: present at {builder.data_dir}")
        else:
            log(f"{name}: building {builder.data_dir}")
            # TFDS's own lines ("Downloading and preparing dataset Unknown size ...") and its
            # progress bars say nothing about a local build: kept off the terminal
            tfds.display_progress_bar(False)
            with contextlib.redirect_stdout(io.StringIO()):
                builder.download_and_prepare(
                    file_format="array_record",
                    download_config=tfds.download.DownloadConfig(try_download_gcs=False),
                )
        counts[name] = {s: builder.info.splits[s].num_examples for s in SPLITS if s in builder.info.splits}
    return counts


def suite_data_source(name: str, split: str, data_dir: str | os.PathLike) -> Sequence[dict[str, Any]]:
    """``tfds.data_source`` of a built suite dataset for this process's stdlib (random access).

    Items are dicts of ``bytes`` (TFDS decodes ``Text`` features to bytes without TensorFlow).

    Raises a ``ValueError`` naming the build command if the data is not built for this stdlib, and
    one listing the existing splits for an unknown split (TFDS slices like ``train[:10]`` work).
    """
    _check_names([name])
    config = _current_config()
    data_dir = Path(data_dir)
    variant = data_dir / name / config.name / SUITE_VERSION
    if not (variant / "dataset_info.json").is_file():
        others = sorted({p.parent.parent.name for p in (data_dir / name).glob("*/*/dataset_info.json")})
        also = f" (built there: {', '.join(others)})" if others else ""
        raise ValueError(
            f"{name} for this Python's stdlib ({config.name}) is not built in {data_dir}{also}; "
            f"build it with `{BUILD_COMMAND.replace('DIR', str(data_dir))}`"
        )
    full_name = f"{name}/{config.name}:{SUITE_VERSION}"
    existing = list(tfds.builder(full_name, data_dir=data_dir).info.splits)
    for part in split.split("+"):
        if part.split("[")[0].strip() not in existing:
            raise ValueError(f"unknown split {split!r} of {name} ({config.name}); it has {existing}")
    return tfds.data_source(full_name, split=split, data_dir=data_dir, download=False)


# ------------------------------------------------------------------------------------- vocabulary
def suite_vocab_path(data_dir: str | os.PathLike, size: int = VOCAB_SIZE) -> Path:
    """Where the suite's SentencePiece model lives: ``DATA_DIR/stdlib_vocab/<config>/spm<size>.model``."""
    return Path(data_dir) / "stdlib_vocab" / _current_config().name / f"spm{size}.model"


def suite_vocab_size(path: str | os.PathLike, data_dir: str | os.PathLike) -> int | None:
    """The size of the suite's vocabulary that ``path`` names (:func:`suite_vocab_path`), else None."""
    found = re.fullmatch(r"spm(\d+)\.model", Path(path).name)
    if found is None or Path(path).absolute() != suite_vocab_path(data_dir, int(found[1])).absolute():
        return None
    return int(found[1])


def suite_vocab(data_dir: str | os.PathLike, size: int = VOCAB_SIZE, *, log: Callable[[str], Any] = print):
    """The suite's vocabulary: trained once on the train split of ``stdlib_corpus``, then loaded.

    Builds ``stdlib_corpus`` first if it is missing. Returns a ``gqa_jax.data.vocab.Vocabulary``.
    """
    from gqa_jax.data import vocab  # lazy: sentencepiece is only needed here

    path = suite_vocab_path(data_dir, size)
    if path.is_file():
        return vocab.load_vocab(path)
    build_suite(data_dir, names=("stdlib_corpus",), log=log)
    source = suite_data_source("stdlib_corpus", "train", data_dir)
    texts = (source[i]["text"].decode("utf-8") for i in range(len(source)))
    log(f"stdlib vocabulary: training {size} pieces into {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return vocab.train_vocab(texts, size=size, out=path)


# --------------------------------------------------------------------------------------------- CLI
def add_build_suite_args(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m gqa_jax data build-suite``."""
    parser.add_argument(
        "--data-dir",
        default=None,
        help="TFDS data directory (default: $GQA_JAX_DATA_DIR, $TFDS_DATA_DIR or ~/tensorflow_datasets)",
    )
    parser.add_argument(
        "--names", nargs="+", default=list(SUITE), choices=SUITE, help="datasets to build (default: all)"
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=VOCAB_SIZE,
        help="suite vocabulary size; 0: none (default: %(default)s)",
    )


def run_build_suite(args: argparse.Namespace) -> int:
    """Build the suite (and its vocabulary) into ``args.data_dir``; print examples per split and seconds."""
    data_dir = Path(args.data_dir or default_data_dir()).expanduser()
    config = _current_config()
    fp = config.fingerprint
    print(f"stdlib: Python {fp['python_version']}, {fp['num_files']} files under {fp['stdlib_dir']}")
    print(f"config: {config.name} (files sha256 {fp['files_sha256']})")
    tfds.disable_progress_bar()
    rows = []
    for name in args.names:
        start = time.perf_counter()
        counts = build_suite(data_dir, names=(name,), log=lambda _: None)[name]
        rows.append((name, *(str(counts.get(s, 0)) for s in SPLITS), f"{time.perf_counter() - start:.1f}"))
    if args.vocab_size:
        start = time.perf_counter()
        suite_vocab(data_dir, args.vocab_size, log=lambda _: None)
        rows.append((f"vocab {args.vocab_size}", "", "", "", f"{time.perf_counter() - start:.1f}"))
    print(f"{'dataset':<16}{'train':>8}{'validation':>12}{'test':>8}{'seconds':>10}")
    for name, *cells, seconds in rows:
        print(f"{name:<16}{cells[0]:>8}{cells[1]:>12}{cells[2]:>8}{seconds:>10}")
    print(f"data: {data_dir}")
    if args.vocab_size:
        print(f"vocabulary: {suite_vocab_path(data_dir, args.vocab_size)}")
    return 0
