"""The paper's settings and numbers, written once; the sweep files in experiments/ build their
runs from these (docs/paper.md says where each comes from).

Lengths come from the tasks (``gqa_jax.data.tasks.TASKS``: each task holds the paper's input /
target lengths), so a run that leaves ``input_length`` / ``target_length`` unset uses them.
"""

from __future__ import annotations

from typing import Any

from gqa_jax import conversion, shipped

# Fine-tuning, every task (section 3.1): constant learning rate, batch, dropout; the best dev
# checkpoint is kept (the train loop keeps it and exports best_model/); decoding is greedy.
FINETUNE = {"optimizer.learning_rate": 0.001, "batch_size": 128, "model.dropout_rate": 0.1}
# The paper trains "to convergence" and gives no step count: this is ours (override with --set).
FINETUNE_STEPS = 50_000
EVAL_EVERY = 1_000  # dev score every this many steps; the best one is kept

# Uptraining (section 2.1 / 3.1): span corruption on C4 with T5's recipe (Adafactor, rsqrt
# schedule continued from the source's step), alpha x the source's pre-training steps.
UPTRAIN_TASK = "c4_span"
UPTRAIN = {"task": UPTRAIN_TASK, "batch_size": 128}  # T5's pre-training batch: 128 rows of 512 tokens
ALPHA = 0.05
T5_1_1_PRETRAIN_STEPS = 1_000_000  # the public T5.1.1 checkpoints are at step 1M (unverified)

# Table 1's tasks, as (task, column, metric) in the paper's column order.
TABLE1_TASKS = (
    ("cnn_dailymail", "CNN R1", "ROUGE-1"),
    ("arxiv", "arXiv R1", "ROUGE-1"),
    ("pubmed", "PubMed R1", "ROUGE-1"),
    ("mediasum", "MediaSum R1", "ROUGE-1"),
    ("multi_news", "MultiNews R1", "ROUGE-1"),
    ("wmt14_en_de", "WMT BLEU", "BLEU"),
    ("trivia_qa", "TriviaQA F1", "F1"),
)
# Table 1: T_infer (s per sample per TPUv4 chip), the paper's Average, and the seven scores.
TABLE1: dict[str, dict[str, Any]] = {
    "MHA-Large": {"time": 0.37, "average": 46.0, "scores": (42.9, 44.6, 46.2, 35.5, 46.6, 27.7, 78.2)},
    "MHA-XXL": {"time": 1.51, "average": 47.2, "scores": (43.8, 45.6, 47.5, 36.4, 46.9, 28.4, 81.9)},
    "MQA-XXL": {"time": 0.24, "average": 46.6, "scores": (43.0, 45.0, 46.9, 36.1, 46.5, 28.5, 81.3)},
    "GQA-8-XXL": {"time": 0.28, "average": 47.1, "scores": (43.5, 45.4, 47.7, 36.3, 47.2, 28.4, 81.6)},
}
# Figure 4: T5-Large -> MQA by each method, alpha 0.05, on three tasks.
FIG4_TASKS = (("cnn_dailymail", "CNN R1", "ROUGE-1"), ("multi_news", "MultiNews R1", "ROUGE-1"),
              ("trivia_qa", "TriviaQA F1", "F1"))  # fmt: skip
FIG4_METHODS = conversion.paper()  # mean, first, random: the conversion methods marked as the paper's
# Beyond the paper: the Fig. 4 sweeps' ``methods`` parameter may name any method of the registry, or
# "<method>-calibrated" (that method calibrated on CALIBRATION_BATCHES batches of the run's task).
CALIBRATION_BATCHES = 4


def method_fields(name: str) -> tuple[str, int]:
    """A Fig. 4 method name as ``(convert method, calibration batches)``: ``svd-calibrated`` ->
    ``("svd", CALIBRATION_BATCHES)``, ``mean`` -> ``("mean", 0)``."""
    method, calibrated = conversion.variant(name)
    return method.name, CALIBRATION_BATCHES if calibrated else 0


def conversion_methods(value: str) -> tuple[str, ...]:
    """A Fig. 4 sweep's ``methods`` parameter: ``paper`` (the paper's three), ``all`` (every method
    of ``gqa_jax.conversion`` and the calibrated variant of each that calibrates) or a
    comma-separated list of those names."""
    known = conversion.variants()
    if value == "paper":
        return FIG4_METHODS
    if value == "all":
        return known
    chosen = tuple(m.strip() for m in str(value).split(",") if m.strip())
    unknown = [m for m in chosen if m not in known]
    if unknown or not chosen:
        raise ValueError(
            f"methods={value!r}: name 'paper', 'all' or some of {', '.join(known)} (comma-separated)"
        )
    return chosen


# Figure 5: XXL MQA and GQA-8 at these uptraining fractions (0: converted, not uptrained).
FIG5_ALPHAS = (0.0, 0.05, 0.1)
# Figure 6: XXL time per sample against the number of groups, input 2048 / output 512.
FIG6_GROUPS = (1, 4, 8, 16, 32, 64)
FIG6_LENGTHS = (2048, 512)
# Beyond the paper: Fig. 6's lines per KV cache, "float" (the model's dtype, the paper's) and the
# quantized caches of gqa_jax.kv_quant (a 1-byte element and a float32 scale per token and head).
QUANTIZED_CACHES = ("int8", "float8_e4m3fn", "float8_e5m2")  # kv_quant.QMAX's keys (a test checks)


def fig6_caches(value: str) -> tuple[str, ...]:
    """A Fig. 6 sweep's ``caches`` parameter: a comma-separated list from ``float`` and the
    quantized cache dtypes (``float,int8``: the float cache's line and the int8 cache's)."""
    known = ("float", *QUANTIZED_CACHES)
    chosen = tuple(dict.fromkeys(c.strip() for c in str(value).split(",") if c.strip()))
    unknown = [c for c in chosen if c not in known]
    if unknown or not chosen:
        raise ValueError(f"caches={value!r}: name some of {', '.join(known)} (comma-separated)")
    return chosen


def fig6_cache_run(cache: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """One of Fig. 6's caches as ``(run name suffix, time options, report tags)``: ``float`` has
    none (the paper's runs, named as before); a quantized one ``_int8``, ``cache_dtype``, ``cache``."""
    if cache == "float":
        return "", {}, {}
    return f"_{cache}", {"cache_dtype": cache}, {"cache": cache}


def table1_paper() -> dict[str, Any]:
    """``Sweep.paper`` of Table 1 (``docs/experiments.md`` has the schema)."""
    tasks = [list(t) for t in TABLE1_TASKS]
    rows = {
        model: {"time": r["time"], "average": r["average"],
                "scores": {t[0]: s for t, s in zip(TABLE1_TASKS, r["scores"], strict=True)}}
        for model, r in TABLE1.items()
    }  # fmt: skip
    return {"tasks": tasks, "rows": rows}


def config(name: str, variant: str = "") -> str:
    """The path of the shipped ``configs/<name>.py`` (with ``:variant``), absolute: commands work
    from anywhere."""
    return str(shipped.folder("configs") / f"{name}.py") + (f":{variant}" if variant else "")
