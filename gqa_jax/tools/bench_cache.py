"""``python -m gqa_jax bench cache``: what a quantized KV cache changes in a trained model's greedy
decodes, against the float cache, on a task's dev examples.

The checkpoint (ours, HuggingFace or T5X) decodes the first ``examples`` of the split once per cache
dtype (the model's own dtype first, the reference); every decode is the evaluation's
(``training.evaluation.decode_rows``: the task's lengths, EOS ends a row). Per quantized dtype:

- positions agreeing: over each row's positions up to the longer of the two decodes (EOS
  included; the pad after both ended is not counted), the share where both emitted the same token;
- rows identical, and the first differing position of the rows that differ (median);
- the task's score of each, and the paired per-example difference of the primary metric
  (``mean ± 2 standard errors``; only the examples whose prediction changed contribute non-zero
  terms): a difference inside that interval is within the examples' noise;
- cache bytes per example by the formula at the decode's lengths (scales counted), and the wall
  time of the whole decode (compile included, so only indicative).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gqa_jax import checkpoints, kv_quant, metrics, training
from gqa_jax.cache import expected_cache_bytes
from gqa_jax.data import tasks as tasks_lib
from gqa_jax.model import PAD_ID
from gqa_jax.tools.measurement import machine_info, md_table
from gqa_jax.training import evaluation


def agreement(reference: np.ndarray, other: np.ndarray) -> tuple[int, int, int | None]:
    """``(positions compared, positions equal, first differing position or None)`` of two token rows:
    positions up to the last non-pad token of either."""
    used = np.nonzero((reference != PAD_ID) | (other != PAD_ID))[0]
    n = int(used[-1]) + 1 if used.size else 0
    same = reference[:n] == other[:n]
    first = None if same.all() else int(np.argmin(same))
    return n, int(same.sum()), first


def run_cache_bench(
    *,
    model_path: str,
    task_name: str,
    cache_dtypes: tuple[str, ...] = ("int8",),
    split: str = "validation",
    examples: int = 64,
    batch_size: int = 32,
    data_dir: str | None = None,
    vocab: str | None = None,
    input_length: int | None = None,
    target_length: int | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Decode with the float cache and each of ``cache_dtypes``; every number the report prints."""
    dtypes = [kv_quant.check_cache_dtype(d) for d in cache_dtypes]
    task = tasks_lib.get_task(task_name)
    if task.metric is None:
        raise ValueError(f"task {task_name} is span corruption: nothing is decoded; choose a scored task")
    checkpoints.check_source(model_path)  # a wrong path is named before a vocabulary is built
    data_dir = data_dir or tasks_lib.default_data_dir()
    voc = training.load_vocab(vocab, task, data_dir)
    model, _, kind = checkpoints.load_any(model_path)
    source, p = evaluation.eval_pipeline(
        task, voc, split=split, num_examples=examples, batch_size=batch_size, data_dir=data_dir,
        input_length=input_length, target_length=target_length,
    )  # fmt: skip
    primary = metrics.PRIMARY[task.metric]
    base_dtype = model.config.dtype
    out: dict[str, Any] = {
        "machine": machine_info(),
        "settings": {
            "model": model_path,
            "model_kind": kind,
            "task": task.name,
            "split": split,
            "examples": len(source),
            "batch_size": p.batch_size,
            "input_length": p.input_length,
            "target_length": p.target_length,
            "metric": task.metric,
            "primary": primary,
            "model_dtype": base_dtype,
            "num_heads": model.config.num_heads,
            "num_kv_heads": model.config.num_kv_heads,
        },  # fmt: skip
        "rows": {},
    }
    decoded: dict[str, Any] = {}
    for dtype in [None, *dtypes]:
        name = dtype or base_dtype
        log(f"decoding {len(source)} examples of {task.name} {split} with a {name} KV cache ...")
        start = time.perf_counter()
        rows = evaluation.decode_rows(model, p, cache_dtype=dtype)
        seconds = time.perf_counter() - start
        scores, decodes = evaluation.score_rows(task, source, voc, rows)
        decoded[name] = (rows, decodes)
        bytes_ = expected_cache_bytes(model.config, 1, p.input_length, p.target_length, name)["total"]
        out["rows"][name] = {"scores": scores, "primary": scores[primary], "seconds": seconds,
                             "cache_bytes_per_example": bytes_}  # fmt: skip
    ref_rows, ref_decodes = decoded[base_dtype]
    for name in [d for d in dtypes if d != base_dtype]:
        rows, decodes = decoded[name]
        counts = [agreement(a, b) for (_, a), (_, b) in zip(ref_rows, rows, strict=True)]
        firsts = [f for _, _, f in counts if f is not None]
        diffs = []
        for d_ref, d_q in zip(ref_decodes, decodes, strict=True):
            if d_ref["prediction"] == d_q["prediction"]:
                diffs.append(0.0)
                continue
            ref = [d_ref["reference"]]
            one = metrics.score(task.metric, [d_q["prediction"]], ref)[primary]
            diffs.append(one - metrics.score(task.metric, [d_ref["prediction"]], ref)[primary])
        se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
        out["rows"][name].update(
            positions=sum(n for n, _, _ in counts),
            positions_agreeing=sum(s for _, s, _ in counts) / max(sum(n for n, _, _ in counts), 1),
            rows_identical=sum(f is None for _, _, f in counts) / len(counts),
            first_difference_median=statistics.median(firsts) if firsts else None,
            predictions_changed=sum(d_ref["prediction"] != d_q["prediction"]
                                    for d_ref, d_q in zip(ref_decodes, decodes, strict=True)),
            paired_difference=statistics.fmean(diffs),
            paired_difference_2se=2 * se,
        )  # fmt: skip
    return out


def report(res: dict[str, Any]) -> str:
    """The comparison as a Markdown table."""
    s, rows = res["settings"], res["rows"]
    base = s["model_dtype"]
    header = ["KV cache", "bytes / example", "positions agreeing", "rows identical",
              "first difference (median)", s["primary"], "paired difference (± 2 SE)",
              "decode s"]  # fmt: skip
    table = []
    for name, r in rows.items():
        if name == base:
            table.append([f"{name} (reference)", f"{r['cache_bytes_per_example']:,}", "-", "-", "-",
                          f"{r['primary']:.2f}", "-", f"{r['seconds']:.1f}"])  # fmt: skip
            continue
        first = r["first_difference_median"]
        agree = f"{100 * r['positions_agreeing']:.2f}% of {r['positions']:,}"
        diff = f"{r['paired_difference']:+.3f} ± {r['paired_difference_2se']:.3f}"
        table.append([
            name, f"{r['cache_bytes_per_example']:,}", agree, f"{100 * r['rows_identical']:.1f}%",
            "-" if first is None else f"{first:g}", f"{r['primary']:.2f}", diff, f"{r['seconds']:.1f}",
        ])  # fmt: skip
    m = res["machine"]
    return "\n".join([
        f"# KV cache dtypes: {s['task']} {s['split']}, {s['examples']} examples, model {s['model']} "
        f"({s['model_kind']}, {s['model_dtype']}, K = {s['num_kv_heads']} of N = {s['num_heads']})",
        "",
        f"Greedy decodes at input {s['input_length']}, target {s['target_length']}, batch {s['batch_size']}; "
        f"metric {s['metric']}. Machine: jax {m['jax']}, backend {m['backend']}. Decode seconds include "
        "the compile.",
        "",
        *md_table([(h, lambda row, i=i: row[i]) for i, h in enumerate(header)], table),
    ])  # fmt: skip
