"""Training core: ``TrainState``, the loss, Adafactor, schedules, and jitted ``train_step`` / ``eval_step``.

Loss. Token cross-entropy over real target tokens (``decoder_loss_weights`` 1, padding 0) plus
T5X's z-loss ``z_loss * logsumexp(logits)^2`` per token (1e-4 keeps the softmax normalizer near
1, which guards bfloat16 logits against drift). Normalization: both are summed over tokens and
divided by the number of real target tokens of the *whole* batch (all micro-batches together,
T5X's ``NUM_REAL_TARGET_TOKENS``), so gradient accumulation gives the same update as one big
batch, and a batch's loss does not depend on how many padding tokens it has. Reported ``loss``
is the cross-entropy alone (per token, natural log); ``z_loss`` is reported separately.

Optimizer: optax Adafactor as T5 configures it: factored second moments, decay rate 0.8,
update clipping 1.0, updates scaled by the parameter's RMS, no momentum, no weight decay.

Schedules (``make_schedule``):
  * ``rsqrt``: T5 pre-training, ``lr = 1 / sqrt(max(step + offset, warmup_steps))`` (0.01 for
    the first 10k steps, then inverse square root decay);
  * uptraining continues that schedule from the source checkpoint's step: ``offset`` = its step;
  * ``constant``: fine-tuning at 0.001.

``train_step(graphdef, state, batch)`` is pure and jitted with the state donated; dropout keys
come from the state's key folded with the step (and the micro-batch), so a resumed run draws the
same dropout masks as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from gqa_jax.config import ModelConfig
from gqa_jax.model import T5

Array = jax.Array
Batch = Mapping[str, Array]

Z_LOSS = 1e-4
T5_WARMUP_STEPS = 10_000
FINETUNE_LR = 1e-3


@flax.struct.dataclass
class TrainState:
    """Everything a step reads and writes: the step, parameters, optimizer state, PRNG key data."""

    step: Array  # int32 []
    params: Any  # nested dict of arrays (nnx.to_pure_dict of the model's Params)
    opt_state: Any
    rng: Array  # uint32 key data (jax.random.key_data), so checkpoints hold plain arrays


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """The schedule and Adafactor settings (T5's defaults)."""

    schedule: str = "rsqrt"  # "rsqrt" | "constant"
    learning_rate: float = FINETUNE_LR  # the "constant" schedule's rate (rsqrt has none)
    warmup_steps: int = T5_WARMUP_STEPS
    offset: int = 0  # uptraining: the source checkpoint's step
    decay_rate: float = 0.8
    clipping_threshold: float = 1.0
    multiply_by_parameter_scale: bool = True


def make_schedule(cfg: OptimizerConfig) -> Callable[[Array], Array]:
    """``step -> learning rate`` (see the module docstring)."""
    if cfg.schedule == "rsqrt":
        if cfg.warmup_steps < 1:
            raise ValueError(f"rsqrt schedule needs warmup_steps >= 1, got {cfg.warmup_steps}")

        def rsqrt(step: Array) -> Array:
            return jax.lax.rsqrt(jnp.maximum(step + cfg.offset, cfg.warmup_steps).astype(jnp.float32))

        return rsqrt
    if cfg.schedule == "constant":
        if cfg.learning_rate <= 0:
            raise ValueError(f"constant schedule needs learning_rate > 0, got {cfg.learning_rate}")
        return lambda step: jnp.full((), cfg.learning_rate, jnp.float32)
    raise ValueError(f"unknown schedule {cfg.schedule!r}; use 'rsqrt' (pre-/uptraining) or 'constant'")


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """Adafactor as T5 uses it, with ``make_schedule(cfg)``."""
    return optax.adafactor(
        learning_rate=make_schedule(cfg),
        decay_rate=cfg.decay_rate,
        clipping_threshold=cfg.clipping_threshold,
        multiply_by_parameter_scale=cfg.multiply_by_parameter_scale,
        momentum=None,
        factored=True,
    )


def init_state(model: T5, optimizer: optax.GradientTransformation, seed: int, step: int = 0) -> TrainState:
    """A fresh state around ``model``'s parameters."""
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return TrainState(
        step=jnp.asarray(step, jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=jax.random.key_data(jax.random.key(seed, impl="rbg")),
    )


def cross_entropy(logits: Array, targets: Array, weights: Array, z_loss: float = Z_LOSS) -> dict[str, Array]:
    """Token sums: ``logits [B, T, V]`` (float32), ``targets [B, T]``, ``weights [B, T]`` ->
    ``{"ce", "z", "correct", "tokens"}`` each summed over weighted tokens (not yet normalized)."""
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [B, T]
    ce = lse - target_logit
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return {
        "ce": jnp.sum(ce * weights),
        "z": z_loss * jnp.sum(jnp.square(lse) * weights),
        "correct": jnp.sum(correct * weights),
        "tokens": jnp.sum(weights),
    }


def _forward_sums(model: T5, batch: Batch, rngs: nnx.Rngs | None, z_loss: float) -> dict[str, Array]:
    packed = "encoder_segment_ids" in batch
    logits = model(
        batch["encoder_input_tokens"],
        batch["decoder_input_tokens"],
        encoder_segment_ids=batch["encoder_segment_ids"] if packed else None,
        decoder_segment_ids=batch["decoder_segment_ids"] if packed else None,
        rngs=rngs,
    )
    return cross_entropy(logits, batch["decoder_target_tokens"], batch["decoder_loss_weights"], z_loss)


def _split_micro(batch: Batch, num_microbatches: int) -> dict[str, Array]:
    """``[B, ...]`` -> ``[num_microbatches, B / num_microbatches, ...]``."""
    out = {}
    for key, value in batch.items():
        B = value.shape[0]
        if B % num_microbatches:
            raise ValueError(f"batch size {B} is not divisible by num_microbatches {num_microbatches}")
        out[key] = value.reshape(num_microbatches, B // num_microbatches, *value.shape[1:])
    return out


def _train_step(
    graphdef: Any,
    optimizer: optax.GradientTransformation,
    state: TrainState,
    batch: Batch,
    *,
    num_microbatches: int,
    z_loss: float,
    dropout: bool,
) -> tuple[TrainState, dict[str, Array]]:
    total_tokens = jnp.maximum(jnp.sum(batch["decoder_loss_weights"]), 1.0)
    step_key = jax.random.fold_in(jax.random.wrap_key_data(state.rng, impl="rbg"), state.step)

    def loss_fn(params: Any, micro: Batch, key: Array) -> tuple[Array, dict[str, Array]]:
        model = nnx.merge(graphdef, params)
        sums = _forward_sums(model, micro, nnx.Rngs(dropout=key) if dropout else None, z_loss)
        return (sums["ce"] + sums["z"]) / total_tokens, sums

    grad_fn = jax.grad(loss_fn, has_aux=True)
    micro = _split_micro(batch, num_microbatches)

    def accumulate(carry: tuple[Any, dict[str, Array]], xs: tuple[int, Batch]) -> tuple[Any, None]:
        grads, sums = carry
        i, mb = xs
        g, s = grad_fn(state.params, mb, jax.random.fold_in(step_key, i))
        grads = jax.tree.map(jnp.add, grads, g)
        sums = {k: sums[k] + s[k] for k in sums}
        return (grads, sums), None

    zero_grads = jax.tree.map(jnp.zeros_like, state.params)
    zero_sums = {k: jnp.zeros((), jnp.float32) for k in ("ce", "z", "correct", "tokens")}
    if num_microbatches == 1:
        grads, sums = grad_fn(state.params, batch, jax.random.fold_in(step_key, 0))
    else:
        (grads, sums), _ = jax.lax.scan(
            accumulate, (zero_grads, zero_sums), (jnp.arange(num_microbatches), micro)
        )
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": sums["ce"] / total_tokens,
        "z_loss": sums["z"] / total_tokens,
        "accuracy": sums["correct"] / total_tokens,
        "tokens": sums["tokens"],
        "grad_norm": optax.tree.norm(grads),
        "param_norm": optax.tree.norm(params),
    }
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


def make_train_step(
    graphdef: Any,
    optimizer: optax.GradientTransformation,
    *,
    num_microbatches: int = 1,
    z_loss: float = Z_LOSS,
    dropout: bool = True,
    donate: bool = True,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, Array]]]:
    """The jitted ``(state, batch) -> (new state, metrics)`` (state donated unless ``donate=False``).

    ``num_microbatches`` splits the batch and sums the gradients (same update, less memory).
    ``dropout`` uses the model config's rate (T5 fine-tuning: 0.1; pre-training: 0)."""
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    fn = functools.partial(
        _train_step, graphdef, optimizer, num_microbatches=num_microbatches, z_loss=z_loss, dropout=dropout
    )
    return jax.jit(fn, donate_argnums=(0,) if donate else ())


def make_eval_step(graphdef: Any, *, z_loss: float = Z_LOSS) -> Callable[[Any, Batch], dict[str, Array]]:
    """The jitted ``(params, batch) -> token sums`` (no dropout), for teacher-forced dev loss."""

    def eval_step(params: Any, batch: Batch) -> dict[str, Array]:
        return _forward_sums(nnx.merge(graphdef, params), batch, None, z_loss)

    return jax.jit(eval_step)


def split_model(model: T5) -> tuple[Any, Any]:
    """``(graphdef, params pure dict)``: the static structure and the trainable arrays."""
    graphdef, state = nnx.split(model, nnx.Param)
    return graphdef, nnx.to_pure_dict(state)


# ============================================================================================
# The one train() loop: pre-training, uptraining and fine-tuning, chosen by the config.
# ============================================================================================
#
# Workdir layout:
#   config.json          the resolved run config (a restart must match it, see _check_workdir)
#   model_config.json    the model's ModelConfig
#   conversion.json      uptraining: the MHA -> GQA/MQA conversion manifest
#   metrics.jsonl        one line per logged step (train/...) and per evaluation (eval/...)
#   tensorboard/         the same scalars as TensorBoard events
#   checkpoints/<step>/  orbax: the TrainState ("state") and the input position ("data")
#   decodes/step_<n>.jsonl  evaluation decodes with their references
#   model/               the final parameters as a gqa_jax checkpoint (for convert / decode / fine-tune)
#   summary.json         final step, best evaluation step and score
#   nan_step_<n>.json    written when a loss goes NaN/inf: the batch's statistics

RECIPES = ("pretrain", "uptrain", "finetune")
# Config fields a restart may change (they do not change what is computed, or only extend it).
RESTART_MAY_CHANGE = frozenset(
    {
        "num_train_steps",
        "log_every",
        "checkpoint_every",
        "eval_every",
        "eval_at_start",
        "keep_checkpoints",
        "progress",
        "mesh",  # orbax restores into whatever shardings the new mesh gives
    }
)


def _log(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)


def _config_dict(config: Any) -> dict[str, Any]:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def _check_workdir(workdir: Any, config: Any) -> None:
    """A workdir belongs to one run: refuse a restart with a config that computes something else."""
    import json

    stored_file = workdir / "config.json"
    resolved = _config_dict(config)
    if stored_file.is_file():
        stored = _flat(json.loads(stored_file.read_text()))
        new = _flat(json.loads(json.dumps(resolved, default=str)))
        diff = sorted(
            k for k in set(stored) | set(new) if stored.get(k) != new.get(k) and k not in RESTART_MAY_CHANGE
        )
        if diff:
            details = "; ".join(f"{k}: {stored.get(k)!r} -> {new.get(k)!r}" for k in diff[:8])
            raise ValueError(
                f"workdir {workdir} holds a run with a different config ({details}); resume it with the "
                "same config, or start a new --workdir"
            )


def _write_config(workdir: Any, config: Any) -> None:
    import json

    workdir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_config_dict(config), indent=2, sort_keys=True, default=str) + "\n"
    (workdir / "config.json").write_text(text)


def check_config(config: Any) -> None:
    """Clear errors for a config that cannot run (before anything is built or written)."""
    from gqa_jax.data import tasks as tasks_lib

    if config.recipe not in RECIPES:
        raise ValueError(f"config.recipe must be one of {', '.join(RECIPES)}, got {config.recipe!r}")
    task = tasks_lib.get_task(config.task)
    if config.recipe == "pretrain" and not task.span_corruption:
        raise ValueError(f"pre-training reads a span-corruption task, and {task.name} is not one")
    if config.recipe == "uptrain":
        if not task.span_corruption:
            raise ValueError(f"uptraining continues span corruption; task {task.name} is not a corpus")
        if not config.uptrain.source:
            raise ValueError("uptraining needs config.uptrain.source (an MHA checkpoint to convert)")
        if not 0 < config.uptrain.alpha <= 1:
            raise ValueError(f"config.uptrain.alpha must be in (0, 1], got {config.uptrain.alpha}")
        if config.uptrain.original_steps < 1:
            raise ValueError("config.uptrain.original_steps (the source's pre-training steps) must be >= 1")
    if config.recipe == "finetune" and task.span_corruption:
        raise ValueError(f"fine-tuning reads a sequence-to-sequence task; {task.name} is span corruption")
    for name in ("batch_size", "num_microbatches", "checkpoint_every", "log_every"):
        if int(config[name]) < 1:
            raise ValueError(f"config.{name} must be >= 1, got {config[name]}")
    if config.batch_size % config.num_microbatches:
        raise ValueError(
            f"config.batch_size {config.batch_size} is not divisible by "
            f"num_microbatches {config.num_microbatches}"
        )
    if config.get("mesh"):
        from gqa_jax import sharding

        data, _ = sharding.parse_mesh_shape(config.mesh)
        for name in ("batch_size", "eval_batch_size"):
            if int(config[name]) % data:
                raise ValueError(
                    f"config.{name}={config[name]} is not divisible by the data axis ({data}) of "
                    f"config.mesh={config.mesh!r}: choose a multiple of {data}"
                )
        if (config.batch_size // config.num_microbatches) % data:
            raise ValueError(
                f"micro-batches of {config.batch_size // config.num_microbatches} rows do not split over "
                f"the data axis ({data}) of config.mesh={config.mesh!r}: lower num_microbatches"
            )
    elif jax.process_count() > 1:
        raise ValueError(
            f"this is one of {jax.process_count()} processes, but config.mesh is empty: set a mesh over "
            "all their devices, e.g. --config.mesh=2x4"
        )
    if config.recipe != "uptrain" and config.num_train_steps < 1:
        raise ValueError(f"config.num_train_steps must be >= 1, got {config.num_train_steps}")


def num_steps(config: Any) -> int:
    """Steps of this run: ``round(alpha x original_steps)`` when uptraining, else num_train_steps."""
    if config.recipe == "uptrain":
        return max(1, round(config.uptrain.alpha * config.uptrain.original_steps))
    return int(config.num_train_steps)


def _load_vocab(config: Any, task: Any, data_dir: str) -> Any:
    from gqa_jax.data import stdlib_suite
    from gqa_jax.data import vocab as vocab_lib

    if config.vocab:
        return vocab_lib.load_vocab(config.vocab)
    if task.suite:
        return stdlib_suite.suite_vocab(data_dir)
    raise ValueError(f"task {task.name} needs config.vocab: the SentencePiece model of the checkpoint (T5's)")


def _model_config(config: Any, vocab: Any) -> Any:
    from gqa_jax.config import preset

    overrides = {k: v for k, v in _config_dict(config.model).items() if k != "preset" and v is not None}
    overrides.setdefault("vocab_size", vocab.vocab_size)
    if "grouped_attentions" in overrides:
        overrides["grouped_attentions"] = tuple(overrides["grouped_attentions"])
    return preset(config.model.preset, **overrides)


def _init_model(config: Any, vocab: Any, workdir: Any) -> tuple[Any, OptimizerConfig, dict[str, Any]]:
    """The starting model (a ``T5``, or its ``ModelConfig`` when it starts from random weights, so
    a sharded run can create them sharded), the optimizer settings and what was done."""
    import json

    from gqa_jax import convert

    info: dict[str, Any] = {"recipe": config.recipe}
    opt = config.optimizer
    if config.recipe == "pretrain":
        return _model_config(config, vocab), OptimizerConfig("rsqrt", warmup_steps=opt.warmup_steps), info
    if config.recipe == "uptrain":
        up = config.uptrain
        source, source_cfg, kind = convert.load_source(up.source)
        attentions = tuple(up.attentions) if up.attentions else convert.DEFAULT_ATTENTIONS
        params, cfg, manifest = convert.to_grouped(
            source, source_cfg, up.num_kv_heads, up.method, attentions=attentions, seed=config.seed
        )
        manifest["source_path"] = str(up.source)
        if jax.process_index() == 0:
            (workdir / "conversion.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        model = convert.to_model(params, cfg.replace(dropout_rate=config.model.dropout_rate or 0.0))
        offset = up.source_step if up.source_step is not None else up.original_steps
        info |= {"source": str(up.source), "source_kind": kind, "schedule_offset": int(offset),
                 "num_kv_heads": up.num_kv_heads, "method": up.method}  # fmt: skip
        return model, OptimizerConfig("rsqrt", warmup_steps=opt.warmup_steps, offset=int(offset)), info
    # finetune
    if config.init_from:
        source, source_cfg, kind = convert.load_source(config.init_from)
        cfg = source_cfg.replace(dropout_rate=config.model.dropout_rate)
        model = convert.to_model(nnx.to_pure_dict(nnx.state(source, nnx.Param)), cfg)
        info |= {"init_from": str(config.init_from), "source_kind": kind}
    else:
        model = _model_config(config, vocab)
        info["init_from"] = None
    return model, OptimizerConfig("constant", learning_rate=opt.learning_rate), info


def _checkpoint_manager(workdir: Any, keep: int, best: bool) -> Any:
    import orbax.checkpoint as ocp
    from orbax.checkpoint import checkpoint_managers as cm

    policies = [cm.LatestN(n=keep)]
    if best:  # also keep the best checkpoint by the task's headline metric
        policies.append(cm.BestN(get_metric_fn=lambda m: m["score"], reverse=False, n=1))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=cm.AnyPreservationPolicy(policies),
        enable_async_checkpointing=True,
        create=True,
    )
    return ocp.CheckpointManager(workdir / "checkpoints", options=options, item_names=("state", "data"))


def _restore(manager: Any, state: TrainState, workdir: Any) -> tuple[TrainState, Any]:
    """The newest readable checkpoint -> ``(state, data position)``; ``(state, None)`` when none.

    A checkpoint that fails to restore (corrupt, half-written) is moved aside to
    ``workdir/corrupt_checkpoints/`` with a warning (never deleted), and the previous one is tried.
    """
    import shutil
    import time
    import warnings

    import orbax.checkpoint as ocp

    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            restored = manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()
                ),
            )
            return restored["state"], restored["data"]
        except Exception as err:  # any failure to read it back means: do not trust it
            aside = workdir / "corrupt_checkpoints" / f"{step}-{int(time.time())}"
            aside.parent.mkdir(parents=True, exist_ok=True)
            warnings.warn(
                f"checkpoint {step} in {workdir / 'checkpoints'} cannot be restored ({type(err).__name__}: "
                f"{str(err)[:200]}); moved it to {aside} and trying the previous one",
                stacklevel=2,
            )
            shutil.move(str(workdir / "checkpoints" / str(step)), str(aside))
            manager.reload()
    return state, None


def _truncate_metrics(workdir: Any, step: int) -> None:
    """On resume, move metric lines logged after the restored step to metrics.discarded.jsonl."""
    import json

    file = workdir / "metrics.jsonl"
    if not file.is_file():
        return
    keep, drop = [], []
    for line in file.read_text().splitlines():
        try:
            later = int(json.loads(line).get("step", 0)) > step
        except (ValueError, AttributeError):
            later = True  # a half-written line from the killed run
        (drop if later else keep).append(line)
    if drop:
        with open(workdir / "metrics.discarded.jsonl", "a") as f:
            f.write("\n".join(drop) + "\n")
        tmp = file.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        tmp.replace(file)


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
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Score ``model`` (a ``T5`` or its ``(graphdef, params)``) on ``task``: greedy decodes + the
    task's metric, or, for span-corruption corpora, the teacher-forced loss. Returns ``(scores,
    decoded examples)``. With a ``mesh`` the params stay sharded and every process evaluates the
    same examples (rows over the data axis)."""
    from gqa_jax import decoding, metrics, sharding
    from gqa_jax.data import pipeline as pipeline_lib
    from gqa_jax.data import tasks as tasks_lib

    source = tasks_lib.open_split(task, split, data_dir) if source is None else source
    source = _Head(source, num_examples)
    batch_size = min(batch_size, len(source))
    if mesh is not None:  # whole rows per data shard (the pipeline pads the last batch)
        batch_size = -(-batch_size // mesh.shape["data"]) * mesh.shape["data"]
    p = pipeline_lib.make_pipeline(
        task, split, vocab, batch_size=batch_size, source=source, shuffle=False, repeat=False,
        process_index=0, process_count=1, input_length=input_length, target_length=target_length,
    )  # fmt: skip
    if task.metric is None:
        graphdef, params = split_model(model) if isinstance(model, T5) else model
        eval_step = make_eval_step(graphdef)
        sums = {"ce": 0.0, "z": 0.0, "correct": 0.0, "tokens": 0.0}
        for batch in p.iterator():
            batch = {k: v for k, v in batch.items() if k != "example_index"}
            if mesh is not None:
                batch = sharding.global_batch(batch, mesh, identical=True)
            out = sharding.to_host(eval_step(params, batch))
            sums = {k: sums[k] + float(out[k]) for k in sums}
        tokens = max(sums["tokens"], 1.0)
        return {"loss": sums["ce"] / tokens, "accuracy": sums["correct"] / tokens}, []
    predictions, references, inputs = [], [], []
    for batch in p.iterator():
        ids = batch["encoder_input_tokens"]
        if mesh is not None:
            ids = sharding.global_batch({"ids": ids}, mesh, identical=True)["ids"]
        result = decoding.greedy_decode(model, ids, p.target_length, mesh=mesh)
        tokens = sharding.to_host(result.tokens)
        for row, index in zip(tokens, batch["example_index"], strict=True):
            if index < 0:
                continue
            example = source[int(index)]
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


def _batch_stats(batch: Mapping[str, Any]) -> dict[str, Any]:
    """What a NaN post-mortem wants to know about the batch (no token ids are needed to reproduce:
    the data position is in the checkpoint)."""
    import numpy as np

    out: dict[str, Any] = {}
    for key, value in batch.items():
        v = np.asarray(value)
        out[key] = {
            "shape": list(v.shape),
            "min": float(v.min()),
            "max": float(v.max()),
            "sum": float(v.sum()),
        }
    enc, tgt = np.asarray(batch["encoder_input_tokens"]), np.asarray(batch["decoder_target_tokens"])
    out["input_tokens_per_row"] = (enc != 0).sum(axis=1).tolist()
    out["target_tokens_per_row"] = (tgt != 0).sum(axis=1).tolist()
    return out


def _stop_on_nan(workdir: Any, step: int, m: Mapping[str, Any], batch: Batch, last: int | None) -> None:
    """Write ``nan_step_<step>.json`` (metrics + batch statistics) and raise FloatingPointError."""
    import json

    file = workdir / f"nan_step_{step}.json"
    report = {
        "step": step,
        "metrics": {k: float(v) for k, v in m.items()},
        "batch": _batch_stats(batch),
        "last_checkpoint": last,
    }
    if jax.process_index() == 0:
        file.write_text(json.dumps(report, indent=2) + "\n")
    raise FloatingPointError(
        f"loss {float(m['loss'])} / grad norm {float(m['grad_norm'])} at step {step}: stopped; the batch's "
        f"statistics are in {file}; the last good checkpoint (step {last}) is untouched"
    )


def train(config: Any, workdir: Any) -> dict[str, Any]:
    """Run (or resume) the recipe ``config.recipe`` in ``workdir``; returns the summary dict.

    A workdir with checkpoints resumes from the newest readable one (model, optimizer, data
    position, PRNG) and continues exactly as if never stopped.
    """
    import json
    import math
    import time
    from pathlib import Path

    import numpy as np
    import orbax.checkpoint as ocp
    from tqdm import tqdm

    from gqa_jax import checkpoints, metrics, sharding
    from gqa_jax.data import pipeline as pipeline_lib
    from gqa_jax.data import tasks as tasks_lib

    check_config(config)
    workdir = Path(workdir).expanduser().absolute()
    task = tasks_lib.get_task(config.task)
    data_dir = config.data_dir or tasks_lib.default_data_dir()
    vocab = _load_vocab(config, task, data_dir)
    _check_workdir(workdir, config)
    total = num_steps(config)

    is_main = jax.process_index() == 0  # only process 0 writes logs, configs and reports
    mesh = sharding.make_mesh(config.mesh) if config.mesh else None
    workdir.mkdir(parents=True, exist_ok=True)
    model, opt_cfg, info = _init_model(config, vocab, workdir)
    model_cfg = model if isinstance(model, ModelConfig) else model.config
    if model_cfg.vocab_size < vocab.vocab_size:
        raise ValueError(
            f"the model's vocab_size {model_cfg.vocab_size} is smaller than the vocabulary's "
            f"{vocab.vocab_size}: use the vocabulary the checkpoint was trained with"
        )
    optimizer = make_optimizer(opt_cfg)
    schedule = make_schedule(opt_cfg)
    shardings = None
    if mesh is not None and isinstance(model, ModelConfig):  # created sharded, never on one host
        state, shardings, graphdef, replicated = sharding.init_sharded_state(
            model, optimizer, mesh, config.seed
        )
    else:
        model = T5(model, rngs=nnx.Rngs(config.seed)) if isinstance(model, ModelConfig) else model
        graphdef, _ = split_model(model)
        state = init_state(model, optimizer, config.seed)
        if mesh is not None:
            state, shardings = sharding.shard_state(state, mesh)
            _, replicated = sharding.param_shardings(state.params, mesh)
    del model
    if mesh is not None and is_main:
        _log(f"mesh {dict(mesh.shape)} over {jax.process_count()} process(es): "
             + sharding.replication_report(replicated))  # fmt: skip
    if is_main:  # after the model exists: a failed start leaves no claim on the workdir
        _write_config(workdir, config)
        (workdir / "model_config.json").write_text(model_cfg.to_json() + "\n")

    manager = _checkpoint_manager(workdir, config.keep_checkpoints, best=task.metric is not None)
    state, data_state = _restore(manager, state, workdir)
    start = int(state.step)
    if start:
        _log(f"resuming {workdir} from step {start}")
        if is_main:
            _truncate_metrics(workdir, start)
    if start >= total:
        _log(f"{workdir} already at step {start} >= {total}: nothing to train")

    # Each process reads its own slice of every batch (processes holding the same rows of the
    # mesh read the same slice).
    slice_index, slice_count = sharding.process_data_slice(mesh) if mesh is not None else (0, 1)
    train_pipe = pipeline_lib.make_pipeline(
        task, "train", vocab, batch_size=config.batch_size, seed=config.seed, data_dir=data_dir,
        pack=config.pack, input_length=config.input_length, target_length=config.target_length,
        process_index=slice_index, process_count=slice_count,
    )  # fmt: skip
    batches = train_pipe.iterator(state=sharding.own_data_state(data_state))
    dropout = config.recipe == "finetune" and (config.model.dropout_rate or 0) > 0
    if mesh is None:
        step_fn = make_train_step(
            graphdef, optimizer, num_microbatches=config.num_microbatches, z_loss=config.z_loss,
            dropout=dropout,
        )  # fmt: skip
    else:
        step_fn = sharding.make_sharded_train_step(
            graphdef, optimizer, mesh, shardings, num_microbatches=config.num_microbatches,
            z_loss=config.z_loss, dropout=dropout,
        )  # fmt: skip
    writer = metrics.MetricWriter(workdir) if is_main else None
    summary: dict[str, Any] = {"steps": total, **info}

    def run_eval(step: int) -> float | None:
        if mesh is None:
            model: Any = nnx.merge(graphdef, jax.device_get(state.params))
        else:  # every process runs the same evaluation on the sharded params
            model = (graphdef, state.params)
        t0 = time.time()
        scores, decodes = evaluate(
            model, task, vocab, num_examples=config.eval_examples, batch_size=config.eval_batch_size,
            data_dir=data_dir, input_length=config.input_length, target_length=config.target_length,
            mesh=mesh,
        )  # fmt: skip
        if writer:
            writer.write(
                step, {f"eval/{k}": v for k, v in scores.items()} | {"eval/seconds": time.time() - t0}
            )
            if decodes:
                metrics.write_decodes(
                    workdir / "decodes" / f"step_{step}.jsonl",
                    [d["input"] for d in decodes], [d["prediction"] for d in decodes],
                    [d["reference"] for d in decodes],
                )  # fmt: skip
        _log(f"step {step}: eval " + ", ".join(f"{k} {v:.4g}" for k, v in scores.items()))
        if task.metric is None:
            return None
        return scores[metrics.PRIMARY[task.metric]]

    def save(step: int, score: float | None) -> None:
        # The device buffers are donated to the next step: one device saves a host copy; on a
        # mesh orbax copies every process's shards to host before save() returns.
        saved = jax.device_get(state) if mesh is None else state
        manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(saved),
                data=ocp.args.JsonSave(sharding.all_data_states(batches.get_state())),
            ),
            metrics=None if score is None else {"score": float(score)},
            force=True,
        )

    bar = tqdm(total=total, initial=start, disable=not (is_main and config.progress), unit="step",
               dynamic_ncols=True)  # fmt: skip
    t_last, tokens_since, steps_since = time.time(), 0.0, 0
    try:
        if config.eval_at_start and start == 0 and config.eval_every >= 0:
            run_eval(0)  # the starting point's score: the baseline fine-tuning must beat
        for step in range(start, total):
            batch = next(batches)  # this process's rows
            state, m = step_fn(state, batch if mesh is None else sharding.global_batch(batch, mesh))
            m = jax.device_get(m)
            done = step + 1
            if not (math.isfinite(float(m["loss"])) and math.isfinite(float(m["grad_norm"]))):
                _stop_on_nan(workdir, done, m, batch, manager.latest_step())
            input_tokens = float(np.sum(batch["encoder_input_tokens"] != 0)) * slice_count  # ~ all rows
            tokens_since += input_tokens + float(m["tokens"])
            steps_since += 1
            bar.update(1)
            if done % config.log_every == 0 or done == total:
                elapsed = max(time.time() - t_last, 1e-9)
                row = {f"train/{k}": float(v) for k, v in m.items()}
                row |= {
                    "train/learning_rate": float(schedule(jnp.asarray(step))),
                    "train/seconds_per_step": elapsed / steps_since,
                    "train/tokens_per_second": tokens_since / elapsed,
                    "train/examples_seen": done * config.batch_size,
                }
                if writer:
                    writer.write(done, row)
                bar.set_postfix(loss=f"{row['train/loss']:.3f}")
                t_last, tokens_since, steps_since = time.time(), 0.0, 0
            score = None
            every = config.eval_every
            if every >= 0 and ((every and done % every == 0) or done == total):
                score = run_eval(done)
            if done % config.checkpoint_every == 0 or done == total or score is not None:
                save(done, score)  # evaluated steps are saved too: the best one is kept
        manager.wait_until_finished()
        summary |= {"final_step": int(state.step)}
        best = manager.best_step() if task.metric is not None else None
        if best is not None:
            summary |= {"best_step": int(best)}
        final_params = jax.device_get(state.params) if mesh is None else sharding.to_host(state.params)
        if is_main:
            final = nnx.merge(graphdef, final_params)
            checkpoints.save(final, workdir / "model", overwrite=True)
            (workdir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return summary
    finally:
        bar.close()
        manager.wait_until_finished()
        manager.close()
        if writer:
            writer.close()
