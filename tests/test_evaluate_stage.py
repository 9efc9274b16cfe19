"""The ``evaluate`` stage on a tiny random model and the stdlib subset: results.json's score and its
teacher-forced dev loss, which is the mean negative log-likelihood per target token of the
evaluated examples (checked against numpy on the same batches)."""

import json

import numpy as np
import pytest

from gqa_jax import checkpoints
from gqa_jax import model as model_lib
from gqa_jax.config import preset
from gqa_jax.data import stdlib_extract
from gqa_jax.data import tasks as tasks_lib
from gqa_jax.experiments.evaluate_stage import evaluate_checkpoint
from gqa_jax.training.evaluation import eval_pipeline

LENGTHS = dict(input_length=32, target_length=8)


def numpy_nll_per_token(model, batches) -> float:
    total, tokens = 0.0, 0.0
    for b in batches:
        logits = np.asarray(model(b["encoder_input_tokens"], b["decoder_input_tokens"]), np.float64)
        top = logits.max(-1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))  # log-softmax
        target = np.take_along_axis(logp, b["decoder_target_tokens"][..., None], -1)[..., 0]
        w = np.asarray(b["decoder_loss_weights"], np.float64)
        total, tokens = total - (target * w).sum(), tokens + w.sum()
    return total / tokens


def test_results_hold_the_teacher_forced_dev_loss_of_the_evaluated_examples(
    suite_subset, small_vocab, tmp_path, monkeypatch
):
    data, env = suite_subset
    monkeypatch.setenv(stdlib_extract.MAX_FILES_ENV, env[stdlib_extract.MAX_FILES_ENV])  # the subset's
    vocab = small_vocab
    model = model_lib.build(preset("tiny", vocab_size=vocab.vocab_size, num_kv_heads=2), seed=1)
    ckpt = checkpoints.save(model, tmp_path / "ckpt")
    result = evaluate_checkpoint(
        tmp_path / "eval", ckpt, "stdlib_docsum", examples=3, batch_size=2, data_dir=str(data),
        vocab=str(vocab.path), **LENGTHS,
    )  # fmt: skip
    on_disk = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert on_disk == result and "loss" not in result["scores"]  # the metric's scores stay the metric's
    task = tasks_lib.get_task("stdlib_docsum")
    _, p = eval_pipeline(task, vocab, num_examples=3, batch_size=2, data_dir=str(data), **LENGTHS)
    batches = [{k: v for k, v in b.items() if k != "example_index"} for b in p.iterator()]
    expected = numpy_nll_per_token(model, batches)
    assert result["loss"] == pytest.approx(expected, rel=1e-5)
    assert 0 < result["loss"] < 2 * np.log(vocab.vocab_size)  # a random model: about log V per token
