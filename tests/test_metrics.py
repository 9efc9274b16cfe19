"""Tests for scoring (ROUGE, BLEU, F1/EM) and the metric writers (fast, CPU, no downloads)."""

from __future__ import annotations

import json
import math
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from gqa_jax.metrics import (
    METRICS,
    PRIMARY,
    ROUGE_TYPES,
    MetricWriter,
    _split_sentences,
    bleu,
    normalize_answer,
    read_metrics,
    rouge,
    score,
    squad_f1_em,
    write_decodes,
)

# ---------------------------------------------------------------------------------------------- scoring


def test_rouge_identical_and_disjoint():
    text = "The quick brown fox jumps over the lazy dog. It was not amused."
    assert rouge([text], [text]) == pytest.approx(dict.fromkeys(ROUGE_TYPES, 100))
    assert rouge(["alpha beta gamma"], ["delta epsilon zeta"]) == pytest.approx(dict.fromkeys(ROUGE_TYPES, 0))


def test_rouge_partial_overlap_and_mean_over_examples():
    # rouge1: precision 3/3, recall 3/4 -> F = 6/7. rouge2: 2/2, 2/3 -> F = 4/5.
    got = rouge(["the cat sat"], ["the cat sat down"])
    assert got["rouge1"] == pytest.approx(100 * 6 / 7)
    assert got["rouge2"] == pytest.approx(80)
    # The mean over examples, not a corpus-level pooled score.
    got = rouge(["the cat sat", "alpha beta"], ["the cat sat down", "gamma delta"])
    assert got["rouge1"] == pytest.approx(100 * 6 / 7 / 2)


def test_rouge_uses_stemmer():
    assert rouge(["cats running"], ["cat runs"])["rouge1"] == pytest.approx(100)


def test_rougelsum_uses_sentences():
    # Sentences swapped: the plain LCS matches one sentence, the summary-level LCS both.
    prediction = "delta epsilon zeta. alpha beta gamma."
    reference = "alpha beta gamma. delta epsilon zeta."
    got = rouge([prediction], [reference])
    assert got["rouge1"] == pytest.approx(100)
    assert got["rougeL"] == pytest.approx(50)
    assert got["rougeLsum"] == pytest.approx(100)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("One. Two! Three? Four", "One.\nTwo!\nThree?\nFour"),
        ('He left. "Go!" she said.', 'He left.\n"Go!"\nshe said.'),
        ("It cost 3.5 million (or so.) Then", "It cost 3.5 million (or so.)\nThen"),
        ("first line\nsecond line", "first line\nsecond line"),  # Existing newlines are kept.
        ("tokenized . cnn text . ", "tokenized .\ncnn text ."),  # T5's " . " -> " .\n" case.
        ("", ""),
    ],
)
def test_split_sentences(text: str, expected: str):
    assert _split_sentences(text) == expected


def test_bleu_known_values():
    sentence = "The cat sat on the mat and looked at the dog."
    assert bleu([sentence], [sentence]) == {"bleu": pytest.approx(100)}
    assert bleu(["alpha beta gamma delta"], ["epsilon zeta eta theta"]) == {"bleu": 0.0}
    # 13a tokenization splits punctuation off words, so spacing around it does not matter.
    assert bleu(["The cat sat, on the mat."], ["The cat sat , on the mat ."])["bleu"] == pytest.approx(100)
    # Corpus-level: one perfect and one empty prediction do not average to 50.
    assert bleu([sentence, ""], [sentence, sentence])["bleu"] < 50


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Cat", "cat"),
        ("An apple a day", "apple day"),
        ("theater another", "theater another"),  # Articles only as whole words.
        ("  U.S.A.!  ", "usa"),
        ("Rock & Roll", "rock roll"),
        ("don't\tstop\n", "dont stop"),
        ("the", ""),
    ],
)
def test_normalize_answer(text: str, expected: str):
    assert normalize_answer(text) == expected


def test_squad_f1_partial_overlap():
    # "cat sat" vs "cat sat down": precision 2/2, recall 2/3 -> F1 = 0.8.
    assert squad_f1_em(["the cat sat"], [["a cat sat down"]]) == pytest.approx({"f1": 80.0, "em": 0.0})


def test_squad_max_over_aliases_and_mean():
    predictions = ["The Beatles!", "Paris", "london"]
    references = [["Fab Four", "beatles"], ["Rome"], ["City of London", "the big smoke"]]
    got = squad_f1_em(predictions, references)
    # Example 1: EM via the alias; 2: nothing; 3: F1 = 2 * (1 * 1/3) / (1 + 1/3) = 0.5.
    assert got["em"] == pytest.approx(100 / 3)
    assert got["f1"] == pytest.approx(100 * (1 + 0 + 0.5) / 3)


def test_squad_empty_answers_follow_squad_v11():
    # Both normalize to "": exact match, but F1 is 0 (no shared token), as in SQuAD v1.1 and T5.
    assert squad_f1_em(["The"], [["a"]]) == {"f1": 0.0, "em": 100.0}


def test_score_dispatch_and_primary():
    assert set(METRICS) == set(PRIMARY) == {"rouge", "bleu", "f1_em"}
    for name, predictions, references in [
        ("rouge", ["a b c"], ["a b c"]),
        ("bleu", ["a b c d"], ["a b c d"]),
        ("f1_em", ["a b c"], [["a b c"]]),
    ]:
        result = score(name, predictions, references)
        assert PRIMARY[name] in result
        assert all(type(v) is float for v in result.values())
        assert result[PRIMARY[name]] == pytest.approx(100)


@pytest.mark.parametrize(
    "name, predictions, references, match",
    [
        ("meteor", ["a"], ["a"], r"unknown metric 'meteor'; known metrics: \['bleu', 'f1_em', 'rouge'\]"),
        ("rouge", ["a", "b"], ["a"], "differ in length: 2 != 1"),
        ("bleu", [], [], "empty"),
        ("rouge", "a cat", "a cat", "predictions must be a sequence of examples"),
        ("f1_em", ["a cat"], ["a cat"], r"references\[0\] must be a non-empty list"),
        ("f1_em", ["a cat"], [[]], r"references\[0\] must be a non-empty list"),
    ],
)
def test_score_errors(name, predictions, references, match):
    with pytest.raises(ValueError, match=match):
        score(name, predictions, references)


# ---------------------------------------------------------------------------------------------- writers


def test_writer_roundtrip_nonfinite_and_scalar_types(tmp_path):
    with MetricWriter(tmp_path, tensorboard=False) as writer:
        writer.write(0, {"loss": 1.5, "count": np.int64(7), "acc": np.float32(0.25), "flag": True})
        writer.write(np.int32(10), {"nan": math.nan, "inf": np.float64("inf"), "ninf": -math.inf})
        writer.write(20, {"jax": jnp.asarray(2.5, jnp.bfloat16), "jax32": jnp.float32(3.0)})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    # Strict JSON: non-finite values are the strings "nan", "inf", "-inf".
    assert json.loads(lines[1], parse_constant=lambda c: pytest.fail(c)) == {
        "step": 10,
        "nan": "nan",
        "inf": "inf",
        "ninf": "-inf",
    }
    records = read_metrics(tmp_path)
    assert records[0] == {"step": 0, "loss": 1.5, "count": 7, "acc": 0.25, "flag": 1}
    assert type(records[0]["count"]) is int
    assert math.isnan(records[1]["nan"]) and records[1]["inf"] == math.inf and records[1]["ninf"] == -math.inf
    assert records[2] == {"step": 20, "jax": 2.5, "jax32": 3.0}
    assert read_metrics(tmp_path / "metrics.jsonl") == records[:1] + records[1:]


def test_writer_appends_on_reopen(tmp_path):
    with MetricWriter(tmp_path, tensorboard=False) as writer:
        writer.write(1, {"loss": 3.0})
    with MetricWriter(tmp_path, tensorboard=False) as writer:
        writer.write(2, {"loss": 2.0})
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}]


def test_writer_tensorboard_events(tmp_path):
    with MetricWriter(tmp_path / "run") as writer:
        writer.write(5, {"train/loss": 1.0, "eval/rouge1": math.nan})
    events = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_writer_errors(tmp_path):
    writer = MetricWriter(tmp_path, tensorboard=False)
    with pytest.raises(ValueError, match="must not contain the key 'step'"):
        writer.write(0, {"step": 1.0})
    with pytest.raises(ValueError, match=r"'loss' must be a scalar, got shape \(2,\)"):
        writer.write(0, {"loss": np.zeros(2)})
    with pytest.raises(ValueError, match="'name' must be a real number"):
        writer.write(0, {"name": "abc"})
    with pytest.raises(ValueError, match="step must be an integer"):
        writer.write(1.5, {"loss": 1.0})
    with pytest.raises(ValueError, match="step must be >= 0"):
        writer.write(-1, {"loss": 1.0})
    writer.close()
    writer.close()  # Idempotent.
    with pytest.raises(ValueError, match="is closed"):
        writer.write(0, {"loss": 1.0})
    assert read_metrics(tmp_path) == []  # Nothing half-written by the failed writes.


def test_read_metrics_skips_truncated_last_line_and_writer_repairs_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n{"step": 3, "lo')
    with pytest.warns(UserWarning, match="malformed last line 3"):
        assert read_metrics(path) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}]
    # Resuming drops the half-written line (and only it) so the next record starts on its own line.
    with pytest.warns(UserWarning, match="dropping a half-written last line"):
        writer = MetricWriter(tmp_path, tensorboard=False)
    with writer:
        writer.write(3, {"loss": 0.5})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_writer_keeps_complete_record_missing_its_newline(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with MetricWriter(tmp_path, tensorboard=False) as writer:
            writer.write(2, {"loss": 1.0})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_read_metrics_rejects_malformed_middle_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_metrics(path)


def test_write_decodes_roundtrip_and_atomic_overwrite(tmp_path):
    path = tmp_path / "decodes" / "step_100.jsonl"
    write_decodes(path, ["q1", "q2"], ["old", "old"], ["a", "b"])
    returned = write_decodes(path, ["Wer?", "q2"], ["Die Katze", "b"], [["Katze", "die Katze"], "b"])
    assert returned == path
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert records == [
        {"input": "Wer?", "prediction": "Die Katze", "reference": ["Katze", "die Katze"]},
        {"input": "q2", "prediction": "b", "reference": "b"},
    ]
    assert sorted(p.name for p in path.parent.iterdir()) == ["step_100.jsonl"]  # No temp file left.
    with pytest.raises(ValueError, match="differ in length: 1, 2, 2"):
        write_decodes(path, ["x"], ["y", "z"], ["r", "s"])
    assert path.read_text(encoding="utf-8").count("\n") == 2  # Untouched by the failed call.
