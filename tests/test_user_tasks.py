"""A researcher's own tasks: docs/data.md's worked examples (Parquet, a sharded split, compressed
files) run from another folder from ``data show`` to a score, a span-corruption task, a TFDS dataset
by name, values that are not text read by the documented rule, and every bad input named in one line."""

import json
import re
from pathlib import Path

import pytest
import tensorflow_datasets as tfds
from data_files import refused_by_train, rows, task_file, write, write_jsonl

from gqa_jax.__main__ import main
from gqa_jax.data import pipeline as pl
from gqa_jax.data import task_records, tasks, user_tasks

REPO = Path(__file__).resolve().parents[1]


FILES_TASK = (
    'TASK = user_tasks.from_files("mine", train="train{ext}", validation="dev{ext}", inputs="article", '
    'targets="summary", prefix="summarize: ", input_length=48, target_length=8, metric="{metric}")\n'
)


# the fine-tuned model: one encoder and one decoder layer (the task's path is what is tested)
ONE_LAYER = ("--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1")


def renamed(items: list[dict], inputs: str, targets: str, **more) -> list[dict]:
    return [{inputs: r["article"], targets: r["summary"], **more} for r in items]


EXAMPLES = {  # a worked example's task file in docs/data.md -> the data files it reads, and its metric
    "parquet_task.py": ({
        "train.parquet": renamed(rows(24, 0), "document", "summary", id=1, n_words=16),
        "validation.parquet": renamed(rows(6, 1), "document", "summary", id=2, n_words=16),
    }, "rouge", "rouge1"),
    "sharded_task.py": ({
        **{f"shards/train-0000{i}-of-00003.tsv": renamed(rows(8, i), "question", "answer") for i in range(3)},
        "shards/dev-a.tsv": renamed(rows(3, 3), "question", "answer"),
        "shards/dev-b.tsv": renamed(rows(3, 4), "question", "answer"),
    }, "f1_em", "f1"),
    "compressed_task.py": ({
        "train.jsonl.gz": renamed(rows(24, 0), "en", "de"),
        "dev.csv.bz2": renamed(rows(6, 1), "en", "de"),
    }, "bleu", "bleu"),
}  # fmt: skip


def docs_task_file(name: str) -> str:
    """The task file ``name`` as docs/data.md writes it (its code block's first line names it)."""
    found = re.search(
        rf"```python\n# {re.escape(name)}\n(.*?)```", (REPO / "docs" / "data.md").read_text(), re.S
    )
    assert found, f"docs/data.md has no task file {name}"
    return found[1]


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_a_worked_example_of_the_docs_runs_from_another_folder(
    name, small_vocab, tmp_path, monkeypatch, capsys
):
    files, metric, score = EXAMPLES[name]
    for file, items in files.items():  # a spreadsheet's CSV starts with a byte-order mark
        write(tmp_path / file, items, encoding="utf-8-sig" if ".csv" in file else "utf-8")
    (tmp_path / name).write_text(docs_task_file(name))
    monkeypatch.chdir(tmp_path)
    vocab, data = str(small_vocab.path), []
    if name == "sharded_task.py":  # run prepared, as docs/data.md says
        assert main(["data", "prepare", name, "--data-dir", "data"]) == 0
        assert isinstance(tasks.open_split(name, "train", "data"), task_records.Records)
        data = ["--data-dir", "data"]
    assert main(["data", "show", name, "--vocab", vocab, "-n", "1", *data]) == 0
    assert "encoder_input_tokens: (1, " in capsys.readouterr().out
    assert main(["train", "--config", f"finetune:task={name},steps=2", "--workdir", "ft",
                 f"--config.vocab={vocab}", "--config.batch_size=4", "--config.eval_every=-1",
                 "--config.eval_at_start=False", "--config.progress=False",
                 *ONE_LAYER, *(["--config.data_dir=data"] if data else [])]) == 0  # fmt: skip
    assert main(["evaluate", "--workdir", "ev", "--model", "ft/model", "--task", name, "--vocab", vocab,
                 "--examples", "4", *data]) == 0  # fmt: skip
    result = json.loads(Path("ev/results.json").read_text())
    assert (result["task"], result["metric"], result["examples"], result["split"]) == (
        tasks.get_task(name).name,
        metric,
        4,
        "validation",
    )
    assert score in result["scores"]


def test_a_span_corruption_task_from_a_text_field(small_vocab, tmp_path):
    write_jsonl(tmp_path / "text.jsonl", [{"text": r["article"]} for r in rows(8, 2)])
    file = task_file(
        tmp_path, 'TASK = user_tasks.from_files("corpus", train="text.jsonl", inputs="text", '
        "input_length=64, span_corruption=True)\n",
    )  # fmt: skip
    task = tasks.get_task(str(file))
    assert task.span_corruption and task.target_length > 2 and task.metric is None
    batch = next(
        pl.make_pipeline(str(file), "train", small_vocab, batch_size=2, pack=True, repeat=True).iterator()
    )
    assert batch["encoder_input_tokens"].shape == (2, 64)


def test_a_tfds_dataset_by_name_reads_like_a_paper_dataset(small_vocab, tmp_path):
    file = task_file(
        tmp_path, 'TASK = user_tasks.from_tfds("my_xsum", "xsum", inputs="document", targets="summary", '
        'prefix="summarize: ", input_length=32, target_length=8, metric="rouge")\n',
    )  # fmt: skip
    with tfds.testing.mock_data(num_examples=4):
        batch = next(pl.make_pipeline(str(file), "validation", small_vocab, batch_size=2).iterator())
    assert batch["encoder_input_tokens"].shape == (2, 32)
    assert small_vocab.decode(batch["encoder_input_tokens"][0]).startswith("summarize: ")
    with pytest.raises(tasks.DatasetNotPreparedError, match=f"data prepare {file}"):
        tasks.open_split(str(file), "train", tmp_path / "empty")
    bad = task_file(tmp_path, 'TASK = user_tasks.from_tfds("x", "xsumm", inputs="a", targets="b", '
                    'input_length=8, target_length=8, metric="rouge")\n')  # fmt: skip
    with pytest.raises(ValueError, match="unknown TFDS dataset 'xsumm'"):
        tasks.get_task(str(bad))


BAD = {  # what the task file or its files hold -> the one line that names it
    "missing file": ({}, "train.jsonl: no such file"),
    "missing field": ({"train.jsonl": '{"article": "a b", "summary": "a"}\n{"article": "c"}\n'},
                      "train.jsonl, line 2: no field 'summary' (it has: article)"),
    "empty split": ({"train.jsonl": "\n"}, "train.jsonl: no examples (an empty split)"),
    "not JSON": ({"train.jsonl": '{"article": "a", "summary": "b"}\n{"article": \n'},
                 "train.jsonl, line 2: not JSON"),
    "unknown metric": ({"train.jsonl": '{"article": "a", "summary": "b"}\n'},
                       "task mine: unknown metric 'rogue'; known: rouge"),
    "a null": ({"train.jsonl": '{"article": "a", "summary": "b"}\n\n{"article": "a", "summary": null}\n'},
               "train.jsonl, line 3: field 'summary' is null, not text: give it a text or leave the row out"),
    "an object": ({"train.jsonl": '{"article": {"title": "a"}, "summary": "b"}\n'},
                  "train.jsonl, line 1: field 'article' is an object, not text"),
    "a list holding null": ({"train.jsonl": '{"article": "a", "summary": ["b", null]}\n'},
                            "train.jsonl, line 1: field 'summary' holds null, not text"),
    "an empty list": ({"train.jsonl": '{"article": [], "summary": "b"}\n'},
                      "train.jsonl, line 1: field 'article' is an empty list"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_before_any_work_and_nothing_is_written(case, small_vocab, tmp_path, capsys):
    files, message = BAD[case]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    metric = "rogue" if case == "unknown metric" else "rouge"
    file = task_file(
        tmp_path, FILES_TASK.format(ext=".jsonl", metric=metric).replace(', validation="dev.jsonl"', "")
    )
    assert message in refused_by_train(file, small_vocab.path, capsys)


def test_numbers_and_lists_where_text_goes_are_read_by_the_documented_rule(tmp_path):
    items = [{"article": 42, "summary": 2.5}, {"article": ["a", "b", 3], "summary": ["Paris", "Paris, FR"]},
             {"article": True, "summary": ["one"]}]  # fmt: skip
    write(tmp_path / "train.jsonl", items)
    table = [
        {"article": 7, "summary": ["x"]},
        {"article": 8, "summary": ["y", "z"]},
    ]  # an int and a list column
    write(tmp_path / "train.parquet", table)
    seen = {}
    for name in ("train.jsonl", "train.parquet"):
        task = user_tasks.from_files("mine", train=name, inputs="article", targets="summary", input_length=8,
                                     target_length=8, metric="f1_em", base=tmp_path)  # fmt: skip
        source = tasks.open_split(task, "train", tmp_path / "data")
        seen[name] = [(task.input_text(ex), task.reference_texts(ex)) for ex in source]
    assert seen == {
        "train.jsonl": [("42", ["2.5"]), ("a b 3", ["Paris", "Paris, FR"]), ("true", ["one"])],
        "train.parquet": [("7", ["x"]), ("8", ["y", "z"])],
    }
    write(tmp_path / "null.parquet", [{"article": "a", "summary": "b"}, {"article": "c", "summary": None}])
    task = user_tasks.from_files("mine", train="null.parquet", inputs="article", targets="summary",
                                 input_length=8, target_length=8, metric="rouge", base=tmp_path)  # fmt: skip
    with pytest.raises(ValueError, match=r"null.parquet, row 2: field 'summary' is null, not text"):
        tasks.open_split(task, "train", tmp_path / "data")


def test_a_task_file_that_sets_no_task_or_does_not_exist(tmp_path):
    with pytest.raises(ValueError, match="sets no TASK"):
        tasks.get_task(str(task_file(tmp_path, "X = 1\n")))
    with pytest.raises(ValueError, match="does not exist"):
        tasks.get_task(str(tmp_path / "none.py"))
    with pytest.raises(ValueError, match=r"line 3: .*"):
        tasks.get_task(str(task_file(tmp_path, "TASK = (\n")))
