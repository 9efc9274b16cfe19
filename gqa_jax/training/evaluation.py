"""Evaluation: greedy decodes scored with the task's metric, or the teacher-forced loss of a
span-corruption corpus, on one device or a mesh."""

from __future__ import annotations

from typing import Any

from gqa_jax import decoding, distributed, metrics
from gqa_jax.data import pipeline as pipeline_lib
from gqa_jax.data import tasks as tasks_lib
from gqa_jax.model import T5
from gqa_jax.training.state import split_model
from gqa_jax.training.step import make_eval_step


class _Head:
    """The first ``n`` examples of a random-access source."""

    def __init__(self, source: Any, n: int | None):
        self.source, self.n = source, len(source) if n is None else min(n, len(source))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.source[i]


def evaluate(
    model: T5 | tuple[Any, Any],
    task: Any,
    vocab: Any,
    *,
    split: str = "validation",
    num_examples: int | None = 256,
    batch_size: int = 32,
    data_dir: str | None = None,
    source: Any = None,
    input_length: int | None = None,
    target_length: int | None = None,
    mesh: Any = None,
    cache_dtype: str | None = None,
    with_loss: bool = False,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Score ``model`` (a ``T5`` or its ``(graphdef, params)``) on ``task``: greedy decodes + the
    task's metric, or, for span-corruption corpora, the teacher-forced loss. Returns ``(scores,
    decoded examples)``. With a ``mesh`` the params stay sharded and every process evaluates the
    same examples (rows over the data axis). ``cache_dtype``: the decodes' KV cache
    (``decoding.greedy_decode``). ``with_loss``: the scores also hold ``loss``, the teacher-forced
    mean negative log-likelihood per target token of the same examples (``teacher_forced_loss``)."""
    source, p = eval_pipeline(
        task, vocab, split=split, num_examples=num_examples, batch_size=batch_size, data_dir=data_dir,
        source=source, input_length=input_length, target_length=target_length, mesh=mesh,
    )  # fmt: skip
    if task.metric is None:
        return teacher_forced_loss(model, p, mesh), []
    rows = decode_rows(model, p, mesh=mesh, cache_dtype=cache_dtype)
    scores, decodes = score_rows(task, source, vocab, rows)
    if with_loss:
        scores = {**scores, "loss": teacher_forced_loss(model, p, mesh)["loss"]}
    return scores, decodes


def eval_pipeline(
    task: Any,
    vocab: Any,
    *,
    split: str = "validation",
    num_examples: int | None = 256,
    batch_size: int = 32,
    data_dir: str | None = None,
    source: Any = None,
    input_length: int | None = None,
    target_length: int | None = None,
    mesh: Any = None,
) -> tuple[Any, Any]:
    """``(source, pipeline)`` of the first ``num_examples`` of ``split`` in order, unshuffled, one
    pass (the last batch padded; rows a multiple of the mesh's data axis)."""
    source = tasks_lib.open_split(task, split, data_dir) if source is None else source
    source = _Head(source, num_examples)
    batch_size = min(batch_size, len(source))
    if mesh is not None:  # whole rows per data shard (the pipeline pads the last batch)
        batch_size = -(-batch_size // mesh.shape["data"]) * mesh.shape["data"]
    p = pipeline_lib.make_pipeline(
        task, split, vocab, batch_size=batch_size, source=source, shuffle=False, repeat=False,
        process_index=0, process_count=1, input_length=input_length, target_length=target_length,
    )  # fmt: skip
    return source, p


def teacher_forced_loss(model: Any, p: Any, mesh: Any = None) -> dict[str, float]:
    """The teacher-forced loss (mean cross-entropy per target token, z-loss left out) and token
    accuracy of ``model`` on a pipeline's batches (``eval_pipeline``'s: a span-corruption corpus or
    a task's examples)."""
    graphdef, params = split_model(model) if isinstance(model, T5) else model
    eval_step = make_eval_step(graphdef)
    sums = {"ce": 0.0, "z": 0.0, "correct": 0.0, "tokens": 0.0}
    for batch in p.iterator():
        batch = {k: v for k, v in batch.items() if k != "example_index"}
        if mesh is not None:
            batch = distributed.global_batch(batch, mesh, identical=True)
        out = distributed.to_host(eval_step(params, batch))
        sums = {k: sums[k] + float(out[k]) for k in sums}
    tokens = max(sums["tokens"], 1.0)
    return {"loss": sums["ce"] / tokens, "accuracy": sums["correct"] / tokens}


def decode_rows(
    model: T5 | tuple[Any, Any], p: Any, *, mesh: Any = None, cache_dtype: str | None = None
) -> list[tuple[int, Any]]:
    """Greedy decodes of a pipeline's batches: ``(example index, tokens [T])`` per real example
    (the padding rows of the last batch dropped), in the pipeline's order."""
    rows = []
    for batch in p.iterator():
        ids = batch["encoder_input_tokens"]
        if mesh is not None:
            ids = distributed.global_batch({"ids": ids}, mesh, identical=True)["ids"]
        result = decoding.greedy_decode(model, ids, p.target_length, mesh=mesh, cache_dtype=cache_dtype)
        tokens = distributed.to_host(result.tokens)
        rows += [(int(i), row) for row, i in zip(tokens, batch["example_index"], strict=True) if i >= 0]
    return rows


def score_rows(
    task: Any, source: Any, vocab: Any, rows: list[tuple[int, Any]]
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``decode_rows``' tokens detokenized and scored with the task's metric against ``source``'s
    references: ``(scores, decoded examples)``."""
    predictions, references, inputs = [], [], []
    for index, row in rows:
        example = source[index]
        predictions.append(vocab.decode(row))
        references.append(task.reference_texts(example))
        inputs.append(task.input_text(example)[:2000])
    refs = references if task.metric == "f1_em" else [r[0] for r in references]
    scores = metrics.score(task.metric, predictions, refs)
    decodes = [
        {"input": i, "prediction": p_, "reference": r}
        for i, p_, r in zip(inputs, predictions, refs, strict=True)
    ]
    return scores, decodes
