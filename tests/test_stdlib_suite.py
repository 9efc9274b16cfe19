"""Tests for the embedded stdlib task suite: extraction rules on synthetic modules, small real builds."""

from __future__ import annotations

import argparse
import collections
import hashlib
import sysconfig
from pathlib import Path

import pytest

from gqa_jax.data import stdlib_extract as sx
from gqa_jax.data import stdlib_suite as ss

MODULE = '''#!/usr/bin/env python3
"""Tools for testing the suite.

More words here.
"""

import os


@decorator
def documented(x):  # comment
    """Return the thing. Then more.

    Details.
    """
    return x + 1


class Box:
    """A box."""

    def open(self, key="é"):
        """Öpen the box, e.g. with a key.
        Second line of the first paragraph."""  # trailing comment
        return key.upper()

    def __repr__(self):
        """Represent the box nicely."""
        return f"Box({id(self)})"


def one_liner(): "Same line as the def."


def only_doc():
    """Nothing but a docstring here."""


def shared():
    """Shares its line with code."""; return 1
'''


def _lines(text: str, first: int, last: int) -> str:
    """Lines ``first`` .. ``last`` (1-based, inclusive) of ``text``, joined by newlines."""
    return "\n".join(text.split("\n")[first - 1 : last])


def _without(text: str, *needles: str) -> str:
    """``text`` without the whole lines that contain one of ``needles`` (to state expectations)."""
    lines = text.split("\n")
    return "\n".join(line for line in lines if not any(n in line for n in needles))


def _forget_files() -> None:
    """Drop the per-process caches, as a new process would (the files changed under us)."""
    for cached in (sx.read_files, sx.parsed, ss._config):
        cached.cache_clear()


@pytest.fixture
def module() -> sx.Module:
    parsed = sx.parse_module("pkg/tools.py", MODULE)
    assert parsed is not None
    return parsed


# ---------------------------------------------------------------------------------------- extraction
@pytest.mark.parametrize(
    "doc, sentence",
    [
        ("Return x.  Then y.", "Return x."),
        ("Return x.\nThen y.", "Return x."),
        ("Compute\n   the thing\n\nMore. Words.", "Compute the thing"),
        ("Use e.g. this, i.e. that. And more.", "Use e.g. this, i.e. that."),
        ("Python 3.11 is here. Yes.", "Python 3.11 is here."),
        ("Ends with a period.", "Ends with a period."),
        ("Path os.path.join etc", "Path os.path.join etc"),
    ],
)
def test_first_sentence(doc, sentence):
    assert sx.first_sentence(doc) == sentence


def test_first_paragraph():
    assert sx.first_paragraph("  One\n two.\n\n  Three.\n") == "One two."
    assert sx.first_paragraph("One.\n   \nTwo.") == "One."  # a whitespace-only line is blank


def test_module_docstring_removed_exactly(module):
    (example,) = sx.modsum_examples(module)
    assert example["id"] == "pkg/tools.py"
    assert example["summary"] == "Tools for testing the suite."
    assert example["source"] == sx.remove_lines(MODULE, 2, 5)
    assert example["source"] == MODULE.replace(
        '"""Tools for testing the suite.\n\nMore words here.\n"""\n', ""
    )


def test_docsum_examples(module):
    examples = {e["id"].split(":")[1]: e for e in sx.docsum_examples(module)}
    # one_liner: docstring on the def line; only_doc: nothing left; shared: code after the docstring.
    assert sorted(examples) == ["Box.__repr__", "Box.open", "documented"]
    documented = examples["documented"]
    assert documented["id"] == "pkg/tools.py:documented:10"  # starts at its decorator
    assert documented["summary"] == "Return the thing."
    assert documented["source"] == "@decorator\ndef documented(x):  # comment\n    return x + 1"
    box_open = examples["Box.open"]
    # ast offsets are UTF-8 bytes: the trailing comment after a non-ASCII docstring still counts.
    assert box_open["summary"] == "Öpen the box, e.g. with a key."
    assert box_open["source"] == '    def open(self, key="é"):\n        return key.upper()'
    assert examples["Box.__repr__"]["summary"] == "Represent the box nicely."


def test_qa_examples(module):
    examples = list(sx.qa_examples(module))
    # Dunders and functions without a removable docstring are never asked.
    assert sorted(e["answer"] for e in examples) == ["documented", "open"]
    by_answer = {e["answer"]: e for e in examples}
    qa = by_answer["open"]
    assert qa["question"] == "Öpen the box, e.g. with a key."
    assert qa["id"] == "pkg/tools.py:Box.open:22"
    assert qa["source"] == _without(MODULE, "Öpen the box", "Second line of the first")
    assert '"""Return the thing.' in qa["source"]  # the other docstrings stay
    assert by_answer["documented"]["source"] == sx.remove_lines(MODULE, 12, 15)


def test_qa_rules(monkeypatch):
    text = (
        "class A:\n    def run(self):\n        '''Run A fast.'''\n        pass\n\n"
        "class B:\n    def run(self):\n        '''Run B slowly.'''\n        pass\n\n"
        + "".join(f"def f{i}():\n    '''Compute value {i}.'''\n    return {i}\n\n" for i in range(6))
        + "def g():\n    '''Compute value 0.'''\n    return 0\n\n"
        + "def helper():\n    '''Call helper twice.'''\n    return 0\n"
    )
    module = sx.parse_module("m.py", text)
    answers = [e["answer"] for e in sx.qa_examples(module)]
    # `run` is ambiguous (two defs); f0 and g share a question; helper names itself: never asked.
    assert sorted(answers) == ["f1", "f2", "f3", "f4", "f5"]
    keys = [hashlib.sha256(f"m.py:{name}".encode()).hexdigest() for name in answers]
    assert keys == sorted(keys)

    monkeypatch.setattr(sx, "QA_PER_MODULE", 2)
    assert [e["answer"] for e in sx.qa_examples(module)] == answers[:2]  # a stable choice by sha256
    monkeypatch.setattr(sx, "QA_PER_MODULE", 8)
    monkeypatch.setattr(sx, "QA_WINDOW_CHARS", text.index("def f3"))
    assert sorted(e["answer"] for e in sx.qa_examples(module)) == ["f1", "f2"]


def test_summary_filters_and_caps():
    text = "def f():\n    '''curses.panel'''\n    return 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10 + 11 + 12\n"
    assert list(sx.docsum_examples(sx.parse_module("m.py", text))) == []  # one word
    assert sx.parse_module("bad.py", "def f(:\n") is None
    assert sx.cap_source("ab\ncd\nef\n", 7) == "ab\ncd\n"
    assert sx.cap_source("abcdef", 3) == "abc"
    assert sx.cap_source("ab\n", 3) == "ab\n"
    with pytest.raises(ValueError, match="out of range"):
        sx.remove_lines("a\nb", 2, 3)


def test_split_is_stable_and_balanced():
    # sha256 of the relative path, never Python's hash(): these never change across runs.
    assert [sx.split_of(p) for p in ("os.py", "json/__init__.py", "mod0.py", "mod14.py")] == [
        "validation",
        "train",
        "test",
        "validation",
    ]
    counts = collections.Counter(sx.split_of(f"m{i}.py") for i in range(4000))
    assert 0.88 < counts["train"] / 4000 < 0.92 and counts["validation"] > 150 and counts["test"] > 150


# ------------------------------------------------------------------------------- files and builds
def _write_root(root: Path) -> Path:
    """A small source tree: modules that land in all three splits, and files the rule skips."""
    files = {
        "mod1.py": MODULE,  # train
        "mod14.py": MODULE.replace("documented", "fourteen"),  # validation
        "mod0.py": MODULE.replace("Tools for testing", "Helpers for checking"),  # test
        "broken.py": "def f(:\n",  # corpus only
        "test/test_os.py": MODULE,
        "pkg/tests/t.py": MODULE,
        "idlelib/idle_test/t.py": MODULE,
        "site-packages/x.py": MODULE,
        "__pycache__/x.py": MODULE,
        "config-3.11-x86_64-linux-gnu/python-config.py": MODULE,
        "_sysconfigdata__linux.py": MODULE,
        "notes.txt": "not python",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    (root / "latin.py").write_bytes(b"x = '\xe9'\n")  # not UTF-8: skipped
    return root


@pytest.fixture
def synthetic(tmp_path, monkeypatch) -> Path:
    root = _write_root(tmp_path / "lib")
    monkeypatch.setenv(sx.ROOT_ENV, str(root))
    monkeypatch.delenv(sx.MAX_FILES_ENV, raising=False)
    return root


def _read_all(data_dir: Path) -> dict[tuple[str, str], list[dict]]:
    examples = {}
    for name in ss.SUITE:
        for split in ss.SPLITS:
            try:
                source = ss.suite_data_source(name, split, data_dir)
            except ValueError:
                continue
            examples[name, split] = [source[i] for i in range(len(source))]
    return examples


def test_fingerprint_and_file_rule(synthetic):
    fp = sx.stdlib_fingerprint()
    assert fp["num_files"] == 5  # broken, latin, mod0, mod1, mod14
    assert fp["undecodable_files"] == ["latin.py"]
    assert fp["stdlib_dir"] == str(synthetic.resolve())
    assert sx.suite_config_name() == f"py{fp['python_version']}-{fp['files_sha256'][:12]}"
    (synthetic / "mod1.py").write_text(MODULE + "\n", encoding="utf-8")
    assert sx.stdlib_fingerprint()["files_sha256"] == fp["files_sha256"]  # once per process
    _forget_files()
    assert sx.stdlib_fingerprint()["files_sha256"] != fp["files_sha256"]


def test_build_read_back_and_errors(synthetic, tmp_path, capsys):
    logs = []
    counts = ss.build_suite(tmp_path / "d1", log=logs.append)
    assert counts["stdlib_corpus"] == {"train": 2, "validation": 1, "test": 1}
    assert counts["stdlib_modsum"] == {"train": 1, "validation": 1, "test": 1}
    assert counts["stdlib_docsum"] == {"train": 3, "validation": 3, "test": 3}
    assert counts["stdlib_qa"] == {"train": 2, "validation": 2, "test": 2}
    assert all("building" in m for m in logs)

    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "d1").rglob("*") if p.is_file()}
    logs.clear()
    assert ss.build_suite(tmp_path / "d1", log=logs.append) == counts  # idempotent
    assert all("present" in m for m in logs) and len(logs) == 4
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "d1").rglob("*") if p.is_file()} == before

    examples = _read_all(tmp_path / "d1")
    (qa,) = [e for e in examples["stdlib_qa", "validation"] if e["answer"] == b"fourteen"]
    assert qa["question"] == b"Return the thing."
    corpus = {e["path"]: e["text"] for rows in examples.values() for e in rows if "path" in e}
    assert corpus[b"mod1.py"] == MODULE.encode()

    config = sx.suite_config_name()
    import tensorflow_datasets as tfds

    info = tfds.builder(f"stdlib_qa/{config}:{ss.SUITE_VERSION}", data_dir=tmp_path / "d1").info
    assert info.metadata["files_sha256"] == sx.stdlib_fingerprint()["files_sha256"]
    assert info.metadata["python_version"] == sx.stdlib_fingerprint()["python_version"]
    plain = tfds.data_source("stdlib_qa", split="validation", data_dir=tmp_path / "d1", download=False)
    assert [plain[i] for i in range(len(plain))] == examples["stdlib_qa", "validation"]  # default config

    with pytest.raises(ValueError, match=r"unknown split 'dev'.*\['train', 'validation', 'test'\]"):
        ss.suite_data_source("stdlib_qa", "dev", tmp_path / "d1")
    assert len(ss.suite_data_source("stdlib_docsum", "train[:2]", tmp_path / "d1")) == 2
    with pytest.raises(ValueError, match=r"not built in .*data build-suite --data-dir"):
        ss.suite_data_source("stdlib_qa", "train", tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown suite datasets"):
        ss.build_suite(tmp_path / "d1", names=("stdlib_nope",))

    # A different stdlib is a new config: a new directory, the old one untouched.
    (synthetic / "mod0.py").unlink()
    _forget_files()
    assert sx.suite_config_name() != config
    with pytest.raises(ValueError, match=f"built there: {config}"):
        ss.suite_data_source("stdlib_qa", "train", tmp_path / "d1")
    counts2 = ss.build_suite(tmp_path / "d1", names=("stdlib_modsum",), log=logs.append)
    assert counts2 == {"stdlib_modsum": {"train": 1, "validation": 1}}  # the empty test split is left out
    with pytest.raises(ValueError, match=r"unknown split 'test'.*\['train', 'validation'\]"):
        ss.suite_data_source("stdlib_modsum", "test", tmp_path / "d1")
    assert (tmp_path / "d1" / "stdlib_modsum" / config / ss.SUITE_VERSION / "dataset_info.json").is_file()


def test_cli(synthetic, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    ss.add_build_suite_args(parser)
    args = parser.parse_args(["--data-dir", str(tmp_path / "d"), "--names", "stdlib_qa", "--vocab-size", "0"])
    assert ss.run_build_suite(args) == 0
    out = capsys.readouterr().out
    assert sx.suite_config_name() in out
    assert [line.split()[:4] for line in out.splitlines() if line.startswith("stdlib_qa")] == [
        ["stdlib_qa", "2", "2", "2"]
    ]


def test_real_stdlib_subset_is_deterministic(tmp_path, monkeypatch):
    monkeypatch.delenv(sx.ROOT_ENV, raising=False)
    monkeypatch.setenv(sx.MAX_FILES_ENV, "24")
    fp = sx.stdlib_fingerprint()
    assert fp["stdlib_dir"] == str(Path(sysconfig.get_paths()["stdlib"]).resolve())
    assert fp["num_files"] == 24
    counts = ss.build_suite(tmp_path / "a", log=lambda _: None)
    assert sum(counts["stdlib_corpus"].values()) == 24 - len(fp["undecodable_files"])
    assert all(sum(c.values()) > 0 for c in counts.values())
    assert ss.build_suite(tmp_path / "b", log=lambda _: None) == counts
    first, second = _read_all(tmp_path / "a"), _read_all(tmp_path / "b")
    assert first == second  # same examples in the same order (the record bytes may differ: proto maps)
    for (name, _), rows in first.items():
        if name == "stdlib_qa":
            for e in rows:
                assert e["answer"] in e["source"] and e["question"] not in e["source"]

    # The suite vocabulary: trained once from the corpus's train split, beside the data, then loaded.
    path = ss.suite_vocab_path(tmp_path / "a", 600)
    assert path == tmp_path / "a" / "stdlib_vocab" / sx.suite_config_name() / "spm600.model"
    vocab = ss.suite_vocab(tmp_path / "a", 600, log=lambda _: None)
    assert path.is_file() and vocab.sp_size == 600
    text = first["stdlib_corpus", "train"][0]["text"].decode()[:2000]
    assert vocab.decode(vocab.encode(text)) == text  # whitespace-exact, as code needs
    mtime = path.stat().st_mtime_ns
    assert ss.suite_vocab(tmp_path / "a", 600, log=lambda _: None).content_hash() == vocab.content_hash()
    assert path.stat().st_mtime_ns == mtime  # loaded, not retrained
