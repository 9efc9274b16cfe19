"""Tasks: the paper's seven under tfds.testing.mock_data, the clear errors, references."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from gqa_jax.data import pipeline as pl
from gqa_jax.data import tasks

PAPER = {  # task -> (input length, target length, metric, prefix)
    "cnn_dailymail": (512, 256, "rouge", "summarize: "),
    "arxiv": (2048, 512, "rouge", "summarize: "),
    "pubmed": (2048, 512, "rouge", "summarize: "),
    "multi_news": (2048, 512, "rouge", "summarize: "),
    "mediasum": (2048, 512, "rouge", "summarize: "),
    "wmt14_en_de": (512, 256, "bleu", "translate English to German: "),
    "trivia_qa": (2048, 32, "f1_em", "trivia_qa question: "),
}


def test_paper_tasks_have_the_papers_lengths_and_metrics():
    for name, (s, t, metric, _) in PAPER.items():
        task = tasks.get_task(name)
        assert (task.input_length, task.target_length, task.metric) == (s, t, metric), name


@pytest.mark.parametrize("name", list(PAPER))
def test_paper_task_batches_under_mock_data(name, small_vocab):
    s, t, _, prefix = PAPER[name]
    with tfds.testing.mock_data(num_examples=6):
        for split in ("train", "validation"):
            p = pl.make_pipeline(name, split, small_vocab, batch_size=2, process_index=0, process_count=1)
            b = next(p.iterator())
            assert b["encoder_input_tokens"].shape == (2, s) and b["decoder_target_tokens"].shape == (2, t)
            assert small_vocab.decode(b["encoder_input_tokens"][0]).startswith(prefix)
            # inputs and targets end in EOS
            for key in ("encoder_input_tokens", "decoder_target_tokens"):
                row = b[key][0]
                assert row[int((row != 0).sum()) - 1] == small_vocab.eos_id
        if name == "trivia_qa":
            ex = tasks.open_split(name, "validation")[0]
            refs = tasks.get_task(name).reference_texts(ex)
            assert refs[0] == tasks.text(ex["answer"]["value"]) and len(refs) > 1


def test_unprepared_dataset_names_the_command(tmp_path):
    with pytest.raises(tasks.DatasetNotPreparedError, match="python -m gqa_jax data prepare cnn_dailymail"):
        tasks.open_split("cnn_dailymail", "train", tmp_path)
    with pytest.raises(tasks.DatasetNotPreparedError, match="--manual-dir"):
        tasks.open_split("mediasum", "validation", tmp_path)


def test_unknown_task_and_split():
    with pytest.raises(ValueError, match="unknown task 'cnn'.*cnn_dailymail"):
        tasks.get_task("cnn")
    with pytest.raises(ValueError, match="no split 'dev'.*validation"):
        tasks.open_split("cnn_dailymail", "dev")


def test_text_helpers():
    assert tasks.text(b"caf\xc3\xa9") == "café"
    assert tasks.text(np.asarray("x")) == "x"
    assert tasks.texts(np.asarray([b"a", b"b"])) == ["a", "b"]
    assert tasks.texts("one") == ["one"]


def test_data_commands(capsys, tmp_path):
    from gqa_jax.__main__ import main

    assert main(["data", "tasks"]) == 0
    out = capsys.readouterr().out
    assert all(f"| {name} |" in out for name in tasks.TASKS)
    assert main(["data", "show", "cnn", "--vocab", str(tmp_path / "none.model")]) == 2
    assert "unknown task 'cnn'" in capsys.readouterr().err
    assert main(["data", "prepare", "mediasum", "--data-dir", str(tmp_path)]) == 2
    assert "--manual-dir" in capsys.readouterr().err


def test_qa_window_holds_the_answers_def_at_a_place_chosen_by_the_id():
    body = "".join(f"def f{i}(x):\n    '''Doc {i}.'''\n    return x + {i}\n\n" for i in range(60))
    source = body.replace("    '''Doc 37.'''\n", "")  # the question's function, its docstring removed
    places = set()
    for key in ("m.py:f37:1", "m.py:f37:2", "m.py:f37:3", "other"):
        window = tasks.qa_window(source, "f37", key)
        assert len(window) == tasks.QA_WINDOW_CHARS and "def f37(x):" in window
        assert window == tasks.qa_window(source, "f37", key)  # the same on every read
        places.add(window.index("def f37("))
        assert window.index("def f37(") <= tasks.QA_WINDOW_CHARS // 2
    assert len(places) > 1  # the answer is not always at the same place
    assert "def f3(" in tasks.qa_window(source, "f3", "k")  # near the start
    assert "def f59(" in tasks.qa_window(source, "f59", "k")  # at the end: the window ends there
    assert tasks.qa_window("def g(): pass\n", "g", "k") == "def g(): pass\n"  # shorter than a window
    assert tasks.qa_window(source, "missing", "k") == source  # no such def: the whole source
    assert "def f370(" in tasks.qa_window(source.replace("def f37(", "def f370("), "f370", "k")  # whole names
    assert tasks.qa_window(source.replace("def f37(", "def f370("), "f37", "k") == source.replace(
        "def f37(", "def f370("
    )
    task = tasks.get_task("stdlib_qa_window")
    assert (task.source, task.input_length, task.target_length, task.metric) == ("stdlib_qa", 256, 8, "f1_em")
    example = {"id": b"m.py:f37:1", "source": source.encode(), "question": b"Add 37.", "answer": b"f37"}
    inputs = task.input_text(example)
    assert inputs.startswith("question: Add 37. context: ") and "def f37(x):" in inputs
    assert len(inputs) == len("question: Add 37. context: ") + tasks.QA_WINDOW_CHARS


def test_stdlib_calls_reads_the_names_a_body_calls():
    source = (
        "    @functools.wraps(f)\n"
        "    def name(self, x=default(1), *,\n"
        "             y: dict[str, int] = {}) -> list[str]:\n"
        "        # skipped(2)\n"
        "        text = 'quoted(3)'\n"
        "        if (x): return [z for z in self.a.items(x)]\n"
        "        return len(x) + items(x) + len(y)"
    )
    # the body's calls, each once, in order; not the decorator, the signature, comments or strings
    assert tasks.called_names(source) == "items len"
    assert tasks.called_names("def f(a):\n    return g(a, h(\n") == "g h"  # a cut source: the calls before it
    assert tasks.called_names("def f(a):\n    return a + 1\n") == tasks.NO_CALLS
    assert tasks.called_names("def f():\n    def g(x):\n        return h(x)\n") == "g h"  # a name, then (
    many = "def f():\n" + "".join(f"    f{i}()\n" for i in range(12))
    assert tasks.called_names(many) == " ".join(f"f{i}" for i in range(8))  # at most 8
    task = tasks.get_task("stdlib_calls")
    lengths = (task.input_length, task.target_length)
    assert (task.source, lengths, task.metric) == ("stdlib_docsum", (256, 32), "f1_em")
    example = {"id": b"m.py:f:1", "source": source.encode(), "summary": b"Name it."}
    assert task.input_text(example) == "calls: " + source
    assert task.target_text(example) == "items len"
