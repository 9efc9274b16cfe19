"""Evaluation metrics (ROUGE, BLEU, F1/EM); the run's metric files are in ``metric_writers``.

Scoring follows what the GQA paper reports after greedy decoding: ROUGE-1 for summarization
(CNN/DailyMail, arXiv, PubMed, MediaSum, MultiNews), BLEU for WMT'14 En-De, F1 for TriviaQA, each
computed as T5's evaluation (``t5.evaluation.metrics``) computes it:

- ``"rouge"``: rouge-score without stemming, sentences for rougeLsum split by T5's
  ``" . " -> " .\\n"`` rule, the bootstrap-aggregated (1000 samples, seeded) mid F-measure.
- ``"bleu"``: sacrebleu ``corpus_bleu`` with ``tokenize="intl"``, exponential smoothing.
- ``"f1_em"``: token F1 and exact match after the official TriviaQA answer normalization, the
  max over an example's aliases, the mean over examples.

Every metric function takes ``predictions`` and ``references`` of equal, non-zero length and
returns a dict of plain Python floats on a 0-100 scale; ``PRIMARY`` names the headline key of each
(the number used to keep the best checkpoint)::

    score("rouge", ["the cat sat"], ["the cat sat down"])  # {"rouge1": 85.7, "rouge2": ..., ...}
"""

from __future__ import annotations

import collections
import importlib
import re
import string
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np

# rouge_score (with nltk) and sacrebleu load when a score is computed, not at import: a training
# process that never scores (pre-training) does not pay for importing them at start-up.

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
ROUGE_BOOTSTRAP_SEED = 0  # numpy seed of the ROUGE bootstrap (see _bootstrap_mid)


def import_without(name: str, unused: tuple[str, ...]) -> ModuleType:
    """``import name`` with the optional packages ``unused`` hidden while it loads, each only if
    not loaded already. tensorboardX imports torch when torch is installed (to accept torch
    tensors; scalars never need it), and rouge_score's nltk imports scipy.stats (for a collocation
    test ROUGE never runs): both would only add to every training process's start-up time."""
    hidden = [m for m in unused if m not in sys.modules]
    for m in hidden:
        sys.modules[m] = None  # type: ignore[assignment]  # None here makes ``import m`` fail
    try:
        return importlib.import_module(name)
    finally:
        for m in hidden:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]


def _rouge_module(name: str) -> ModuleType:
    return import_without(f"rouge_score.{name}", ("scipy.stats",))


# ----------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------


def _check_pairs(predictions: Sequence[str], references: Sequence[Any]) -> None:
    """Equal, non-zero lengths; a bare string is not a list of predictions."""
    for name, value in (("predictions", predictions), ("references", references)):
        if isinstance(value, (str, bytes)):
            raise ValueError(f"{name} must be a sequence of examples, got a single {type(value).__name__}")
    if len(predictions) != len(references):
        raise ValueError(
            f"predictions and references differ in length: {len(predictions)} != {len(references)}"
        )
    if len(predictions) == 0:
        raise ValueError("predictions and references are empty: nothing to score")


def _t5_rouge_text(text: str) -> str:
    """T5's ``_prepare_summary_rouge``: ``" . "`` becomes ``" .\\n"``, one sentence per line.

    Only ``rougeLsum`` looks at lines. Like T5 it is applied to the text every ROUGE type sees;
    rouge-score's tokenizer turns every non-alphanumeric character (newlines included) into a
    separator, so rouge1/2/L are the same as on the raw text. Only space-separated periods split
    (tokenized CNN/DailyMail style): "Hi. There." stays one sentence, as in T5.
    """
    return text.replace(" . ", " .\n")


def _bootstrap_mid(scores: Sequence[Mapping[str, Any]], seed: int) -> dict[str, Any]:
    """``scoring.BootstrapAggregator()`` (1000 samples, 95%) mid scores, seeded reproducibly.

    The aggregator draws from numpy's global RNG; it is seeded with ``seed`` for the call and its
    previous state restored afterwards, so the result is deterministic and callers' random
    streams are untouched (not thread-safe against other users of the global RNG meanwhile).
    """
    scoring = _rouge_module("scoring")

    aggregator = scoring.BootstrapAggregator()
    for example in scores:
        aggregator.add_scores(example)
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        result = aggregator.aggregate()
    finally:
        np.random.set_state(state)
    return {key: value.mid for key, value in result.items()}


def rouge(
    predictions: Sequence[str], references: Sequence[str], *, seed: int = ROUGE_BOOTSTRAP_SEED
) -> dict[str, float]:
    """ROUGE-1/2/L/Lsum as T5's ``metrics.rouge``: bootstrap-aggregated mid F-measure x 100.

    ``rouge_score.RougeScorer(use_stemmer=False)`` (rouge-score's default, T5's setting) scores
    each pair after ``_t5_rouge_text`` (T5's sentence split for rougeLsum); the per-example
    F-measures are aggregated by ``rouge_score.scoring.BootstrapAggregator`` with its defaults
    (n_samples=1000, confidence 0.95) and the mid (median of the resampled means) is reported.
    T5 leaves the bootstrap unseeded; here numpy is seeded with ``seed`` (see ``_bootstrap_mid``),
    so a score is reproducible. The mid is close to, not equal to, the plain mean over examples.
    Returns ``{"rouge1", "rouge2", "rougeL", "rougeLsum"}``.
    """
    rouge_scorer = _rouge_module("rouge_scorer")

    _check_pairs(predictions, references)
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)
    scores = [
        scorer.score(target=_t5_rouge_text(reference), prediction=_t5_rouge_text(prediction))
        for prediction, reference in zip(predictions, references, strict=True)
    ]
    mid = _bootstrap_mid(scores, seed)
    return {key: 100.0 * float(mid[key].fmeasure) for key in ROUGE_TYPES}


def bleu(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU as T5's ``metrics.bleu``, 0-100 scale.

    ``sacrebleu.corpus_bleu`` with ``tokenize="intl"`` (splits Unicode punctuation and symbols,
    e.g. "5€." -> "5 € ."), ``smooth_method="exp"``, case-sensitive, no effective order. One
    reference per example. Returns ``{"bleu"}``.
    """
    import sacrebleu

    _check_pairs(predictions, references)
    result = sacrebleu.corpus_bleu(
        list(predictions), [list(references)], smooth_method="exp", tokenize="intl",
        lowercase=False, use_effective_order=False,
    )  # fmt: skip
    return {"bleu": float(result.score)}


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_TRIVIA_QA_PUNCTUATION = str.maketrans(dict.fromkeys(string.punctuation + "‘’´`", " "))


def normalize_trivia_qa(text: str) -> str:
    """The official TriviaQA ``normalize_answer`` (as T5's ``normalize_trivia_qa``).

    "_" -> " ", lowercase, every ASCII punctuation character and ‘ ’ ´ ` -> " ", the whole words
    a/an/the removed, whitespace collapsed. Punctuation becomes a space (not deleted as in SQuAD):
    "don't" -> "don t", "U.S.A." -> "u s" (the "a" is then an article). Other quotes (“ ”) are
    kept, as in the script.
    """
    text = text.replace("_", " ").lower().translate(_TRIVIA_QA_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _token_f1(prediction: str, reference: str) -> float:
    """Token-level F1 of two normalized answers (as SQuAD v1.1: 0 when no token is shared)."""
    prediction_tokens, reference_tokens = prediction.split(), reference.split()
    num_same = sum((collections.Counter(prediction_tokens) & collections.Counter(reference_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(reference_tokens)
    return 2 * precision * recall / (precision + recall)


def trivia_qa_f1_em(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """TriviaQA token F1 and exact match x 100, as the official script and T5's ``trivia_qa``.

    ``references[i]`` is the list of acceptable answers of example i (its aliases). Answers are
    compared after ``normalize_trivia_qa``; each example scores the max over its aliases, the
    result is the mean over examples. F1 is 0 when no token is shared, including when both answers
    normalize to "" (where EM is 100). Returns ``{"f1", "em"}``.
    """
    _check_pairs(predictions, references)
    f1_total = em_total = 0.0
    for i, (prediction, answers) in enumerate(zip(predictions, references, strict=True)):
        if isinstance(answers, (str, bytes)) or not answers:
            raise ValueError(
                f"references[{i}] must be a non-empty list of answer strings, got {answers!r} "
                "(wrap a single answer in a list)"
            )
        prediction = normalize_trivia_qa(prediction)
        answers = [normalize_trivia_qa(answer) for answer in answers]
        f1_total += max(_token_f1(prediction, answer) for answer in answers)
        em_total += max(float(prediction == answer) for answer in answers)
    n = len(predictions)
    return {"f1": 100.0 * f1_total / n, "em": 100.0 * em_total / n}


# The metrics the tasks name (``Task.metric``), T5's.
METRICS: dict[str, Callable[..., dict[str, float]]] = {"rouge": rouge, "bleu": bleu, "f1_em": trivia_qa_f1_em}
PRIMARY: dict[str, str] = {"rouge": "rouge1", "bleu": "bleu", "f1_em": "f1"}


def score(metric_name: str, predictions: Sequence[str], references: Sequence[Any]) -> dict[str, float]:
    """``METRICS[metric_name](predictions, references)``, with a clear error for unknown names."""
    if metric_name not in METRICS:
        raise ValueError(f"unknown metric {metric_name!r}; known metrics: {sorted(METRICS)}")
    return METRICS[metric_name](predictions, references)
