"""Builders of the runs the sweep files list: one function per pipeline stage, each taking the
paper's settings from ``gqa_jax.experiments.paper`` so a sweep file states only what varies."""

from __future__ import annotations

from typing import Any

from gqa_jax.config import OUR_DECODE, decode_name, decode_switches
from gqa_jax.experiments import paper
from gqa_jax.experiments.sweep import Run


def _data(params: dict[str, Any]) -> dict[str, Any]:
    """Fields every train run takes from the sweep's PARAMS (None: the config's default)."""
    return {k: params.get(k) for k in ("data_dir", "vocab")}


def uptrain(
    name: str,
    source: str,
    kv: int,
    params: dict[str, Any],
    *,
    method: str = "mean",
    alpha: float = paper.ALPHA,
    original_steps: int = paper.T5_1_1_PRETRAIN_STEPS,
    deps: tuple[str, ...] = (),
    seed: int = 0,
    tags: dict[str, Any] | None = None,
    **fields: Any,
) -> Run:
    """Convert ``source`` (MHA) to ``kv`` K/V heads by ``method`` (``svd-calibrated``: svd on
    calibration batches, ``paper.method_fields``) and continue pre-training for
    ``round(alpha x original_steps)`` steps of span corruption (T5's recipe)."""
    method, batches = paper.method_fields(method)
    variant = f"source={source},kv={kv},method={method},alpha={alpha},original_steps={original_steps}"
    variant += f",calibration={batches}" if batches else ""
    args = {"config": paper.config("uptrain", variant), **paper.UPTRAIN, "seed": seed,
            **_data(params), **fields}  # fmt: skip
    return Run(name, "uptrain", args, deps, tags or {})


def convert(
    name: str,
    source: str,
    kv: int,
    *,
    method: str = "mean",
    deps: tuple[str, ...] = (),
    seed: int = 0,
    tags: dict[str, Any] | None = None,
) -> Run:
    """Mean-pool (or ``method``) ``source``'s K/V heads to ``kv``, without uptraining (alpha 0)."""
    args = {"src": source, "num_kv_heads": kv, "method": method, "seed": seed}
    return Run(name, "convert", args, deps, tags or {})


def finetune(
    name: str,
    init: str,
    task: str,
    params: dict[str, Any],
    *,
    seed: int = 0,
    deps: tuple[str, ...] = (),
    tags: dict[str, Any] | None = None,
    **fields: Any,
) -> Run:
    """Fine-tune ``init`` on ``task`` with the paper's settings (constant lr 0.001, batch 128,
    dropout 0.1, the task's lengths, the best dev checkpoint kept as best_model/)."""
    args = {"config": paper.config("finetune", f"task={task},init={init}"), "seed": seed,
            "num_train_steps": params.get("finetune_steps", paper.FINETUNE_STEPS),
            "eval_every": params.get("eval_every", paper.EVAL_EVERY), **paper.FINETUNE, **_data(params),
            **fields}  # fmt: skip
    return Run(name, "finetune", args, deps, tags or {})


def evaluate(
    name: str,
    model: str,
    task: str,
    params: dict[str, Any],
    *,
    split: str = "validation",
    deps: tuple[str, ...] = (),
    tags: dict[str, Any] | None = None,
    **options: Any,
) -> Run:
    """Score ``model`` on ``task``'s ``split`` (the paper reports dev sets) by greedy decoding."""
    args = {"model": model, "task": task, "split": split, **_data(params), **options}
    return Run(name, "evaluate", args, deps, tags or {})


def time(
    name: str,
    preset: str,
    kv: int | None,
    input_len: int,
    output_len: int,
    *,
    batch: str | int = "auto",
    deps: tuple[str, ...] = (),
    tags: dict[str, Any] | None = None,
    predict: str | None = None,
    mesh: str = "auto",
    decode: str = OUR_DECODE,
    **options: Any,
) -> Run:
    """Time per sample of greedy decoding at these lengths on random weights (EOS disabled), the
    batch the largest that fits up to 32 per device (``auto``) or a given one. ``predict`` (a TPU
    slice, ``v4:2x2x2``): predicted for it from its compiler instead (``time --predict``, on
    ``mesh``: auto tries every split), in a run of its own (``NAME_predicted_v4-2x2x2``, tagged
    ``predicted``) beside a measured one. ``decode``: the paper's decode or some of its switches
    instead of ours (``config.decode_switches``; an instrument for its timings), in a run of its own
    (``NAME_decode-paper``, tagged ``decode``)."""
    args = {"preset": preset, "num_kv_heads": kv, "input_len": input_len, "output_len": output_len,
            "batch": batch, **options}  # fmt: skip
    decode = decode_name(decode_switches(decode))
    if decode != OUR_DECODE:
        name, args = f"{name}_decode-{decode.replace('+', '-')}", {**args, "decode": decode}
        tags = {**(tags or {}), "decode": decode}
    if predict:
        name = f"{name}_predicted_{predict.replace(':', '-')}"
        args = {**args, "predict": predict, **({} if mesh == "auto" else {"mesh": mesh})}
        tags = {**(tags or {}), "predicted": predict}
    elif mesh != "auto":
        raise ValueError(f"mesh={mesh!r} applies to predicted time runs only (set predict)")
    return Run(name, "time", args, deps, tags or {})


def finetune_and_evaluate(
    key: str,
    init: str,
    task: str,
    params: dict[str, Any],
    *,
    seed: int = 0,
    deps: tuple[str, ...] = (),
    tags: dict[str, Any] | None = None,
    finetune_fields: dict[str, Any] | None = None,
    evaluate_options: dict[str, Any] | None = None,
) -> list[Run]:
    """``ft_<key>_<task>_s<seed>`` (fine-tune ``init``) and ``eval_...`` (its best dev checkpoint on
    the dev split): the pair every quality number of the paper comes from. ``finetune_fields`` /
    ``evaluate_options``: what a sweep sets beyond the paper's settings (the mini's lengths)."""
    ft = f"ft_{key}_{task}_s{seed}"
    tags = {**(tags or {}), "task": task, "seed": seed}
    return [
        finetune(ft, init, task, params, seed=seed, deps=deps, tags=tags, **(finetune_fields or {})),
        evaluate(
            f"eval_{key}_{task}_s{seed}",
            f"{{run:{ft}}}/best_model",
            task,
            params,
            deps=(ft,),
            tags=tags,
            **(evaluate_options or {}),
        ),
    ]
