"""Tasks: what to read, which text goes in and which comes out, how long, and how it is scored.

A ``Task`` is a small description; ``gqa_jax.data.pipeline`` turns it into batches. Examples come
from TFDS through ``tfds.data_source`` (random access on array_record files, TensorFlow not
needed), so the paper's datasets, the local MediaSum builder and the embedded stdlib suite all
take the same path. ``TASKS`` holds the paper's seven fine-tuning tasks (the paper's lengths and
metrics, docs/paper.md), two span-corruption pre-training corpora (C4 as in T5, and the embedded
``stdlib_corpus``) and the embedded suite's fine-tuning tasks:

=================  ==========================  ==================  =========  ========
task               source                      inputs -> targets   lengths    metric
=================  ==========================  ==================  =========  ========
cnn_dailymail      cnn_dailymail               article->highlights 512/256    rouge
arxiv              scientific_papers/arxiv     article->abstract   2048/512   rouge
pubmed             scientific_papers/pubmed    article->abstract   2048/512   rouge
multi_news         multi_news                  document->summary   2048/512   rouge
mediasum           mediasum (local JSON)       document->summary   2048/512   rouge
wmt14_en_de        wmt14_translate/de-en       en->de              512/256    bleu
trivia_qa          trivia_qa/rc                question+evidence   2048/32    f1_em
c4_span            c4/en                       span corruption     512/114    -
stdlib_span        stdlib_corpus               span corruption     512/114    -
stdlib_docsum      stdlib_docsum               source->summary     512/64     rouge
stdlib_modsum      stdlib_modsum               source->summary     2048/128   rouge
stdlib_qa          stdlib_qa                   question+source     2048/16    f1_em
stdlib_qa_window   stdlib_qa                   question+window     256/8      f1_em
stdlib_calls       stdlib_docsum               source->called      256/32     f1_em
=================  ==========================  ==================  =========  ========

``open_split(task, split, data_dir)`` returns the random-access source, with a clear error for
an unknown split or a dataset that is not prepared (naming the command that prepares it).
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import importlib
import importlib.util
import io
import keyword
import os
import re
import socket
import textwrap
import tokenize
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gqa_jax.data.locations import default_data_dir
from gqa_jax.data.span_corruption import span_corruption_lengths

Example = Mapping[str, Any]
SPLITS = ("train", "validation", "test")


def text(value: Any) -> str:
    """A TFDS text feature as ``str`` (data sources give ``str`` or ``bytes``)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return text(value.item())
    return str(value)


def texts(value: Any) -> list[str]:
    """A TFDS sequence-of-text feature as a list of ``str``."""
    if isinstance(value, (str, bytes)):
        return [text(value)]
    return [text(v) for v in np.asarray(value, dtype=object).reshape(-1)]


class FileSplits(Protocol):
    """The splits of a task read from files (``user_tasks``): each opened from its prepared copy in
    a data directory, else read into memory."""

    def open(self, split: str, data_dir: str | os.PathLike) -> Sequence[Example]: ...

    def prepare(self, data_dir: str | os.PathLike) -> dict[str, int]: ...


@dataclasses.dataclass(frozen=True)
class Task:
    """One task. ``inputs`` / ``targets`` name a text feature or compute the text from an example.

    Attributes:
      name: the key in ``TASKS``, used on command lines and in configs.
      source: the TFDS dataset name (``"scientific_papers/arxiv"``), or a suite dataset name when
        ``suite`` is True (its config is chosen by the running Python's stdlib).
      inputs, targets: feature name or ``example -> str``. ``targets`` is None for span
        corruption, where both come from the ``inputs`` text.
      prefix: prepended to the input text (T5 style task prefix).
      input_length, target_length: tokens, EOS included; longer texts are truncated (keeping EOS).
      metric: a key of ``gqa_jax.metrics.METRICS``, or None for pre-training corpora.
      references: ``example -> [accepted answers]`` when more than the target counts (TriviaQA's
        aliases); default: the target alone.
      span_corruption: T5 span corruption of the ``inputs`` text instead of an input/target pair.
      splits: our split name -> the dataset's split name.
      tfds_module: module whose import registers the builder (TFDS registers lazily without TF).
      prepare: how to prepare the data, printed when it is missing.
      file: the task file that set this task (``get_task`` fills it in), where it has one.
      files: the splits of a task read from files (``user_tasks.from_files``) instead of TFDS.
    """

    name: str
    source: str
    inputs: str | Callable[[Example], str]
    targets: str | Callable[[Example], str] | None
    input_length: int
    target_length: int
    metric: str | None
    prefix: str = ""
    references: Callable[[Example], list[str]] | None = None
    span_corruption: bool = False
    splits: Mapping[str, str] = dataclasses.field(default_factory=lambda: {s: s for s in SPLITS})
    tfds_module: str = ""
    suite: bool = False
    prepare: str = ""
    description: str = ""
    file: str = ""
    files: FileSplits | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.input_length < 2 or self.target_length < 2:
            raise ValueError(f"task {self.name}: lengths must be >= 2 (room for a token and EOS)")
        if self.span_corruption and self.targets is not None:
            raise ValueError(f"task {self.name}: span corruption takes its targets from the inputs text")
        if not self.span_corruption and self.targets is None:
            raise ValueError(f"task {self.name}: a sequence-to-sequence task needs a targets feature")

    def input_text(self, example: Example) -> str:
        value = self.inputs(example) if callable(self.inputs) else text(example[self.inputs])
        return self.prefix + value

    def target_text(self, example: Example) -> str:
        if self.targets is None:
            raise ValueError(f"task {self.name} is span corruption: it has no target text")
        return self.targets(example) if callable(self.targets) else text(example[self.targets])

    def reference_texts(self, example: Example) -> list[str]:
        """Every accepted answer, for scoring (the target alone unless ``references`` is set)."""
        refs = self.references(example) if self.references is not None else []
        target = self.target_text(example)
        return [target] + [r for r in refs if r != target]

    @property
    def cli_name(self) -> str:
        """How a command line names this task: its task file, else its name."""
        return self.file or self.name

    def prepare_command(self, data_dir: str | os.PathLike | None = None) -> str:
        """The command that builds this task's data (shown when it is missing)."""
        where = f" --data-dir {data_dir}" if data_dir is not None else ""
        if self.prepare:
            return self.prepare.format(where=where)
        tfds_dir = f" --data_dir={data_dir}" if data_dir is not None else ""
        return (
            f"python -m gqa_jax data prepare {self.cli_name}{where} (downloads {self.source} and builds it "
            f"as array_record; or: tfds build {self.source} --file_format=array_record{tfds_dir})"
        )


def _trivia_qa_inputs(example: Example) -> str:
    """The question, then the evidence: Wikipedia pages first, then web search results."""
    pages = example.get("entity_pages", {}) or {}
    search = example.get("search_results", {}) or {}
    evidence = texts(pages.get("wiki_context", [])) + texts(search.get("search_context", []))
    return f"question: {text(example['question'])} context: {' '.join(evidence)}"


def _trivia_qa_target(example: Example) -> str:
    return text(example["answer"]["value"])


def _trivia_qa_references(example: Example) -> list[str]:
    return texts(example["answer"].get("aliases", []))


def _stdlib_qa_inputs(example: Example) -> str:
    return f"question: {text(example['question'])} context: {text(example['source'])}"


QA_WINDOW_CHARS = 640  # stdlib_qa_window's context: ~200 tokens of a 2,000-piece vocabulary


def qa_window(source: str, answer: str, key: str, width: int = QA_WINDOW_CHARS) -> str:
    """``width`` characters of ``source`` holding the line that defines ``answer``: the window
    starts up to half its width before that line (how far: from a hash of ``key``, the example's
    id, so the answer's place varies and is the same on every read); the whole source when no
    line defines it."""
    found = re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(answer)}\b", source, re.M)
    if found is None or len(source) <= width:
        return source
    lead = int(hashlib.sha256(key.encode()).hexdigest(), 16) % (width // 2)
    start = max(0, min(found.start() - lead, len(source) - width))
    return source[start : start + width]


def _stdlib_qa_window_inputs(example: Example) -> str:
    source = qa_window(text(example["source"]), text(example["answer"]), text(example["id"]))
    return f"question: {text(example['question'])} context: {source}"


NO_CALLS = "none"  # stdlib_calls' answer for a function that calls nothing
_BRACKETS = {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}


def called_names(source: str, limit: int = 8) -> str:
    """The names a function's ``source`` calls in its body (``f(``, ``obj.f(``; not in its
    decorators or signature, strings or comments), each once in order of first call, at most
    ``limit``, space-separated; :data:`NO_CALLS` when there are none. The rule is a name followed
    by ``(``: a nested ``def`` or ``class`` in the body counts its own name too."""
    names: list[str] = []
    in_def, body, depth, previous = False, False, 0, None  # body: past the def line's closing ":"
    try:  # a cut source ends mid-statement: keep the calls before the cut
        for token in tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline):
            if token.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
                continue
            if not body:
                if token.type == tokenize.NAME and token.string == "def":
                    in_def = True
                elif in_def:
                    depth += _BRACKETS.get(token.string, 0)
                    body = token.string == ":" and depth == 0
            elif token.string == "(" and previous is not None and previous.type == tokenize.NAME:
                if not keyword.iskeyword(previous.string) and previous.string not in names:
                    names.append(previous.string)
            previous = token
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return " ".join(names[:limit]) or NO_CALLS


def _stdlib_calls_target(example: Example) -> str:
    return called_names(text(example["source"]))


_SUMMARIZE = "summarize: "


def _paper(name: str, source: str, module: str, **kw: Any) -> Task:
    return Task(name=name, source=source, tfds_module=f"tensorflow_datasets.{module}", **kw)


def _suite(name: str, source: str, **kw: Any) -> Task:
    return Task(
        name=name,
        source=source,
        tfds_module="gqa_jax.data.stdlib_suite",
        suite=True,
        prepare="python -m gqa_jax data build-suite{where}",
        **kw,
    )


_SPAN_TARGETS = span_corruption_lengths(512)[1]  # 114

TASKS: dict[str, Task] = {
    t.name: t
    for t in [
        _paper("cnn_dailymail", "cnn_dailymail", "summarization", inputs="article", targets="highlights",
               prefix=_SUMMARIZE, input_length=512, target_length=256, metric="rouge",
               description="CNN/DailyMail news summarization (paper: 512/256, ROUGE-1)"),
        _paper("arxiv", "scientific_papers/arxiv", "summarization", inputs="article", targets="abstract",
               prefix=_SUMMARIZE, input_length=2048, target_length=512, metric="rouge",
               description="arXiv paper -> abstract (paper: 2048/512, ROUGE-1)"),
        _paper("pubmed", "scientific_papers/pubmed", "summarization", inputs="article", targets="abstract",
               prefix=_SUMMARIZE, input_length=2048, target_length=512, metric="rouge",
               description="PubMed paper -> abstract (paper: 2048/512, ROUGE-1)"),
        _paper("multi_news", "multi_news", "summarization", inputs="document", targets="summary",
               prefix=_SUMMARIZE, input_length=2048, target_length=512, metric="rouge",
               description="Multi-News multi-document summarization (paper: 2048/512, ROUGE-1)"),
        Task(name="mediasum", source="mediasum", tfds_module="gqa_jax.data.mediasum", inputs="document",
             targets="summary", prefix=_SUMMARIZE, input_length=2048, target_length=512, metric="rouge",
             prepare="python -m gqa_jax data prepare mediasum{where} --manual-dir DIR_WITH_MEDIASUM_JSON "
             "(news_dialogue.json and train_val_test_split.json from the MediaSum release)",
             description="MediaSum interview transcript summarization (paper: 2048/512, ROUGE-1)"),
        _paper("wmt14_en_de", "wmt14_translate/de-en", "translate", inputs="en", targets="de",
               prefix="translate English to German: ", input_length=512, target_length=256,
               metric="bleu", description="WMT14 English -> German (paper: 512/256, BLEU)"),
        _paper("trivia_qa", "trivia_qa/rc", "question_answering", inputs=_trivia_qa_inputs,
               targets=_trivia_qa_target, references=_trivia_qa_references, prefix="trivia_qa ",
               input_length=2048, target_length=32, metric="f1_em",
               description="TriviaQA reading comprehension, question + evidence (paper: 2048/32, F1)"),
        _paper("c4_span", "c4/en", "text", inputs="text", targets=None, span_corruption=True,
               input_length=512, target_length=_SPAN_TARGETS, metric=None,
               description="C4 span corruption, T5's pre-training and the paper's uptraining objective"),
        _suite("stdlib_span", "stdlib_corpus", inputs="text", targets=None, span_corruption=True,
               input_length=512, target_length=_SPAN_TARGETS, metric=None,
               description="embedded: span corruption over the Python stdlib source"),
        _suite("stdlib_docsum", "stdlib_docsum", inputs="source", targets="summary", prefix=_SUMMARIZE,
               input_length=512, target_length=64, metric="rouge",
               description="embedded: a function's source -> its docstring's first sentence (like CNN/DM)"),
        _suite("stdlib_modsum", "stdlib_modsum", inputs="source", targets="summary", prefix=_SUMMARIZE,
               input_length=2048, target_length=128, metric="rouge",
               description="embedded: a module's source -> its docstring's first paragraph (like arXiv)"),
        _suite("stdlib_qa", "stdlib_qa", inputs=_stdlib_qa_inputs, targets="answer", input_length=2048,
               target_length=16, metric="f1_em",
               description="embedded: module source + a docstring sentence -> the function's name "
               "(like TriviaQA)"),
        _suite("stdlib_qa_window", "stdlib_qa", inputs=_stdlib_qa_window_inputs, targets="answer",
               input_length=256, target_length=8, metric="f1_em",
               description="embedded: stdlib_qa with the context cut to a 640-character window "
               "holding the answer's def (short inputs)"),
        _suite("stdlib_calls", "stdlib_docsum", inputs="source", targets=_stdlib_calls_target,
               prefix="calls: ", input_length=256, target_length=32, metric="f1_em",
               description="embedded: a function's source -> the names its body calls, in order "
               "(an answer read from the input, like TriviaQA)"),
    ]
}  # fmt: skip


def is_task_file(name: str) -> bool:
    """Whether a task name is a task file's path (a ``.py`` file that sets ``TASK``)."""
    return name.endswith(".py")


def get_task(name: str | Task) -> Task:
    """The task called ``name``: a key of ``TASKS``, or the path of a task file (a ``.py`` file
    that sets ``TASK``, see ``gqa_jax.data.user_tasks``); a ``Task`` passes through. Anything else
    is a clear error listing them."""
    if isinstance(name, Task):
        return name
    if is_task_file(name):
        return _task_file(Path(name).expanduser().resolve())
    if name not in TASKS:
        raise ValueError(
            f"unknown task {name!r}; known tasks: {', '.join(TASKS)}, or a task file (my_task.py, see "
            "docs/data.md)"
        )
    return TASKS[name]


_LOADED: dict[tuple[Path, float], Task] = {}  # a task file's task, read once per process
_FOLDER: contextvars.ContextVar[Path | None] = contextvars.ContextVar("task_file_folder", default=None)


def task_file_folder() -> Path | None:
    """The folder of the task file being loaded, None outside one (its relative paths are read
    against it)."""
    return _FOLDER.get()


def _task_file(path: Path) -> Task:
    """The ``TASK`` a task file sets; its errors as one line naming the file."""
    if not path.is_file():
        raise ValueError(
            f"task file {path} does not exist (a task is a name from `data tasks` or a .py file)"
        )
    key = (path, path.stat().st_mtime)
    if key not in _LOADED:
        spec = importlib.util.spec_from_file_location(f"gqa_jax_task_file_{len(_LOADED)}", path)
        module = importlib.util.module_from_spec(spec)
        folder = _FOLDER.set(path.parent)
        try:
            spec.loader.exec_module(module)
        except SyntaxError as err:
            raise ValueError(f"task file {path}, line {err.lineno}: {err.msg}") from None
        except Exception as err:  # noqa: BLE001 (the user's code: any error is reported as one line)
            message = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            raise ValueError(f"task file {path}: {message}") from None
        finally:
            _FOLDER.reset(folder)
        task = getattr(module, "TASK", None)
        if not isinstance(task, Task):
            raise ValueError(f"task file {path} sets no TASK (a gqa_jax.data.tasks.Task, see docs/data.md)")
        _LOADED[key] = dataclasses.replace(task, file=str(path))
    return _LOADED[key]


class DatasetNotPreparedError(FileNotFoundError):
    """The task's dataset is not built in the data directory (the message says how to build it)."""


def _import_builders(task: Task) -> None:
    import tensorflow_datasets  # noqa: F401  (the registry)

    if task.tfds_module:
        importlib.import_module(task.tfds_module)


def _check_split(task: Task, split: str) -> str:
    if split not in task.splits:
        raise ValueError(f"task {task.name} has no split {split!r}; its splits: {', '.join(task.splits)}")
    return task.splits[split]


def open_split(task: str | Task, split: str, data_dir: str | os.PathLike | None = None) -> Sequence[Example]:
    """Random-access examples of ``task``'s ``split`` (``len`` and ``[i]``), read through TFDS.

    Raises ``ValueError`` for an unknown task or split and ``DatasetNotPreparedError`` (naming the
    command that prepares it) when the dataset is not built as array_record in ``data_dir``.
    Under ``tfds.testing.mock_data`` this returns mock examples and nothing is read or downloaded.
    """
    task = get_task(task)
    tfds_split = _check_split(task, split)
    data_dir = str(data_dir) if data_dir is not None else default_data_dir()
    if task.files is not None:
        try:
            return task.files.open(tfds_split, data_dir)
        except ValueError as err:
            raise ValueError(f"task file {task.file}: {err}" if task.file else str(err)) from None
    _import_builders(task)
    import tensorflow_datasets as tfds

    if task.suite:
        from gqa_jax.data import stdlib_suite

        return stdlib_suite.suite_data_source(task.source, tfds_split, data_dir)
    try:
        return tfds.data_source(task.source, split=tfds_split, data_dir=data_dir, download=False)
    except Exception as err:  # diagnose below; TFDS's own messages are about file formats
        cause = err
    how = task.prepare_command(data_dir)
    try:
        builder = tfds.builder(task.source, data_dir=data_dir)
        prepared = builder.is_prepared()
    except Exception:  # no builder directory at all
        prepared = False
    if not prepared:
        raise DatasetNotPreparedError(
            f"dataset {task.source} (task {task.name}) is not prepared in {data_dir}; prepare it with: {how}"
        ) from cause
    splits = list(builder.info.splits)
    if splits and tfds_split not in splits:
        raise ValueError(
            f"dataset {task.source} in {data_dir} has no split {tfds_split!r}; it has: {', '.join(splits)}"
        ) from cause
    raise DatasetNotPreparedError(
        f"dataset {task.source} in {data_dir} cannot be read by random access ({cause}); it must be "
        f"built with file_format=array_record: {how}"
    ) from cause


def open_files(task: Task, data_dir: str | os.PathLike | None = None) -> None:
    """A task read from files: every split opened now (its prepared copy found, else its files read
    and checked into memory), so a bad file or row is named before any work. Nothing for others."""
    if task.files is not None:
        for split in task.splits:
            open_split(task, split, data_dir)


# Well-known hosts probed before a download: when none answers, there is no network to download from.
PROBE_HOSTS = (("storage.googleapis.com", 443), ("huggingface.co", 443), ("github.com", 443))


def _check_network(task: Task, data_dir: str, timeout: float = 5.0) -> None:
    """A ValueError within a few seconds when no download host answers, with the way to build the
    dataset without a network here."""
    for host, port in PROBE_HOSTS:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            return
        except OSError:
            continue
    hosts = ", ".join(h for h, _ in PROBE_HOSTS)
    raise ValueError(
        f"{task.source} must be downloaded, and this machine reaches none of {hosts}: run "
        f"`python -m gqa_jax data prepare {task.cli_name} --data-dir DIR` on a machine with network access "
        f"and copy DIR/{task.source} into {data_dir}/ here (or set --data-dir to where it already is)"
    )


def prepare(
    task: str | Task,
    data_dir: str | os.PathLike | None = None,
    *,
    manual_dir: str | os.PathLike | None = None,
) -> dict[str, int]:
    """Download (where the dataset allows) and build ``task``'s dataset as array_record.

    Returns examples per split. Needs network access for the TFDS datasets; MediaSum reads the
    release files from ``manual_dir``; the stdlib suite is built from the local Python; a task
    read from files is written as array_record from its files (``user_tasks``).
    """
    task = get_task(task)
    data_dir = str(data_dir) if data_dir is not None else default_data_dir()
    if task.files is not None:
        return task.files.prepare(data_dir)
    _import_builders(task)
    if task.suite:
        from gqa_jax.data import stdlib_suite

        counts = stdlib_suite.build_suite(data_dir, names=(task.source,))
        return counts[task.source]
    import tensorflow_datasets as tfds

    if task.name == "mediasum" and manual_dir is None:
        raise ValueError("mediasum is built from the released JSON files: pass --manual-dir DIR")
    config = tfds.download.DownloadConfig(manual_dir=str(manual_dir) if manual_dir else None)
    builder = tfds.builder(task.source, data_dir=data_dir, file_format="array_record")
    if not builder.is_prepared() and task.name != "mediasum":
        _check_network(task, data_dir)  # fail fast, not after minutes of download retries
    builder.download_and_prepare(download_config=config)
    return {name: info.num_examples for name, info in builder.info.splits.items()}
