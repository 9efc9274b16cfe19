"""The embedded mini reproduction of Table 1: ``python -m gqa_jax demo``.

On data built from this Python's standard library (no download), with the tiny preset:

  1. build the stdlib suite and its vocabulary (``data build-suite``), if missing;
  2. pre-train an MHA model with span corruption on ``stdlib_span``;
  3. uptrain it to GQA-2 and MQA: mean-pool the K/V heads, then ``alpha x`` the pre-training
     steps of span corruption (the paper's alpha is 0.05);
  4. fine-tune MHA, GQA-2 and MQA on ``stdlib_docsum`` (function source -> the docstring's first
     sentence; dropout 0.1, constant learning rate 0.01: the paper's 0.001 is for pre-trained
     T5 models, and at 0.001 this tiny model barely moves in 300 steps), keeping the best dev
     ROUGE-1;
  5. measure greedy decoding time per sample on dev inputs, and print the table: K/V heads,
     cache bytes per sample, ROUGE-1 before and after fine-tuning, decode ms per sample.

Every stage is a ``train()`` run in its own directory under ``--workdir``; a finished stage is
skipped on a second invocation, and an interrupted one resumes from its last checkpoint.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from gqa_jax import cache, checkpoints, decoding, metrics, run_config, training
from gqa_jax.data import pipeline as pipeline_lib
from gqa_jax.data import stdlib_suite
from gqa_jax.data import tasks as tasks_lib

SCALES = {
    # pretrain steps, finetune steps, batch, eval examples, decode-timing examples, vocabulary
    "default": {"pretrain": 400, "finetune": 300, "batch": 16, "eval": 200, "timing": 64, "vocab": 8000},
    "quick": {"pretrain": 6, "finetune": 4, "batch": 4, "eval": 8, "timing": 8, "vocab": 1000},
}
ALPHA = 0.05
INPUT_LEN_PRETRAIN = 128
INPUT_LEN_DOCSUM = 256
TARGET_LEN_DOCSUM = 32
# Fine-tuning learning rate of the demo (configs/finetune.py keeps the paper's 0.001). Measured
# on the default scale's MHA model: dev ROUGE-1 5.9 at 0.001, 10.9 at 0.01 after 300 steps.
FINETUNE_LR = 0.01


def _stage(workdir: Path, config: Any, log: Callable[[str], None]) -> dict[str, Any]:
    done = workdir / "summary.json"
    if done.is_file():
        log(f"{workdir.name}: done before, skipped")
        return json.loads(done.read_text())
    log(f"{workdir.name}: training ...")
    t0 = time.time()
    summary = training.train(config, workdir)
    log(f"{workdir.name}: {summary.get('final_step')} steps in {time.time() - t0:.0f} s")
    return summary


def _config(file: str, overrides: dict[str, Any]) -> Any:
    return run_config.load(file, [f"--config.{k}={v}" for k, v in overrides.items()])


def _decode_ms_per_sample(model_dir: Path, vocab: Any, data_dir: str, n: int, batch: int) -> float:
    """Median wall time of greedy decoding ``batch`` dev rows, per sample (compile excluded)."""
    model, _ = checkpoints.load(model_dir)
    task = tasks_lib.get_task("stdlib_docsum")
    p = pipeline_lib.make_pipeline(
        task, "validation", vocab, batch_size=batch, data_dir=data_dir, input_length=INPUT_LEN_DOCSUM,
        target_length=TARGET_LEN_DOCSUM, process_index=0, process_count=1,
    )  # fmt: skip
    batches = [b["encoder_input_tokens"] for b in itertools.islice(p.iterator(), max(1, n // batch))]
    jax.block_until_ready(decoding.greedy_decode(model, batches[0], TARGET_LEN_DOCSUM).tokens)  # compile
    times = []
    for ids in batches:
        t0 = time.perf_counter()
        jax.block_until_ready(decoding.greedy_decode(model, ids, TARGET_LEN_DOCSUM).tokens)
        times.append((time.perf_counter() - t0) / ids.shape[0])
    return 1000 * float(np.median(times))


def run(
    workdir: str | Path = "runs/mini",
    *,
    data_dir: str | None = None,
    scale: str = "default",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or finish) the mini reproduction in ``workdir``; returns the table's rows."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose from {', '.join(SCALES)}")
    s = SCALES[scale]
    root = Path(workdir).expanduser().absolute()
    data_dir = str(data_dir or tasks_lib.default_data_dir())
    t_start = time.time()
    log(f"data: {data_dir}")
    stdlib_suite.build_suite(data_dir, log=log)
    vocab = stdlib_suite.suite_vocab(data_dir, s["vocab"], log=log)
    common = {
        "data_dir": data_dir,
        "vocab": str(vocab.path),
        "batch_size": s["batch"],
        "progress": False,
        "log_every": 10,
        "eval_examples": s["eval"],
    }
    pre = _config(
        _packaged("pretrain.py"),
        common | {"num_train_steps": s["pretrain"], "input_length": INPUT_LEN_PRETRAIN, "eval_every": -1,
                  "checkpoint_every": max(1, s["pretrain"] // 2)},
    )  # fmt: skip
    _stage(root / "pretrain_mha", pre, log)
    num_heads = json.loads((root / "pretrain_mha" / "model_config.json").read_text())["num_heads"]
    starts = {num_heads: root / "pretrain_mha" / "model"}
    for k in (num_heads // 2, 1):
        up = _config(
            _packaged("uptrain.py"),
            common | {"uptrain.source": str(starts[num_heads]), "uptrain.num_kv_heads": k,
                      "uptrain.alpha": ALPHA, "uptrain.original_steps": s["pretrain"],
                      "input_length": INPUT_LEN_PRETRAIN, "eval_every": -1, "checkpoint_every": 1000},
        )  # fmt: skip
        _stage(root / f"uptrain_k{k}", up, log)
        starts[k] = root / f"uptrain_k{k}" / "model"
    rows = []
    for k, start in sorted(starts.items(), reverse=True):
        ft = _config(
            _packaged("finetune.py"),
            common | {"task": "stdlib_docsum", "init_from": str(start), "num_train_steps": s["finetune"],
                      "input_length": INPUT_LEN_DOCSUM, "target_length": TARGET_LEN_DOCSUM,
                      "eval_every": max(1, s["finetune"] // 2), "checkpoint_every": 1000,
                      "optimizer.learning_rate": FINETUNE_LR},
        )  # fmt: skip
        run_dir = root / f"finetune_k{k}"
        summary = _stage(run_dir, ft, log)
        evals = [m for m in metrics.read_metrics(run_dir) if "eval/rouge1" in m]
        before = next((m["eval/rouge1"] for m in evals if m["step"] == 0), float("nan"))
        best = max(evals, key=lambda m: m["eval/rouge1"])
        cfg = checkpoints.load(run_dir / "model")[1]
        rows.append({
            "model": "MHA" if k == num_heads else ("MQA" if k == 1 else f"GQA-{k}"),
            "kv_heads": k,
            "uptrain_steps": 0 if k == num_heads else max(1, round(ALPHA * s["pretrain"])),
            "cache_bytes_per_sample": cache_bytes(cfg),
            "rouge1_before": before,
            "rouge1_best": best["eval/rouge1"],
            "best_step": best["step"],
            "decode_ms_per_sample": _decode_ms_per_sample(run_dir / "model", vocab, data_dir, s["timing"], 8),
            "finetune_steps": summary.get("final_step"),
        })  # fmt: skip
    result = {"rows": rows, "scale": scale, "seconds": time.time() - t_start, "workdir": str(root)}
    (root / "table1.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def cache_bytes(config: Any) -> int:
    """KV-cache bytes of one docsum sample (self over the targets, cross over the inputs)."""
    return cache.expected_cache_bytes(config, 1, INPUT_LEN_DOCSUM, TARGET_LEN_DOCSUM, config.dtype)["total"]


def _packaged(name: str) -> str:
    """The config file ``configs/<name>`` of this checkout (the demo runs from the repository)."""
    here = Path(__file__).resolve().parents[1] / "configs" / name
    if not here.is_file():
        raise FileNotFoundError(f"config {here} not found: run the demo from a checkout of gqa_jax")
    return str(here)


def table(result: dict[str, Any]) -> str:
    lines = [
        "| model | K/V heads | uptrain steps | KV cache / sample | docsum ROUGE-1 before -> best (step) "
        "| decode ms / sample |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        kib = r["cache_bytes_per_sample"] / 1024
        lines.append(
            f"| {r['model']} | {r['kv_heads']} | {r['uptrain_steps']} | {kib:.1f} KiB "
            f"| {r['rouge1_before']:.1f} -> {r['rouge1_best']:.1f} ({r['best_step']}) "
            f"| {r['decode_ms_per_sample']:.2f} |"
        )
    lines.append("")
    lines.append(f"{result['scale']} scale, {result['seconds'] / 60:.1f} min, runs in {result['workdir']}")
    return "\n".join(lines)
