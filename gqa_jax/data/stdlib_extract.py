"""What the stdlib suite reads and how it cuts examples out of it (``gqa_jax.data.stdlib_suite``
builds the TFDS datasets from these).

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

import ast
import dataclasses
import functools
import hashlib
import os
import platform
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def source_settings() -> tuple[str, int | None]:
    """``(root, max_files)`` from the environment (defaults: this Python's stdlib, all files)."""
    root = os.environ.get(ROOT_ENV) or sysconfig.get_paths()["stdlib"]
    max_files = os.environ.get(MAX_FILES_ENV)
    if max_files is not None and not (max_files.isdigit() and int(max_files) > 0):
        raise ValueError(f"{MAX_FILES_ENV} must be a positive integer, got {max_files!r}")
    return str(Path(root).resolve()), int(max_files) if max_files else None


@functools.cache
def read_files(root: str, max_files: int | None) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
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
    return dict(read_files(*source_settings())[0])


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
def parsed(root: str, max_files: int | None) -> tuple[tuple[str, str, Module | None], ...]:
    """``((relpath, text, module or None), ...)`` for a source root; parsed once per process."""
    _, texts = read_files(root, max_files)
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
