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

Files. The ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` in sorted relative-path order,
skipping any file below a directory named in ``EXCLUDED_DIRS`` (third-party packages,
``__pycache__``, the test suites: ``test/``, ``tests/``, ``idlelib/idle_test``,
``lib2to3/tests``, ``ctypes/test``, ..., and ``__phello__``, a frozen-module test fixture) and the
build-configuration files (``config-*/`` and
``_sysconfigdata_*.py``: generated per install, not library code). Files are read as UTF-8 (a BOM
is dropped; ``\\r\\n`` and ``\\r`` become ``\\n``); a file that does not decode is skipped and
listed in the metadata; one that does not parse with ``ast`` is kept in the corpus only.

Docstrings are found with ``ast`` and removed by whole lines (``lineno`` .. ``end_lineno`` of the
docstring statement); everything else stays byte-identical. A docstring that shares a line with
other code (``def f(): "doc"``), or is the only statement of its function, is never removed, and
its function yields no example. First sentence: the docstring's first paragraph (up to the first
blank line) with whitespace collapsed, cut after the first ``". "`` (which covers ``".\\n"``),
not counting ``e.g.`` / ``i.e.``; else the whole paragraph. Summaries shorter than
``MIN_SUMMARY_WORDS`` words or longer than ``MAX_SUMMARY_WORDS`` are dropped. Module and QA
sources are capped at ``MAX_SOURCE_CHARS`` characters, cut at a line end (the tasks truncate to
2048 tokens later; the cap only bounds tokenization work). QA takes up to ``QA_PER_MODULE``
functions per module, by sha256 of ``"path:qualname"``, among those whose name is unique in the
module (not a dunder) and absent from the question, whose question is unique in the module, and
whose ``def`` starts within the first ``QA_WINDOW_CHARS`` characters of the source, so the answer
survives the truncation.

Splits: by sha256 of the module's relative path (first 8 bytes mod 100: < 90 train, < 95
validation, else test), so a module lands in the same split in every task. Empty splits are left
out (TFDS cannot write them).

Versions. The builder config name is ``py<python version>-<first 12 hex of files_sha256>``, so a
different stdlib builds into a different directory (``DATA_DIR/stdlib_qa/py3.11.7-0123456789ab/
1.0.0``) and never overwrites another; the full fingerprint (:func:`stdlib_fingerprint`) is in
the dataset's metadata. Bump ``SUITE_VERSION`` when the extraction rules change.

Tests and quick runs: ``GQA_JAX_STDLIB_ROOT`` replaces the source root and
``GQA_JAX_STDLIB_MAX_FILES=N`` keeps only the first N files; both change the files hash, hence
the config name.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import hashlib
import os
import platform
import re
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import tensorflow_datasets as tfds

SUITE = ("stdlib_corpus", "stdlib_docsum", "stdlib_modsum", "stdlib_qa")
SPLITS = ("train", "validation", "test")
SUITE_VERSION = "1.0.0"  # bump when the extraction rules change
BUILD_COMMAND = "python -m gqa_jax data build-suite --data-dir DIR"
ROOT_ENV = "GQA_JAX_STDLIB_ROOT"
MAX_FILES_ENV = "GQA_JAX_STDLIB_MAX_FILES"

EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "__phello__"}
)
MIN_SUMMARY_WORDS = 2  # words with a letter: keeps "Bisection algorithms.", drops "curses.panel"
MAX_SUMMARY_WORDS = 64  # first sentences; module first paragraphs may have 2x this
MIN_SOURCE_CHARS = 48  # drops stubs (`def close(self): return`); module sources need 4x this
MAX_SOURCE_CHARS = 32_768
QA_PER_MODULE = 8
QA_WINDOW_CHARS = 6_144  # ~1,650 tokens of the 8k suite vocabulary: the answer survives 2048
VOCAB_SIZE = 8_000


# ------------------------------------------------------------------------------ files and fingerprint
def _stdlib_files(root: Path) -> list[str]:
    """Relative POSIX paths of the suite's ``.py`` files under ``root``, sorted (rule: module doc)."""
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune in place: never descend into site-packages, tests, build configuration, ...
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith("config-")]
        rel_dir = Path(dirpath).relative_to(root)
        for name in filenames:
            skip = name.startswith("_sysconfigdata_") or not (Path(dirpath) / name).is_file()
            if name.endswith(".py") and not skip:
                paths.append((rel_dir / name).as_posix())
    return sorted(paths)


def _source_settings() -> tuple[str, int | None]:
    """``(root, max_files)`` from the environment (defaults: this Python's stdlib, all files)."""
    root = os.environ.get(ROOT_ENV) or sysconfig.get_paths()["stdlib"]
    max_files = os.environ.get(MAX_FILES_ENV)
    if max_files is not None and not (max_files.isdigit() and int(max_files) > 0):
        raise ValueError(f"{MAX_FILES_ENV} must be a positive integer, got {max_files!r}")
    return str(Path(root).resolve()), int(max_files) if max_files else None


@functools.cache
def _read_files(root: str, max_files: int | None) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
    """``(fingerprint, ((relpath, text), ...))`` of the decodable files; read once per process."""
    if not Path(root).is_dir():
        raise ValueError(f"stdlib source root {root!r} is not a directory (check {ROOT_ENV})")
    rels = _stdlib_files(Path(root))[:max_files]
    if not rels:
        raise ValueError(f"no .py files under {root!r}")
    digest = hashlib.sha256()
    texts, undecodable = [], []
    for rel in rels:
        data = (Path(root) / rel).read_bytes()
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            undecodable.append(rel)
            continue
        texts.append((rel, text.replace("\r\n", "\n").replace("\r", "\n")))
    fingerprint = {
        "python_version": platform.python_version(),
        "stdlib_dir": root,
        "num_files": len(rels),
        "files_sha256": digest.hexdigest(),
        "undecodable_files": undecodable,
    }
    return fingerprint, tuple(texts)


def stdlib_fingerprint() -> dict[str, Any]:
    """``{"python_version", "stdlib_dir", "num_files", "files_sha256", "undecodable_files"}``.

    ``files_sha256`` hashes every listed file's relative path, size and bytes in order. Computed
    once per process for each source root / file limit (see the module doc for the variables).
    """
    return dict(_read_files(*_source_settings())[0])


def suite_config_name(fingerprint: dict[str, Any] | None = None) -> str:
    """The builder config name of a stdlib: ``py3.11.7-0123456789ab`` (TFDS allows ``[\\w+.-]``)."""
    fp = fingerprint or stdlib_fingerprint()
    version = re.sub(r"[^\w.]", "_", fp["python_version"])
    return f"py{version}-{fp['files_sha256'][:12]}"


def split_of(relpath: str) -> str:
    """The split of a module: sha256 of its relative path, first 8 bytes mod 100 (90 / 5 / 5)."""
    bucket = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big") % 100
    return "train" if bucket < 90 else "validation" if bucket < 95 else "test"


# ------------------------------------------------------------------------------------- extraction
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)\.(?= )")


def first_paragraph(doc: str) -> str:
    """A (cleaned) docstring's text up to its first blank line, whitespace collapsed to spaces."""
    paragraph = re.split(r"\n[ \t]*\n", doc.strip(), maxsplit=1)[0]
    return " ".join(paragraph.split())


def first_sentence(doc: str) -> str:
    """The first paragraph up to and including its first ``". "`` / ``".\\n"``, else all of it."""
    paragraph = first_paragraph(doc)
    end = _SENTENCE_END.search(paragraph)
    return paragraph[: end.end()] if end else paragraph


def _keep_summary(summary: str, max_words: int = MAX_SUMMARY_WORDS) -> bool:
    """Keep ``MIN_SUMMARY_WORDS`` to ``max_words`` words, counting words that contain a letter."""
    words = [w for w in summary.split() if any(c.isalpha() for c in w)]
    return MIN_SUMMARY_WORDS <= len(words) <= max_words


def remove_lines(text: str, first: int, last: int) -> str:
    """``text`` without its lines ``first`` .. ``last`` (1-based, inclusive, ``\\n``-separated)."""
    lines = text.split("\n")
    if not 1 <= first <= last <= len(lines):
        raise ValueError(f"lines {first}..{last} out of range for a text of {len(lines)} lines")
    return "\n".join(lines[: first - 1] + lines[last:])


def cap_source(text: str, max_chars: int = MAX_SOURCE_CHARS) -> str:
    """``text`` cut to at most ``max_chars`` characters at a line end (unchanged if it fits)."""
    if len(text) <= max_chars:
        return text
    cut = text.rfind("\n", 0, max_chars)
    return text[: cut + 1] if cut >= 0 else text[:max_chars]


@dataclasses.dataclass(frozen=True)
class Docstring:
    """A removable docstring: its cleaned text and the 1-based line span of its statement."""

    text: str
    first_line: int
    last_line: int


@dataclasses.dataclass(frozen=True)
class Function:
    """A function or method with a removable docstring; lines are 1-based, inclusive."""

    qualname: str
    name: str
    first_line: int  # the first decorator, else the ``def``
    last_line: int
    def_offset: int  # character offset of the ``def`` line in the module text
    docstring: Docstring


@dataclasses.dataclass(frozen=True)
class Module:
    """A parsed module: its text, removable module docstring (or None) and documented functions."""

    path: str
    text: str
    docstring: Docstring | None
    functions: tuple[Function, ...]
    repeated_names: frozenset[str]  # defined more than once (functions, classes): ambiguous answers


def _docstring(node: ast.AST, lines: list[bytes]) -> Docstring | None:
    """``node``'s docstring if it stands on lines of its own (ast offsets are UTF-8 bytes)."""
    text = ast.get_docstring(node)  # type: ignore[arg-type]
    if text is None:
        return None
    stmt = node.body[0]  # type: ignore[attr-defined]
    before = lines[stmt.lineno - 1][: stmt.col_offset]
    after = lines[stmt.end_lineno - 1][stmt.end_col_offset :].strip()
    if before.strip() or (after and not after.startswith(b"#")):
        return None
    return Docstring(text, stmt.lineno, stmt.end_lineno)


def parse_module(path: str, text: str) -> Module | None:
    """Find the module docstring and the functions with removable docstrings; None if unparsable."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    lines = [line.encode() for line in text.split("\n")]
    line_offsets = [0]
    for line in text.split("\n"):
        line_offsets.append(line_offsets[-1] + len(line) + 1)
    functions, seen, repeated = [], set(), set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                (repeated if child.name in seen else seen).add(child.name)
                qualname = prefix + child.name
                if not isinstance(child, ast.ClassDef) and len(child.body) > 1:
                    doc = _docstring(child, lines)
                    if doc is not None:
                        first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                        offset = line_offsets[child.lineno - 1]
                        functions.append(Function(qualname, child.name, first, child.end_lineno, offset, doc))
                visit(child, qualname + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return Module(path, text, _docstring(tree, lines), tuple(functions), frozenset(repeated))


@functools.cache
def _parsed(root: str, max_files: int | None) -> tuple[tuple[str, str, Module | None], ...]:
    """``((relpath, text, module or None), ...)`` for a source root; parsed once per process."""
    _, texts = _read_files(root, max_files)
    return tuple((rel, text, parse_module(rel, text)) for rel, text in texts)


def docsum_examples(module: Module) -> Iterator[dict[str, str]]:
    """Function source without its docstring -> the docstring's first sentence."""
    lines = module.text.split("\n")
    for f in module.functions:
        summary = first_sentence(f.docstring.text)
        function_text = "\n".join(lines[f.first_line - 1 : f.last_line])
        shift = f.first_line - 1
        source = remove_lines(function_text, f.docstring.first_line - shift, f.docstring.last_line - shift)
        if _keep_summary(summary) and len(source) >= MIN_SOURCE_CHARS:
            yield {"id": f"{module.path}:{f.qualname}:{f.first_line}", "source": source, "summary": summary}


def modsum_examples(module: Module) -> Iterator[dict[str, str]]:
    """Module source without its docstring -> the module docstring's first paragraph (0 or 1)."""
    if module.docstring is None:
        return
    summary = first_paragraph(module.docstring.text)
    source = remove_lines(module.text, module.docstring.first_line, module.docstring.last_line)
    if _keep_summary(summary, 2 * MAX_SUMMARY_WORDS) and len(source.strip()) >= 4 * MIN_SOURCE_CHARS:
        yield {"id": module.path, "source": cap_source(source), "summary": summary}


def qa_examples(module: Module) -> Iterator[dict[str, str]]:
    """Module source without one function's docstring + its first sentence -> the function's name."""
    questions = [first_sentence(f.docstring.text) for f in module.functions]
    candidates = []
    for f, question in zip(module.functions, questions, strict=True):
        if (
            f.name not in module.repeated_names
            and not (f.name.startswith("__") and f.name.endswith("__"))
            and questions.count(question) == 1
            and not re.search(rf"\b{re.escape(f.name)}\b", question)
            and _keep_summary(question)
            and f.def_offset < QA_WINDOW_CHARS
        ):
            key = hashlib.sha256(f"{module.path}:{f.qualname}".encode()).hexdigest()
            candidates.append((key, f, question))
    for _, f, question in sorted(candidates, key=lambda c: c[0])[:QA_PER_MODULE]:
        source = remove_lines(module.text, f.docstring.first_line, f.docstring.last_line)
        yield {
            "id": f"{module.path}:{f.qualname}:{f.first_line}",
            "source": cap_source(source),
            "question": question,
            "answer": f.name,
        }


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
    fp = _read_files(root, max_files)[0]
    description = f"Python {fp['python_version']} stdlib at {root}: {fp['num_files']} files"
    return StdlibConfig(
        name=suite_config_name(fp), description=description, root=root, max_files=max_files, fingerprint=fp
    )


def _current_config() -> StdlibConfig:
    return _config(*_source_settings())


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
        if _read_files(config.root, config.max_files)[0] != config.fingerprint:
            raise ValueError(f"the files under {config.root} changed since config {config.name} was made")
        by_split: dict[str, list[dict[str, str]]] = {split: [] for split in SPLITS}
        for path, text, module in _parsed(config.root, config.max_files):
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
    from gqa_jax.data.tasks import default_data_dir  # lazy: tasks imports this module

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
