"""A task's files as other tools write them: every shape reads as the same examples (CSV / TSV with
or without a byte-order mark, in another encoding, quoted newlines, a cell longer than csv's
default limit; JSON Lines with blank lines, a JSON array; compressed; Parquet), a split from a glob
or a list in a stable order, and each file that cannot be read named in one line with its line."""

import bz2
from pathlib import Path

import pytest
from data_files import refused_by_train, rows, task_file, write

from gqa_jax.data import tasks, user_tasks

ITEMS = [  # a quoted comma and quote, a newline, non-ASCII text, a cell past csv's 131072 characters
    {"id": 1, "article": 'Zoë said, "café"\nand left', "summary": "Zoë left"},
    {"id": 2, "article": "naïve " * 30_000, "summary": "long"},
    {"id": 3, "article": "plain text", "summary": "plain"},
]
LATIN = [{k: v.replace("Zoë", "Zoe") if isinstance(v, str) else v for k, v in r.items()} for r in ITEMS]
SHAPES = [  # (file name, the encoding it is written in, a .json array or JSON Lines)
    ("train.csv", "utf-8", True),
    ("train.csv", "utf-8-sig", True),  # with a byte-order mark, as spreadsheets write it
    ("train.csv", "cp1252", True),
    ("train.tsv", "utf-16", True),  # a spreadsheet's "Unicode text"
    ("train.jsonl", "utf-8", True),
    ("train.json", "utf-8", True),
    ("train.json", "utf-8", False),
    ("train.jsonl.gz", "utf-8", True),
    ("train.csv.bz2", "utf-8", True),
    ("train.json.xz", "utf-8", True),
    ("train.parquet", "utf-8", True),
]


def load(folder: Path, train, **options) -> tasks.Task:
    return user_tasks.from_files("mine", train=train, inputs="article", targets="summary", input_length=16,
                                 target_length=8, metric="rouge", base=folder, **options)  # fmt: skip


def read(task: tasks.Task, folder: Path) -> list[tuple[str, str]]:
    return [(ex["article"], ex["summary"]) for ex in tasks.open_split(task, "train", folder / "no_data")]


@pytest.mark.parametrize("name,encoding,array", SHAPES, ids=[f"{n}-{e}-{a}" for n, e, a in SHAPES])
def test_every_file_shape_reads_as_the_same_examples(name, encoding, array, tmp_path):
    items = LATIN if encoding == "cp1252" else ITEMS
    path = write(tmp_path / name, items, encoding=encoding, array=array)
    if encoding == "utf-8-sig":
        assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    read_as = "utf-8" if encoding == "utf-8-sig" else encoding  # the default reads either
    got = read(load(tmp_path, path.name, encoding=read_as), tmp_path)
    assert got == [(r["article"], r["summary"]) for r in items]


def test_a_split_from_a_glob_or_a_list_reads_in_a_stable_order(tmp_path):
    shards = {name: rows(2, seed) for seed, name in enumerate(["train-00002-of-00003.jsonl",
              "train-00000-of-00003.jsonl", "train-00001-of-00003.jsonl"])}  # fmt: skip
    for name, items in shards.items():  # written out of order: the glob reads them by name
        write(tmp_path / "data" / name, items)
    by_name = [r["article"] for name in sorted(shards) for r in shards[name]]
    assert [a for a, _ in read(load(tmp_path, "data/train-*.jsonl"), tmp_path)] == by_name
    listed = ["data/train-00002-of-00003.jsonl", "data/train-0000[01]-of-00003.jsonl"]
    first = [r["article"] for r in shards["train-00002-of-00003.jsonl"]]
    assert [a for a, _ in read(load(tmp_path, listed), tmp_path)] == first + by_name[:4]


BAD = {  # file name -> (its bytes, the task's options, the one line that names it)
    "not the encoding": ("train.csv", "article,summary\na,b\ncaf\xe9,c\n".encode("cp1252"), {},
                         "train.csv, line 3: byte 0xe9 is not utf-8 text: name the file's encoding"),
    "UTF-16 read as UTF-8": ("train.tsv", "article\tsummary\na\tb\n".encode("utf-16"), {},
                             "train.tsv, line 1: byte 0xff is not utf-8 text: it starts like UTF-16"),
    "an unknown encoding": ("train.csv", b"article,summary\na,b\n", {"encoding": "utf9"},
                            "encoding 'utf9' is unknown to Python"),
    "no such column": ("train.csv", b"article,summ\na,b\n", {},
                       "train.csv, line 1: no column 'summary' in the header row (it has: 'article', 'summ"),
    "separated by ;": ("train.csv", b"article;summary\na;b\n", {}, "(is it separated by ';'?"),
    "an unquoted comma": ("train.csv", b"article,summary\na,b\nc,d,e\n", {},
                          "train.csv, line 3: 3 field(s) where the header row has 2: quote a field"),
    "bad quoting": ("train.csv", b'article,summary\n"a"b,c\n', {}, "train.csv, line 2: not CSV"),
    "an item not an object": ("train.json", b'[{"article": "a", "summary": "b"},\n "c"]', {},
                              "train.json, line 2: item 2 of the array is a string, not a JSON object"),
    "an object, not an array": ("train.json", b'{"data": [\n{"article": "a", "summary": "b"}]}', {},
                                "train.json, line 1: not JSON"),
    "not compressed": ("train.jsonl.gz", b'{"article": "a", "summary": "b"}\n', {},
                       "train.jsonl.gz, line 1: cannot be read as a .gz file"),
    "cut short": ("train.csv.bz2", bz2.compress(b"article,summary\n" + b"a,b\n" * 999)[:-30], {},
                  "cannot be read as a .bz2 file"),
    "no such Parquet column": ("train.parquet", None, {},
                               "train.parquet: no column 'summary' (it has: 'article')"),
    "not Parquet": ("train.parquet", b"PAR1 and no more", {}, "train.parquet: not a Parquet file"),
    "an unknown type": ("train.txt", b"a\n", {}, "train.txt: unknown file type '.txt'"),
    "a glob matching nothing": ("train.jsonl", b"", {"train": "shards/*.jsonl"},
                                "shards/*.jsonl: no file matches this glob"),
    "a file twice": ("train.jsonl", b'{"article": "a", "summary": "b"}\n',
                     {"train": ["train.jsonl", "./train.jsonl"]}, "train.jsonl: named twice in one split"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_a_file_that_cannot_be_read_is_one_line_naming_it_and_nothing_is_written(case, small_vocab, tmp_path,
                                                                                  capsys):  # fmt: skip
    name, content, options, message = BAD[case]
    options = dict(options)
    if content is None:
        write(tmp_path / name, [{"article": "a"}])
    else:
        (tmp_path / name).write_bytes(content)
    spec = options.pop("train", name)
    extra = "".join(f", {k}={v!r}" for k, v in options.items())
    file = task_file(
        tmp_path,
        f'TASK = user_tasks.from_files("mine", train={spec!r}, inputs="article", '
        f'targets="summary", input_length=16, target_length=8, metric="rouge"{extra})\n',
    )
    assert message in refused_by_train(file, small_vocab.path, capsys)
