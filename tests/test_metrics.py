"""Tests for scoring (ROUGE, BLEU, F1/EM) and the metric writers (fast, CPU, no downloads)."""

from __future__ import annotations

import importlib
import json
import math
import re
import string
import sys
import warnings
from collections import Counter

import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
from rouge_score import rouge_scorer, scoring

from gqa_jax.data.tasks import TASKS
from gqa_jax.metric_writers import MetricWriter, read_metrics, write_decodes
from gqa_jax.metrics import (
    METRICS,
    PRIMARY,
    ROUGE_BOOTSTRAP_SEED,
    ROUGE_TYPES,
    _t5_rouge_text,
    bleu,
    normalize_trivia_qa,
    rouge,
    score,
    trivia_qa_f1_em,
)

# ---------------------------------------------------------------------------------------------- fixtures

# Tokenized CNN/DailyMail-style summaries: several sentences split by " . ", punctuation, numbers.
SUMMARY_PREDICTIONS = [
    "police arrested two men on monday . they were charged with theft .",
    "the company said profits rose 5% in 2014 . shares climbed ; analysts were surprised .",
    "a storm hit the coast , killing three people . thousands lost power .",
    "the senator, who resigned in may, denies wrongdoing . an inquiry continues .",
    "scientists found water on mars . the discovery could change everything !",
    "the team won the final 2-1 . fans celebrated in the streets .",
    "the museum reopened after a $ 20 million renovation .",
    "doctors warn of a new flu strain . vaccines are being tested . stay home if sick .",
]
SUMMARY_REFERENCES = [
    "two men were arrested on monday . they face theft charges .",
    "profits rose 5% in 2014 , the company said . analysts expected less .",
    "three people died when a storm hit the coast . power was cut to thousands .",
    "the former senator denies any wrongdoing . he resigned in may . an inquiry is under way .",
    "water has been found on mars , scientists say .",
    "fans celebrated in the streets after the team won 2-1 .",
    "after a renovation costing $ 20 million , the museum has reopened . visitors returned .",
    "a new flu strain worries doctors . vaccines are being tested .",
]


def _rouge_score_direct(predictions, references):
    """rouge-score configured as T5's ``metrics.rouge``, straight from the library."""
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)
    return [
        scorer.score(target=r.replace(" . ", " .\n"), prediction=p.replace(" . ", " .\n"))
        for p, r in zip(predictions, references, strict=True)
    ]


# ---------------------------------------------------------------------------------------------- ROUGE


def test_rouge_identical_and_disjoint():
    text = "The quick brown fox jumps over the lazy dog. It was not amused."
    assert rouge([text], [text]) == pytest.approx(dict.fromkeys(ROUGE_TYPES, 100))
    assert rouge(["alpha beta gamma"], ["delta epsilon zeta"]) == pytest.approx(dict.fromkeys(ROUGE_TYPES, 0))


def test_rouge_partial_overlap_and_mean_over_examples():
    # rouge1: precision 3/3, recall 3/4 -> F = 6/7. rouge2: 2/2, 2/3 -> F = 4/5.
    got = rouge(["the cat sat"], ["the cat sat down"])  # One example: the bootstrap mid is that score.
    assert got["rouge1"] == pytest.approx(100 * 6 / 7)
    assert got["rouge2"] == pytest.approx(80)
    # Over examples, not a corpus-level pooled score. Two examples (6/7 and 0): the resampled means
    # are 0, 3/7, 6/7 with probability 1/4, 1/2, 1/4, so the bootstrap median is 3/7, the mean.
    got = rouge(["the cat sat", "alpha beta"], ["the cat sat down", "gamma delta"])
    assert got["rouge1"] == pytest.approx(100 * 6 / 7 / 2)


def test_rouge_does_not_stem():
    assert rouge(["cats running"], ["cat runs"])["rouge1"] == 0.0


def test_rougelsum_uses_t5_sentence_split():
    # Sentences swapped: the plain LCS matches one sentence, the summary-level LCS both.
    prediction = "delta epsilon zeta . alpha beta gamma ."
    reference = "alpha beta gamma . delta epsilon zeta ."
    got = rouge([prediction], [reference])
    assert got == pytest.approx({"rouge1": 100, "rouge2": 80, "rougeL": 50, "rougeLsum": 100})
    # T5 splits only " . ": untokenized "zeta. alpha" stays one sentence, so rougeLsum = rougeL.
    got = rouge(["delta epsilon zeta. alpha beta gamma."], ["alpha beta gamma. delta epsilon zeta."])
    assert got["rougeL"] == pytest.approx(50) and got["rougeLsum"] == pytest.approx(50)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("tokenized . cnn text . more", "tokenized .\ncnn text .\nmore"),
        ("a . b . c .", "a .\nb .\nc ."),  # A final " ." has no space after it: unchanged.
        ("Hi. There! Ok?", "Hi. There! Ok?"),  # Only space-separated periods split, as in T5.
        ("3 . 5", "3 .\n5"),
        ("", ""),
    ],
)
def test_t5_rouge_text(text: str, expected: str):
    assert _t5_rouge_text(text) == expected


def test_rouge_equals_rouge_score_bootstrap_with_the_same_seed():
    per_example = _rouge_score_direct(SUMMARY_PREDICTIONS, SUMMARY_REFERENCES)
    aggregator = scoring.BootstrapAggregator()  # Defaults: n_samples=1000, confidence 0.95.
    for example in per_example:
        aggregator.add_scores(example)
    np.random.seed(ROUGE_BOOTSTRAP_SEED)
    expected = {key: 100 * value.mid.fmeasure for key, value in aggregator.aggregate().items()}
    assert rouge(SUMMARY_PREDICTIONS, SUMMARY_REFERENCES) == expected  # Exactly: same computation.


@pytest.mark.parametrize("seed", [ROUGE_BOOTSTRAP_SEED, 1, 12345])
def test_rouge_bootstrap_mid_is_close_to_the_plain_mean(seed):
    """The mid is the median of 1000 resampled means, not the mean itself; how close it must be.

    Tolerance: 0.25 x the bootstrap standard error of the mean, SE = std(F) / sqrt(n) (0.75 to
    1.5 ROUGE points here). The Monte Carlo error of the median of 1000 resampled means is about
    sqrt(pi / 2) / sqrt(1000) = 0.04 SE, and for n = 8 the skewed, discrete resampling
    distribution moves its median a little further; over 300 seeds the largest deviation on
    these pairs was 0.17 SE. Much tighter would be flaky across seeds; the bound still tells the
    mid from the interval's low or high ends (about 2 SE away), asserted below.
    """
    per_example = _rouge_score_direct(SUMMARY_PREDICTIONS, SUMMARY_REFERENCES)
    got = rouge(SUMMARY_PREDICTIONS, SUMMARY_REFERENCES, seed=seed)
    for key in ROUGE_TYPES:
        f = 100 * np.array([example[key].fmeasure for example in per_example])
        standard_error = f.std() / np.sqrt(len(f))
        assert abs(got[key] - f.mean()) <= 0.25 * standard_error, key
    aggregator = scoring.BootstrapAggregator()
    for example in per_example:
        aggregator.add_scores(example)
    np.random.seed(seed)
    for key, value in aggregator.aggregate().items():
        f = 100 * np.array([example[key].fmeasure for example in per_example])
        standard_error = f.std() / np.sqrt(len(f))
        assert 100 * value.low.fmeasure < f.mean() - 0.25 * standard_error
        assert 100 * value.high.fmeasure > f.mean() + 0.25 * standard_error


def test_rouge_is_deterministic_and_leaves_numpy_global_rng_alone():
    np.random.seed(7)
    state = np.random.get_state()
    first = rouge(SUMMARY_PREDICTIONS, SUMMARY_REFERENCES)
    after = np.random.get_state()
    assert after[0] == state[0] and np.array_equal(after[1], state[1]) and after[2:] == state[2:]
    np.random.seed(999)  # A different global state does not change the score.
    assert rouge(SUMMARY_PREDICTIONS, SUMMARY_REFERENCES) == first
    assert all(type(v) is float for v in first.values())


# ---------------------------------------------------------------------------------------------- BLEU

# German-side text with typographic quotes, dashes, currency and several sentences per line.
TRANSLATION_PREDICTIONS = [
    "„Das ist gut“, sagte er. Dann ging er nach Hause.",
    "Der Preis liegt bei 5€ – das ist zu viel!",
    "Wir haben heute keine Zeit; morgen vielleicht.",
    "Die Katze sitzt auf der Matte.",
]
TRANSLATION_REFERENCES = [
    "„Das ist gut“, sagte er. Danach ging er nach Hause.",
    "Der Preis beträgt 5 € – das ist zu viel!",
    "Heute haben wir keine Zeit; vielleicht morgen.",
    "Die Katze saß auf der Matte.",
]


def test_bleu_known_values():
    sentence = "The cat sat on the mat and looked at the dog."
    assert bleu([sentence], [sentence]) == {"bleu": pytest.approx(100)}
    assert bleu(["alpha beta gamma delta"], ["epsilon zeta eta theta"]) == {"bleu": 0.0}
    # The tokenizer splits ASCII punctuation off words, so spacing around it does not matter.
    assert bleu(["The cat sat, on the mat."], ["The cat sat , on the mat ."])["bleu"] == pytest.approx(100)
    # Corpus-level: one perfect and one empty prediction do not average to 50.
    assert bleu([sentence, ""], [sentence, sentence])["bleu"] < 50


def test_bleu_equals_sacrebleu_intl_exp():
    expected = sacrebleu.corpus_bleu(
        TRANSLATION_PREDICTIONS, [TRANSLATION_REFERENCES], tokenize="intl", smooth_method="exp"
    ).score
    assert bleu(TRANSLATION_PREDICTIONS, TRANSLATION_REFERENCES) == {"bleu": expected}
    assert 0 < expected < 100
    assert sacrebleu.corpus_bleu(TRANSLATION_PREDICTIONS, [TRANSLATION_REFERENCES]).score != expected  # 13a


def test_bleu_intl_splits_unicode_punctuation_and_13a_does_not():
    prediction, reference = (
        ["„Hallo“, sagte er—laut. Das kostet 5€."],
        ["„ Hallo “ , sagte er — laut . Das kostet 5 € ."],
    )
    assert bleu(prediction, reference)["bleu"] == pytest.approx(100)
    assert sacrebleu.corpus_bleu(prediction, [reference]).score < 50  # sacrebleu's default, 13a


# ---------------------------------------------------------------------------------------------- F1 / EM


def _official_normalize_answer(s):
    """The official TriviaQA script's ``normalize_answer`` (evaluation/triviaqa_evaluation.py)."""

    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def handle_punc(text):
        exclude = set(string.punctuation + "".join(["‘", "’", "´", "`"]))
        return "".join(ch if ch not in exclude else " " for ch in text)

    return white_space_fix(remove_articles(handle_punc(s.replace("_", " ").lower()))).strip()


def _official_f1(prediction, ground_truth):
    prediction_tokens = _official_normalize_answer(prediction).split()
    ground_truth_tokens = _official_normalize_answer(ground_truth).split()
    num_same = sum((Counter(prediction_tokens) & Counter(ground_truth_tokens)).values())
    if num_same == 0:
        return 0
    precision, recall = num_same / len(prediction_tokens), num_same / len(ground_truth_tokens)
    return 2 * precision * recall / (precision + recall)


TRIVIA_PREDICTIONS = [
    "The Beatles!",
    "Jimi_Hendrix",
    "U.S.A.",
    "‘Hey Jude’",
    "Guns N´ Roses",
    "paris, france",
    "a-ha",
]
TRIVIA_REFERENCES = [
    ["Fab Four", "beatles", "The_Beatles"],
    ["Jimi Hendrix", "James Marshall Hendrix"],
    ["United States", "usa", "u s a"],
    ["Hey Jude", "`Hey Jude`"],
    ["Guns N' Roses", "GNR"],
    ["Paris", "City of Light"],
    ["aha"],  # "a-ha" -> "ha" (the "a" is an article) does not match "aha".
]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Cat", "cat"),
        ("An apple a day", "apple day"),
        ("theater another", "theater another"),  # Articles only as whole words.
        ("Jimi_Hendrix", "jimi hendrix"),  # Underscores (Wikipedia titles) become spaces.
        ("The_Beatles", "beatles"),  # ... so an article joined by "_" is removed too.
        ("‘Hey Jude’", "hey jude"),  # Curly single quotes are punctuation...
        ("“Yes”", "“yes”"),  # ... curly double quotes are not (as in the official script).
        ("Guns N´ Roses", "guns n roses"),
        ("`Abba`", "abba"),
        ("  U.S.A.!  ", "u s"),  # Punctuation becomes a space, so the "a" is an article.
        ("Rock & Roll", "rock roll"),
        ("don't\tstop\n", "don t stop"),
        ("a-ha", "ha"),
        ("ÉCOLE", "école"),
        ("the", ""),
    ],
)
def test_normalize_trivia_qa(text: str, expected: str):
    assert normalize_trivia_qa(text) == expected
    assert _official_normalize_answer(text) == expected


def test_trivia_qa_f1_em_equals_official_script():
    got = trivia_qa_f1_em(TRIVIA_PREDICTIONS, TRIVIA_REFERENCES)
    n = len(TRIVIA_PREDICTIONS)
    f1 = (
        sum(
            max(_official_f1(p, a) for a in r)
            for p, r in zip(TRIVIA_PREDICTIONS, TRIVIA_REFERENCES, strict=True)
        )
        / n
    )
    em = (
        sum(
            max(_official_normalize_answer(p) == _official_normalize_answer(a) for a in r)
            for p, r in zip(TRIVIA_PREDICTIONS, TRIVIA_REFERENCES, strict=True)
        )
        / n
    )
    assert got == pytest.approx({"f1": 100 * f1, "em": 100 * em}, abs=1e-12)
    # Exact matches but for "paris, france" (F1 2/3 against "Paris") and "a-ha" (F1 0).
    assert got == pytest.approx({"f1": 100 * (5 + 2 / 3) / 7, "em": 100 * 5 / 7})
    assert score("f1_em", TRIVIA_PREDICTIONS, TRIVIA_REFERENCES) == got


@pytest.mark.parametrize(
    "prediction, answers, em",
    [
        ("Jimi_Hendrix", ["Jimi Hendrix"], 100.0),  # "_" is a space.
        ("a-ha", ["aha"], 0.0),  # "ha": punctuation is a space, then "a" an article.
        ("U.S.A.", ["u s a"], 100.0),  # both "u s".
        ("‘Hey Jude’", ["hey jude"], 100.0),  # the curly quotes are punctuation too.
    ],
)
def test_trivia_qa_normalization_in_exact_match(prediction, answers, em):
    assert trivia_qa_f1_em([prediction], [answers])["em"] == em


def test_f1_partial_overlap():
    # "cat sat" vs "cat sat down": precision 2/2, recall 2/3 -> F1 = 0.8.
    assert trivia_qa_f1_em(["the cat sat"], [["a cat sat down"]]) == pytest.approx({"f1": 80.0, "em": 0.0})


def test_f1_max_over_aliases_and_mean():
    predictions = ["The Beatles!", "Paris", "london"]
    references = [["Fab Four", "beatles"], ["Rome"], ["City of London", "the big smoke"]]
    got = trivia_qa_f1_em(predictions, references)
    # Example 1: EM via the alias; 2: nothing; 3: F1 = 2 * (1 * 1/3) / (1 + 1/3) = 0.5.
    assert got["em"] == pytest.approx(100 / 3)
    assert got["f1"] == pytest.approx(100 * (1 + 0 + 0.5) / 3)


def test_f1_empty_answers_follow_squad_v11():
    # Both normalize to "": exact match, but F1 is 0 (no shared token), as in SQuAD v1.1 and T5.
    assert trivia_qa_f1_em(["The"], [["a"]]) == {"f1": 0.0, "em": 100.0}
    assert trivia_qa_f1_em(["..."], [["!"]]) == {"f1": 0.0, "em": 100.0}


# ---------------------------------------------------------------------------------------------- dispatch


def test_score_dispatch_and_primary():
    t5_names = {"rouge", "bleu", "f1_em"}
    assert set(METRICS) == set(PRIMARY) == t5_names
    assert {task.metric for task in TASKS.values()} - {None} == t5_names  # The tasks use T5's metrics.
    assert (METRICS["rouge"], METRICS["bleu"], METRICS["f1_em"]) == (rouge, bleu, trivia_qa_f1_em)
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
        (
            "meteor", ["a"], ["a"],
            r"unknown metric 'meteor'; known metrics: \['bleu', 'f1_em', 'rouge'\]",
        ),
        ("rouge", ["a", "b"], ["a"], "differ in length: 2 != 1"),
        ("bleu", [], [], "empty"),
        ("rouge", "a cat", "a cat", "predictions must be a sequence of examples"),
        ("f1_em", ["a cat"], ["a cat"], r"references\[0\] must be a non-empty list"),
        ("f1_em", ["a cat"], [[]], r"references\[0\] must be a non-empty list"),
    ],
)  # fmt: skip
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


def test_import_without_hides_an_optional_package_only_while_loading(tmp_path, monkeypatch):
    """How tensorboardX loads without torch and rouge_score without scipy.stats (seconds of each
    training process's start): the hidden package reads as absent during the import, then
    imports as usual; a package loaded already is not hidden."""
    from gqa_jax.metrics import import_without

    (tmp_path / "opt_heavy.py").write_text("LOADED = True\n")
    (tmp_path / "uses_heavy.py").write_text(
        "try:\n    import opt_heavy\n    HEAVY = True\nexcept ImportError:\n    HEAVY = False\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("opt_heavy", "uses_heavy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert import_without("uses_heavy", ("opt_heavy",)).HEAVY is False
    assert "opt_heavy" not in sys.modules
    assert importlib.import_module("opt_heavy").LOADED  # importable again afterwards
    del sys.modules["uses_heavy"]
    assert import_without("uses_heavy", ("opt_heavy",)).HEAVY is True  # already loaded: kept
