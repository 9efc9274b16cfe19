"""The train state and what creates it: ``TrainState``, Adafactor with T5's schedules, and the
state's shardings on a mesh.

Optimizer: optax Adafactor as T5 configures it: factored second moments, decay rate 0.8,
update clipping 1.0, updates scaled by the parameter's RMS, no momentum, no weight decay.

Schedules (``make_schedule``):
  * ``rsqrt``: T5 pre-training, ``lr = 1 / sqrt(max(step + offset, warmup_steps))`` (0.01 for
    the first 10k steps, then inverse square root decay);
  * uptraining continues that schedule from the source checkpoint's step: ``offset`` = its step;
  * ``constant``: fine-tuning at 0.001 (the paper's);
  * ``linear``: fine-tuning from ``learning_rate`` at step 0 down to 0 at ``decay_steps`` (the
    run's last step), so the last steps move the weights little (the mini's choice, experiments/mini.py).

Shardings: parameters by the rule table (``gqa_jax.sharding``); optimizer leaves shaped like
their parameter take its sharding, the rest (factored moments, counters) are replicated.
``create_state`` makes a fresh state on a mesh; on a mesh of several devices the initializers
run under ``jax.jit`` with the state's shardings as ``out_shardings``, so no host ever holds the
whole model.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gqa_jax import model as model_lib
from gqa_jax import sharding
from gqa_jax.config import ModelConfig
from gqa_jax.model import T5

Array = jax.Array

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

    schedule: str = "rsqrt"  # "rsqrt" | "constant" | "linear"
    learning_rate: float = FINETUNE_LR  # "constant"'s rate, "linear"'s at step 0 (rsqrt has none)
    decay_steps: int = 0  # "linear": the step at which the rate reaches 0
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
    if cfg.schedule == "linear":
        if cfg.learning_rate <= 0 or cfg.decay_steps < 1:
            raise ValueError(
                f"linear schedule needs learning_rate > 0 and decay_steps >= 1, got {cfg.learning_rate} "
                f"and {cfg.decay_steps}"
            )

        def linear(step: Array) -> Array:
            left = 1.0 - jnp.minimum(step, cfg.decay_steps).astype(jnp.float32) / cfg.decay_steps
            return cfg.learning_rate * left

        return linear
    raise ValueError(
        f"unknown schedule {cfg.schedule!r}; use 'rsqrt' (pre-/uptraining), 'constant' or 'linear' "
        "(fine-tuning)"
    )


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
    return _fresh_state(nnx.to_pure_dict(nnx.state(model, nnx.Param)), optimizer, seed, step)


def _fresh_state(
    params: Any, optimizer: optax.GradientTransformation, seed: int, step: int = 0
) -> TrainState:
    opt_state, rng = _opt_state_and_key(optimizer, params, seed)
    return TrainState(step=jax.device_put(np.int32(step)), params=params, opt_state=opt_state, rng=rng)


@functools.partial(jax.jit, static_argnums=0)
def _opt_state_and_key(optimizer: optax.GradientTransformation, params: Any, seed: Any) -> tuple[Any, Array]:
    """Adafactor's zeroed state and the run's key data in one program: eagerly, each zeros of a
    new shape and each op of the key were a program of its own to compile (about 15 a run). The
    same numbers (zeros and integer key bits)."""
    return optimizer.init(params), jax.random.key_data(jax.random.key(seed, impl="rbg"))


def split_model(model: T5) -> tuple[Any, Any]:
    """``(graphdef, params pure dict)``: the static structure and the trainable arrays."""
    graphdef, state = nnx.split(model, nnx.Param)
    return graphdef, nnx.to_pure_dict(state)


def state_shardings(state: Any, mesh: Mesh, rules: Mapping[str, str | None] = sharding.RULES) -> Any:
    """Shardings of a ``TrainState`` (concrete or abstract, e.g. from ``jax.eval_shape``): params by
    the rules; optimizer leaves shaped like their parameter take its sharding, other leaves
    (factored moments, counters) are replicated."""
    p_shard, _ = sharding.param_shardings(state.params, mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    by_shape: dict[tuple[int, ...], list[NamedSharding]] = {}
    for x, s in zip(jax.tree.leaves(state.params), jax.tree.leaves(p_shard), strict=True):
        by_shape.setdefault(tuple(x.shape), []).append(s)

    def opt_sharding(x: Any) -> NamedSharding:
        cands = by_shape.get(tuple(np.shape(x)), [])
        # same-shape params may differ in spec only where one dim was replicated; take the first
        return cands[0] if cands and len({c.spec for c in cands}) == 1 else replicated

    return TrainState(
        step=replicated,
        params=p_shard,
        opt_state=jax.tree.map(opt_sharding, state.opt_state),
        rng=replicated,
    )


def shard_state(state: Any, mesh: Mesh, rules: Mapping[str, str | None] = sharding.RULES) -> tuple[Any, Any]:
    """Place a host ``TrainState`` on ``mesh``. Returns ``(placed state, its shardings)``."""
    shardings = state_shardings(state, mesh, rules)
    return jax.device_put(state, shardings), shardings


def create_state(
    model: ModelConfig | T5,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    seed: int,
    rules: Mapping[str, str | None] = sharding.RULES,
) -> tuple[TrainState, Any, Any, list[sharding.Replication]]:
    """A train state on ``mesh`` around ``model`` (a ``T5``, or a ``ModelConfig`` for random
    weights from ``seed``). Returns ``(state, its shardings, graphdef, replicated dimensions)``.

    A ``ModelConfig`` on a mesh of several devices is initialized under ``jax.jit`` with the
    state's shardings as ``out_shardings`` (each device computes its own slices); so is the
    optimizer state of a ``T5`` there, whose parameters are placed first (if not already). On one device it
    is initialized eagerly and placed: the jitted initializers round differently (by up to 6e-8),
    and the eager ones give the numbers of every earlier one-device run."""
    if isinstance(model, ModelConfig) and mesh.devices.size > 1:
        config = model

        def init() -> TrainState:
            return init_state(model_lib.build(config, seed=seed), optimizer, seed)

        graphdef, _ = split_model(model_lib.abstract(config))
        abstract = jax.eval_shape(init)
        shardings = state_shardings(abstract, mesh, rules)
        state = jax.jit(init, out_shardings=shardings)()
    elif mesh.devices.size > 1:  # a loaded model (e.g. checkpoints.load_any(mesh=...))
        graphdef, params = split_model(model)
        params = jax.device_put(params, sharding.param_shardings(params, mesh, rules)[0])  # no-op if placed

        def init_from(params: Any) -> TrainState:
            return _fresh_state(params, optimizer, seed)

        shardings = state_shardings(jax.eval_shape(init_from, params), mesh, rules)
        state = jax.jit(init_from, out_shardings=shardings)(params)  # Adafactor's state born sharded
    else:
        if isinstance(model, ModelConfig):
            model = model_lib.build(model, seed=seed)
        graphdef, _ = split_model(model)
        state = init_state(model, optimizer, seed)
        shardings = state_shardings(state, mesh, rules)
        state = jax.device_put(state, shardings)
    _, replicated = sharding.param_shardings(state.params, mesh, rules)
    return state, shardings, graphdef, replicated
