"""Calibration for the ``grouped`` and ``svd`` conversions: the second moment of every converted
attention's K/V input, measured on a few batches of a task (by default the span-corruption corpus
the models pre-train on), deterministic per seed.

Letters: ``B`` batch, ``S`` encoder length, ``T`` decoder length, ``D`` d_model, ``L`` layers.

For each converted attention kind and layer, ``C = X^T X / n`` [D, D] over the ``n`` non-pad
tokens of the calibration batches, where ``X`` is what the attention's K/V projections read:

- ``encoder_self``: each encoder layer's pre-attention RMSNorm output (``attn_norm``);
- ``decoder_self``: each decoder layer's pre-attention RMSNorm output (``self_attn_norm``), under
  teacher forcing (the decoder reads the targets shifted right, as in training);
- ``cross``: the encoder's final output, the K/V input of every decoder layer's cross-attention
  (the same ``X`` for all of them, so stored once: ``calibration_stats``).

The model runs unchanged: ``nnx.capture`` records the output of every module method during one
jitted forward pass, this module keeps the norms' and the encoder's (the names above are
``model.py``'s module names), and XLA drops the rest. Scanned or rematerialized stacks are run
as a plain loop of layers (the same function), so every layer's output is seen. Each batch's
``X^T X`` is summed on the device in float32 at HIGHEST precision; the sum over batches and the
division by ``n`` are float64 on the host.

Batches come from ``data.pipeline.make_pipeline`` on the task's train split, shuffled with the
seed, one example per row (no packing), read by this process alone: every process of a
multi-host run gathers the same statistics.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gqa_jax import calibration_stats, convert
from gqa_jax.config import ModelConfig
from gqa_jax.data import pipeline as pipeline_lib
from gqa_jax.data import stdlib_suite
from gqa_jax.data import tasks as tasks_lib
from gqa_jax.data import vocab as vocab_lib
from gqa_jax.log import log
from gqa_jax.model import PAD_ID, T5, build

DEFAULT_TASK = "stdlib_span"  # the embedded span-corruption corpus (configs/pretrain.py's task)
DEFAULT_BATCH_SIZE = 8
SPLIT = "train"
# Which tokens each kind's statistics count: its K/V input's positions.
TOKENS = {"encoder_self": "encoder", "decoder_self": "decoder", "cross": "encoder"}


def second_moments(
    model: T5 | tuple[nnx.GraphDef, nnx.State],
    batches: Iterable[Mapping[str, np.ndarray]],
    attentions: tuple[str, ...] | list[str] = convert.DEFAULT_ATTENTIONS,
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The statistics of ``attentions`` over ``batches`` (each with the pipeline's
    ``encoder_input_tokens [B, S]``, ``decoder_input_tokens [B, T]`` and ``decoder_target_tokens
    [B, T]``; id 0 is padding) and the tokens counted, ``{"encoder": n, "decoder": n}``."""
    attentions = convert.normalize_attentions(attentions)
    graphdef, state = nnx.split(_unrolled(model))
    sums = {kind: 0.0 for kind in attentions}
    tokens = {"encoder": 0, "decoder": 0}
    for batch in batches:
        encoder_ids = jnp.asarray(batch["encoder_input_tokens"], jnp.int32)
        decoder_ids = jnp.asarray(batch["decoder_input_tokens"], jnp.int32)
        targets = jnp.asarray(batch["decoder_target_tokens"], jnp.int32)
        moments = _batch_sums(graphdef, attentions, state, encoder_ids, decoder_ids, targets)
        for kind in attentions:
            sums[kind] = sums[kind] + np.asarray(moments[kind], np.float64)  # [L, D, D]
        tokens["encoder"] += int(np.sum(np.asarray(batch["encoder_input_tokens"]) != PAD_ID))
        tokens["decoder"] += int(np.sum(np.asarray(batch["decoder_target_tokens"]) != PAD_ID))
    empty = [name for name in sorted({TOKENS[k] for k in attentions}) if tokens[name] == 0]
    if empty:
        raise ValueError(
            f"calibration counted no {' or '.join(empty)} tokens: give batches with non-pad tokens"
        )
    return {kind: sums[kind] / tokens[TOKENS[kind]] for kind in attentions}, tokens


def gather(
    model: T5 | tuple[nnx.GraphDef, nnx.State],
    *,
    attentions: tuple[str, ...] | list[str] = convert.DEFAULT_ATTENTIONS,
    task: str = DEFAULT_TASK,
    data_dir: str | os.PathLike | None = None,
    vocab: vocab_lib.Vocabulary | str | os.PathLike | None = None,
    batches: int = 4,
    batch_size: int = DEFAULT_BATCH_SIZE,
    input_length: int | None = None,
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The statistics ``convert.to_grouped(..., calibration=...)`` takes, from ``batches`` batches
    of ``batch_size`` rows of ``task``'s train split (shuffled with ``seed``), and a JSON-able record
    of how they were gathered (task, split, data_dir, vocabulary, batches, batch size, lengths,
    seed, tokens counted, attentions, the statistics' sha256).

    ``vocab``: a ``Vocabulary`` or the path of its SentencePiece model; None takes the stdlib
    suite's for the suite's tasks. ``input_length``: None for the task's. A ValueError names what
    is wrong: too few batches or rows, an unknown task, data not prepared in ``data_dir`` (with the
    command that prepares it), no vocabulary or one too large for the model (a vocabulary file
    that does not exist is a FileNotFoundError).
    """
    for name, value in (("batches", batches), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"calibration {name}={value!r} must be an integer >= 1")
    attentions = convert.normalize_attentions(attentions)
    task = tasks_lib.get_task(task)
    data_dir = str(data_dir) if data_dir is not None else tasks_lib.default_data_dir()
    try:  # before the vocabulary: the suite's is trained from this data when missing
        source = tasks_lib.open_split(task, SPLIT, data_dir)
    except (ValueError, FileNotFoundError) as e:
        raise ValueError(f"calibration reads the {SPLIT} split of task {task.name}: {e}") from e
    vocab = _vocabulary(vocab, task, data_dir)
    config = _config(model)
    if vocab.vocab_size > config.vocab_size:
        raise ValueError(
            f"the calibration vocabulary {vocab.path} has {vocab.vocab_size} ids, more than the model's "
            f"vocab_size {config.vocab_size}: pass the vocabulary the checkpoint was trained with"
        )
    pipe = pipeline_lib.make_pipeline(
        task, SPLIT, vocab, batch_size=batch_size, seed=seed, data_dir=data_dir, shuffle=True, repeat=True,
        pack=False, input_length=input_length, process_index=0, process_count=1, source=source,
    )  # fmt: skip
    log(
        f"calibration: {batches} batch(es) of {batch_size} rows of {task.name} ({SPLIT}, seed {seed}, "
        f"lengths {pipe.input_length}/{pipe.target_length})"
    )
    rows = pipe.iterator()
    statistics, tokens = second_moments(model, (next(rows) for _ in range(batches)), attentions)
    record = {
        "task": task.name,
        "split": SPLIT,
        "data_dir": data_dir,
        "vocab": {"path": str(vocab.path), "sha256_16": vocab.content_hash()},
        "batches": batches,
        "batch_size": batch_size,
        "input_length": pipe.input_length,
        "target_length": pipe.target_length,
        "seed": seed,
        "tokens": tokens,
        "attentions": list(attentions),
        "statistics_sha256": calibration_stats.statistics_hash(statistics),
    }
    return statistics, record


def _config(model: T5 | tuple[nnx.GraphDef, nnx.State]) -> ModelConfig:
    return model.config if isinstance(model, T5) else nnx.merge(*model).config


def _unrolled(model: T5 | tuple[nnx.GraphDef, nnx.State]) -> T5:
    """The model with its layers run one by one, without remat (the same function), so that
    ``nnx.capture`` sees every layer; the parameters are the same arrays."""
    model = model if isinstance(model, T5) else nnx.merge(*model)
    if not model.config.scan_layers and model.config.remat == "none":
        return model
    return build(model.config.replace(scan_layers=False, remat="none"), model)


def _vocabulary(vocab: Any, task: tasks_lib.Task, data_dir: str) -> vocab_lib.Vocabulary:
    if vocab is None:
        if not task.suite:
            raise ValueError(
                f"calibration on task {task.name} needs its vocabulary: pass the SentencePiece model the "
                "checkpoint was trained with (--vocab)"
            )
        return stdlib_suite.suite_vocab(data_dir, log=log)
    return vocab if isinstance(vocab, vocab_lib.Vocabulary) else vocab_lib.load_vocab(vocab)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _batch_sums(
    graphdef: nnx.GraphDef,
    attentions: tuple[str, ...],
    state: nnx.State,
    encoder_ids: jax.Array,
    decoder_ids: jax.Array,
    targets: jax.Array,
) -> dict[str, jax.Array]:
    """One batch's ``sum X^T X`` over non-pad positions, ``{kind: [L, D, D]}`` (float32)."""
    model = nnx.merge(graphdef, state)
    forward = nnx.capture(
        lambda m, e, d: m(e, d), nnx.Intermediate, method_outputs=nnx.Intermediate
    )  # every module method's output, by module path and method name
    _, seen = forward(model, encoder_ids, decoder_ids)
    seen = nnx.to_pure_dict(seen)
    encoder_mask, decoder_mask = encoder_ids != PAD_ID, targets != PAD_ID  # [B, S], [B, T]

    def moment(x: jax.Array, mask: jax.Array) -> jax.Array:  # [B, S, D], [B, S] -> [D, D]
        x = x.astype(jnp.float32) * mask[..., None]
        return jnp.einsum("BSD,BSE->DE", x, x, precision=jax.lax.Precision.HIGHEST)

    def layers(stack: str, norm: str, mask: jax.Array) -> jax.Array:  # -> [L, D, D]
        found = seen[stack]["layers"]
        return jnp.stack([moment(found[i][norm]["__call__"][0], mask) for i in range(len(found))])

    out = {}
    if "encoder_self" in attentions:
        out["encoder_self"] = layers("encoder", "attn_norm", encoder_mask)
    if "decoder_self" in attentions:
        out["decoder_self"] = layers("decoder", "self_attn_norm", decoder_mask)
    if "cross" in attentions:
        out["cross"] = moment(seen["encoder"]["__call__"][0], encoder_mask)[None]  # [1, D, D]
    return out
