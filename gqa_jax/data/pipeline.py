"""Input pipelines: a ``Task`` + a vocabulary -> fixed-shape numpy batches, deterministic and resumable.

Built with grain on the task's random-access TFDS source:

    source -> shuffle (seed; reshuffled every epoch) -> repeat -> this process's slice
           -> tokenize (prefix + text, truncate, EOS)                       [sequence-to-sequence]
              or tokenize -> chunks of 568 tokens -> T5 span corruption     [span corruption]
           -> pack several examples per row (first fit) or pad each one -> batch

Every batch has the same shapes (``[B, input_length]``, ``[B, target_length]``), so a jitted
train step compiles once. Features (T5X's names):

  encoder_input_tokens [B, S]   decoder_target_tokens [B, T]   decoder_input_tokens [B, T]
  decoder_loss_weights [B, T]   float32, 1 on real target tokens
  packed rows add encoder_segment_ids / decoder_segment_ids (1, 2, ... per example, 0 = padding)
  and encoder_positions / decoder_positions; ``decoder_input_tokens`` restart with the start id
  at every packed example, and the model masks attention to the own segment (``gqa_jax.model``).
  Unrepeated pipelines (evaluation) add ``example_index [B]``: the source index of each row, -1
  for the zero rows that pad the last batch.

Span corruption follows T5: a document's tokens are cut into chunks of 568 tokens (so that a
corrupted chunk fills 512 inputs and 114 targets; the first ``MAX_CHUNKS_PER_DOCUMENT`` chunks of
very long documents), each chunk is corrupted with a seed drawn from (seed, its position in
the stream), so the same seed gives the same examples.

Multi-host: ``batch_size`` is global; process p of P reads every P-th example of the shuffled
stream and yields ``[batch_size // P, ...]`` rows: together the processes see each example once.

Resuming: ``BatchIterator.get_state()`` is a small JSON-able dict (grain's iterator state plus
the step); ``pipeline.iterator(state=...)`` continues exactly where it was. Without a saved state,
``pipeline.iterator(start_step=n)`` replays n batches (deterministic, costs their preprocessing).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import grain
import numpy as np

from gqa_jax.data import epoch_shuffle
from gqa_jax.data import tasks as tasks_lib
from gqa_jax.data.span_corruption import span_corrupt, span_corruption_lengths

MAX_CHUNKS_PER_DOCUMENT = 128  # 128 x 568 tokens, about T5's 65536-token select_random_chunk cap
DECODER_START_ID = 0
PAD_ID = 0

Batch = dict[str, np.ndarray]


def _truncate(ids: list[int], length: int, eos_id: int) -> np.ndarray:
    """``ids`` cut to ``length - 1`` tokens, then EOS."""
    return np.asarray(ids[: length - 1] + [eos_id], dtype=np.int32)


def shift_right(targets: np.ndarray, segment_ids: np.ndarray | None = None) -> np.ndarray:
    """Decoder inputs: targets shifted right behind the start id, restarting at every segment."""
    shifted = np.zeros_like(targets)
    shifted[..., 1:] = targets[..., :-1]
    if segment_ids is not None:
        prev = np.zeros_like(segment_ids)
        prev[..., 1:] = segment_ids[..., :-1]
        shifted = np.where(segment_ids == prev, shifted, DECODER_START_ID)
    return shifted


def _pad_to(x: np.ndarray, length: int) -> np.ndarray:
    out = np.zeros((length,), np.int32)
    out[: len(x)] = x
    return out


class _Tokenize(grain.transforms.Map):
    """Source example -> ``{"inputs", "targets", "index"}`` token arrays (sequence-to-sequence)."""

    def __init__(self, task: tasks_lib.Task, vocab: Any, input_length: int, target_length: int):
        self.task, self.vocab = task, vocab
        self.input_length, self.target_length = input_length, target_length

    def map(self, item: tuple[int, Mapping[str, Any]]) -> dict[str, np.ndarray]:
        index, example = item
        eos = self.vocab.eos_id
        return {
            "inputs": _truncate(self.vocab.encode(self.task.input_text(example)), self.input_length, eos),
            "targets": _truncate(self.vocab.encode(self.task.target_text(example)), self.target_length, eos),
            "index": np.asarray(index, np.int64),
        }


class _Chunks(grain.experimental.FlatMapTransform):
    """A document's tokens -> chunks of ``chunk_length`` (the last one shorter; < 2 tokens dropped)."""

    max_fan_out = MAX_CHUNKS_PER_DOCUMENT

    def __init__(self, task: tasks_lib.Task, vocab: Any, chunk_length: int):
        self.task, self.vocab, self.chunk_length = task, vocab, chunk_length

    def flat_map(self, item: tuple[int, Mapping[str, Any]]) -> list[np.ndarray]:
        _, example = item
        ids = np.asarray(self.vocab.encode(self.task.input_text(example)), np.int32)
        ids = ids[: self.max_fan_out * self.chunk_length]
        chunks = [ids[start : start + self.chunk_length] for start in range(0, len(ids), self.chunk_length)]
        return [c for c in chunks if len(c) >= 2]


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A task's batches for one split; ``iterator()`` starts (or resumes) a pass over them."""

    task: tasks_lib.Task
    split: str
    batch_size: int  # global
    local_batch_size: int
    input_length: int
    target_length: int
    packed: bool
    repeat: bool
    seed: int
    dataset: Any  # grain IterDataset of batches
    num_source_examples: int

    def iterator(self, start_step: int = 0, state: Mapping[str, Any] | None = None) -> BatchIterator:
        """Batches from ``start_step`` (replayed), or from a saved ``BatchIterator.get_state()``."""
        it = BatchIterator(self, iter(self.dataset))
        if state is not None:
            it.set_state(state)
        elif start_step:
            for _ in range(start_step):
                next(it)
        return it

    def shapes(self) -> dict[str, tuple[int, ...]]:
        B, S, T = self.local_batch_size, self.input_length, self.target_length
        shapes = {
            "encoder_input_tokens": (B, S),
            "decoder_target_tokens": (B, T),
            "decoder_input_tokens": (B, T),
            "decoder_loss_weights": (B, T),
        }
        if self.packed:
            shapes |= {
                "encoder_segment_ids": (B, S),
                "decoder_segment_ids": (B, T),
                "encoder_positions": (B, S),
                "decoder_positions": (B, T),
            }
        if not self.repeat:
            shapes["example_index"] = (B,)
        return shapes


class BatchIterator(Iterator[Batch]):
    """Yields batches; ``step`` counts them; ``get_state``/``set_state`` checkpoint the position."""

    def __init__(self, pipeline: Pipeline, it: Any):
        self.pipeline, self._it, self.step = pipeline, it, 0

    def __next__(self) -> Batch:
        batch = next(self._it)
        self.step += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        """A JSON-serializable position: the step and grain's iterator state."""
        return {"step": self.step, "grain": _jsonable(self._it.get_state())}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or "grain" not in state or "step" not in state:
            raise ValueError(f"not a pipeline state (expected keys 'step' and 'grain'): {state!r:.200}")
        self._it.set_state(state["grain"])
        self.step = int(state["step"])


def _jsonable(state: Any) -> Any:
    """grain states hold ints, lists and dicts, sometimes numpy scalars: make them plain JSON."""
    return json.loads(json.dumps(state, default=lambda x: x.item() if hasattr(x, "item") else str(x)))


def _finish_padded(ex: Mapping[str, np.ndarray], input_length: int, target_length: int) -> Batch:
    targets = _pad_to(ex["targets"], target_length)
    out = {
        "encoder_input_tokens": _pad_to(ex["inputs"], input_length),
        "decoder_target_tokens": targets,
        "decoder_input_tokens": shift_right(targets),
        "decoder_loss_weights": (targets != PAD_ID).astype(np.float32),
    }
    if "index" in ex:
        out["example_index"] = np.asarray(ex["index"], np.int64)
    return out


def _finish_packed(ex: Mapping[str, np.ndarray]) -> Batch:
    targets = ex["targets"].astype(np.int32)
    dec_seg = ex["targets_segment_ids"].astype(np.int32)
    return {
        "encoder_input_tokens": ex["inputs"].astype(np.int32),
        "decoder_target_tokens": targets,
        "decoder_input_tokens": shift_right(targets, dec_seg),
        "decoder_loss_weights": (dec_seg > 0).astype(np.float32),
        "encoder_segment_ids": ex["inputs_segment_ids"].astype(np.int32),
        "decoder_segment_ids": dec_seg,
        "encoder_positions": ex["inputs_positions"].astype(np.int32),
        "decoder_positions": ex["targets_positions"].astype(np.int32),
    }


def _pad_batch(batch: Batch, rows: int) -> Batch:
    """The last, short batch of an unrepeated pass, padded with zero rows (example_index -1)."""
    n = next(iter(batch.values())).shape[0]
    if n == rows:
        return batch
    out = {}
    for key, value in batch.items():
        fill = -1 if key == "example_index" else 0
        pad = np.full((rows - n, *value.shape[1:]), fill, value.dtype)
        out[key] = np.concatenate([value, pad])
    return out


def _process(process_index: int | None, process_count: int | None) -> tuple[int, int]:
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} must be in [0, process_count={process_count})")
    return process_index, process_count


def make_pipeline(
    task: str | tasks_lib.Task,
    split: str,
    vocab: Any,
    *,
    batch_size: int,
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
    shuffle: bool | None = None,
    repeat: bool | None = None,
    pack: bool = False,
    input_length: int | None = None,
    target_length: int | None = None,
    num_packing_bins: int | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
    source: Any = None,
) -> Pipeline:
    """Batches of ``task``'s ``split`` tokenized with ``vocab`` (a ``gqa_jax.data.vocab.Vocabulary``).

    Args:
      batch_size: global rows per batch (divided over ``process_count`` processes).
      shuffle, repeat: default True for "train", False otherwise (an evaluation pass reads every
        example once, in order, the last batch padded with zero rows).
      pack: several examples per row (first fit over ``num_packing_bins`` rows, default
        ``batch_size``), with segment ids and positions; only with ``repeat``.
      input_length, target_length: override the task's (span corruption derives the raw chunk
        length from ``input_length`` and requires the matching target length).
      process_index, process_count: this process's slice (default: ``jax.process_index()/count()``).
      source: a random-access sequence of examples to read instead of the task's TFDS split.
    """
    task = tasks_lib.get_task(task)
    is_train = split == "train"
    shuffle = is_train if shuffle is None else shuffle
    repeat = is_train if repeat is None else repeat
    process_index, process_count = _process(process_index, process_count)
    local_batch = _local_batch_size(batch_size, process_count)
    if pack and not repeat:
        raise ValueError("pack=True is for training streams (repeat=True); evaluation reads padded rows")
    input_length, target_length = _lengths(task, input_length, target_length)
    _check_vocab(vocab)

    source = _open_source(task, split, data_dir, source)
    ds = _examples(source, shuffle, repeat, seed, process_index, process_count)
    if task.span_corruption:
        it = _span_corrupted(ds, task, vocab, input_length, target_length, seed, process_index)
    else:
        it = ds.map(_Tokenize(task, vocab, input_length, target_length)).to_iter_dataset()
    if pack:
        it = _packed_batches(it, input_length, target_length, num_packing_bins or local_batch, local_batch)
    else:
        it = _padded_batches(it, input_length, target_length, local_batch, repeat)
    return Pipeline(
        task=task,
        split=split,
        batch_size=batch_size,
        local_batch_size=local_batch,
        input_length=input_length,
        target_length=target_length,
        packed=pack,
        repeat=repeat,
        seed=seed,
        dataset=it,
        num_source_examples=len(source),
    )


def _local_batch_size(batch_size: int, process_count: int) -> int:
    """This process's rows of a ``batch_size``-row global batch."""
    if batch_size < 1 or batch_size % process_count:
        raise ValueError(
            f"batch_size {batch_size} must be a positive multiple of process_count {process_count}"
        )
    return batch_size // process_count


def _lengths(task: tasks_lib.Task, input_length: int | None, target_length: int | None) -> tuple[int, int]:
    """The rows' input and target lengths: the given ones, else the task's (span corruption: the
    target length T5 derives from the input length)."""
    input_length = task.input_length if input_length is None else input_length
    if task.span_corruption and target_length is None:
        target_length = span_corruption_lengths(input_length)[1]
    target_length = task.target_length if target_length is None else target_length
    if input_length < 2 or target_length < 2:
        raise ValueError(f"input_length {input_length} and target_length {target_length} must be >= 2")
    return input_length, target_length


def _check_vocab(vocab: Any) -> None:
    if getattr(vocab, "sp_size", None) is None or not hasattr(vocab, "encode"):
        raise ValueError(f"vocab must be a gqa_jax.data.vocab.Vocabulary, got {type(vocab).__name__}")


def _open_source(task: tasks_lib.Task, split: str, data_dir: str | os.PathLike | None, source: Any) -> Any:
    """``source``, or (None) the task's TFDS split; an error when it holds no examples."""
    if source is None:
        source = tasks_lib.open_split(task, split, data_dir)
    if len(source) == 0:
        raise ValueError(f"task {task.name} split {split} has no examples")
    return source


def _examples(
    source: Any, shuffle: bool, repeat: bool, seed: int, process_index: int, process_count: int
) -> grain.MapDataset:
    """``(source index, example)`` pairs: shuffled, repeated, then this process's every P-th one."""
    ds = grain.MapDataset.source(source)
    ds = ds.map_with_index(lambda i, ex: (i, ex))  # keep the source index through the shuffle
    if shuffle:
        ds = epoch_shuffle.shuffled(ds, seed)  # grain's order, fast on small splits
    if repeat:
        ds = ds.repeat(None)
    return ds[process_index::process_count]


def _span_corrupted(
    ds: grain.MapDataset,
    task: tasks_lib.Task,
    vocab: Any,
    input_length: int,
    target_length: int,
    seed: int,
    process_index: int,
) -> grain.IterDataset:
    """Each document's chunks, span-corrupted with a seed drawn from (seed, process, position)."""
    chunk, derived_targets = span_corruption_lengths(input_length)
    if target_length != derived_targets:
        raise ValueError(
            f"span corruption of {input_length} input tokens gives {derived_targets} target tokens "
            f"(T5's derivation), not {target_length}: leave target_length unset"
        )
    corrupt_vocab = vocab.sp_size + vocab.extra_ids
    eos = vocab.eos_id

    def corrupt(index: int, tokens: np.ndarray) -> dict[str, np.ndarray]:
        words = np.random.SeedSequence([seed, process_index, index]).generate_state(2)
        example_seed = int(words[0]) << 32 | int(words[1])
        inputs, targets = span_corrupt(tokens, vocab_size=corrupt_vocab, seed=example_seed, eos_id=eos)
        return {"inputs": inputs.astype(np.int32), "targets": targets.astype(np.int32)}

    it = grain.experimental.FlatMapIterDataset(ds.to_iter_dataset(), _Chunks(task, vocab, chunk))
    return it.map_with_index(corrupt)


def _packed_batches(
    it: grain.IterDataset, input_length: int, target_length: int, bins: int, local_batch: int
) -> grain.IterDataset:
    """Examples packed first fit into ``bins`` rows at a time, then full batches of rows."""
    it = grain.experimental.FirstFitPackIterDataset(
        it.map(lambda ex: {"inputs": ex["inputs"], "targets": ex["targets"]}),
        length_struct={"inputs": input_length, "targets": target_length},
        num_packing_bins=bins,
        shuffle_bins=False,
    )
    return it.map(_finish_packed).batch(local_batch, drop_remainder=True)


def _padded_batches(
    it: grain.IterDataset, input_length: int, target_length: int, local_batch: int, repeat: bool
) -> grain.IterDataset:
    """One example per zero-padded row; an unrepeated pass keeps each row's source index and pads
    its last, short batch with zero rows."""
    keep_index = not repeat

    def finish(ex: Mapping[str, np.ndarray]) -> Batch:
        ex = ex if keep_index else {k: v for k, v in ex.items() if k != "index"}
        return _finish_padded(ex, input_length, target_length)

    it = it.map(finish).batch(local_batch, drop_remainder=repeat)
    if not repeat:
        it = it.map(lambda b: _pad_batch(b, local_batch))
    return it
