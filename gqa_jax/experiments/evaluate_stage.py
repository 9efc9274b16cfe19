"""The ``evaluate`` stage: score a checkpoint on a task's split with greedy decoding (the paper's
evaluation), and its teacher-forced loss on the same examples (a low-noise second number), and
write ``results.json`` and ``decodes.jsonl`` into a run directory."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from gqa_jax import checkpoints, kv_quant, metric_writers, metrics, paths, training
from gqa_jax.data import tasks as tasks_lib

RESULTS = "results.json"
DECODES = "decodes.jsonl"


def evaluate_checkpoint(
    workdir: str | os.PathLike,
    model_path: str | os.PathLike,
    task_name: str,
    *,
    split: str = "validation",
    examples: int | None = None,
    batch_size: int = 32,
    data_dir: str | None = None,
    vocab: str | None = None,
    input_length: int | None = None,
    target_length: int | None = None,
    cache_dtype: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Decode ``examples`` of ``task_name``'s ``split`` (all when None) with the checkpoint at
    ``model_path`` (ours, or a HuggingFace T5 directory) and score them with the task's metric;
    writes and returns the results (fields in ``docs/experiments.md``). ``cache_dtype``: the decodes'
    KV cache (None: the model's dtype; int8 / fp8: ``gqa_jax.kv_quant``)."""
    workdir = Path(workdir)
    out = workdir / RESULTS
    data_dir = data_dir or tasks_lib.default_data_dir()
    task = _check(workdir, out, overwrite, task_name, examples, data_dir)
    cache_dtype = kv_quant.check_cache_dtype(cache_dtype)
    checkpoints.check_source(model_path)  # a wrong path is named before a vocabulary is built
    voc = training.load_vocab(vocab, task, data_dir)
    model, _, kind = checkpoints.load_any(model_path)  # ours, HuggingFace or T5X
    t0 = time.time()
    scores, decodes = training.evaluate(
        model, task, voc, split=split, num_examples=examples, batch_size=batch_size, data_dir=data_dir,
        input_length=input_length, target_length=target_length, cache_dtype=cache_dtype, with_loss=True,
    )  # fmt: skip
    loss = scores.pop("loss")
    result = {
        "task": task.name,
        "split": split,
        "metric": task.metric,
        "scores": scores,
        "primary": scores[metrics.PRIMARY[task.metric]],
        "loss": loss,
        "examples": len(decodes),
        "model": str(model_path),
        "model_kind": kind,
        "cache_dtype": cache_dtype or model.config.dtype,
        "seconds": time.time() - t0,
    }
    workdir.mkdir(parents=True, exist_ok=True)
    metric_writers.write_decodes(
        workdir / DECODES, [d["input"] for d in decodes], [d["prediction"] for d in decodes],
        [d["reference"] for d in decodes],
    )  # fmt: skip
    paths.write_text_atomic(out, json.dumps(result, indent=2) + "\n")
    return result


def _check(
    workdir: Path, out: Path, overwrite: bool, task_name: str, examples: int | None, data_dir: str
) -> Any:
    """The task to score; ValueError for a file as workdir, results there already, span corruption,
    fewer than one example or a task file's bad rows."""
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"--workdir {workdir} is a file, not a directory")
    if out.exists() and not overwrite:
        raise ValueError(f"{out} exists: pass --overwrite to score again, or choose another --workdir")
    task = tasks_lib.get_task(task_name)
    if task.metric is None:
        raise ValueError(f"task {task_name} is span corruption: its dev loss is in a training run's metrics")
    if examples is not None and examples < 1:
        raise ValueError(f"--examples must be >= 1, got {examples}")
    tasks_lib.open_files(task, data_dir)
    return task
