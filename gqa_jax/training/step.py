"""The train step: the loss, gradient accumulation, and THE one factory that jits the step for
``train()``, ``plan`` and the benchmarks, on one device or a mesh.

Loss. Token cross-entropy over real target tokens (``decoder_loss_weights`` 1, padding 0) plus
T5X's z-loss ``z_loss * logsumexp(logits)^2`` per token (1e-4 keeps the softmax normalizer near
1, which guards bfloat16 logits against drift). Normalization: both are summed over tokens and
divided by the number of real target tokens of the *whole* batch (all micro-batches together,
T5X's ``NUM_REAL_TARGET_TOKENS``), so gradient accumulation gives the same update as one big
batch, and a batch's loss does not depend on how many padding tokens it has. Reported ``loss``
is the cross-entropy alone (per token, natural log); ``z_loss`` is reported separately.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gqa_jax import sharding
from gqa_jax.layers import KeyStream, Rngs
from gqa_jax.model import T5
from gqa_jax.training.state import TrainState

Array = jax.Array
Batch = Mapping[str, Array]

Z_LOSS = 1e-4


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


def _forward_sums(model: T5, batch: Batch, rngs: Rngs | None, z_loss: float) -> dict[str, Array]:
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


def train_step(
    graphdef: Any,
    optimizer: optax.GradientTransformation,
    state: TrainState,
    batch: Batch,
    *,
    num_microbatches: int,
    z_loss: float,
    dropout: bool,
) -> tuple[TrainState, dict[str, Array]]:
    """One optimizer step on ``batch`` (pure; ``make_train_step`` jits it). Dropout keys come from
    the state's key folded with the step and the micro-batch, so a resumed run draws the masks an
    uninterrupted one draws."""
    total_tokens = jnp.maximum(jnp.sum(batch["decoder_loss_weights"]), 1.0)
    step_key = jax.random.fold_in(jax.random.wrap_key_data(state.rng, impl="rbg"), state.step)

    def loss_fn(params: Any, micro: Batch, key: Array) -> tuple[Array, dict[str, Array]]:
        model = nnx.merge(graphdef, params)
        sums = _forward_sums(model, micro, KeyStream(key) if dropout else None, z_loss)
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
    mesh: Mesh | None = None,
    state_shardings: Any = None,
    num_microbatches: int = 1,
    z_loss: float = Z_LOSS,
    dropout: bool = True,
    donate: bool = True,
    rules: Mapping[str, str | None] = sharding.RULES,
) -> Any:
    """The jitted ``(state, batch) -> (new state, metrics)``, the state donated unless
    ``donate=False``. The one factory: ``train()``, ``plan`` and ``bench train`` all take their
    step from here (``.lower(...)`` on the result compiles it ahead of time).

    ``num_microbatches`` splits the batch and sums the gradients (same update, less memory).
    ``dropout`` uses the model config's rate (T5 fine-tuning: 0.1; pre-training: 0). With a
    ``mesh`` (and the state's ``state_shardings``, from ``training.create_state`` or
    ``training.state_shardings``) the step is traced under the rule table's activation sharding,
    the batch's rows split over ``data`` and the state keeps its shardings."""
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    fn = functools.partial(
        train_step, graphdef, optimizer, num_microbatches=num_microbatches, z_loss=z_loss, dropout=dropout
    )
    donate_argnums = (0,) if donate else ()
    if mesh is None:
        return jax.jit(fn, donate_argnums=donate_argnums)
    if state_shardings is None:
        raise ValueError("make_train_step(mesh=...) needs the state's state_shardings")

    def on_mesh(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, Array]]:
        with sharding.activation_sharding(mesh, rules):  # traced here: the model's constraints apply
            return fn(state, batch)

    return jax.jit(
        on_mesh,
        in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
        out_shardings=(state_shardings, NamedSharding(mesh, PartitionSpec())),
        donate_argnums=donate_argnums,
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "z_loss"))
def _eval_sums(params: Any, batch: Batch, *, graphdef: Any, z_loss: float) -> dict[str, Array]:
    return _forward_sums(nnx.merge(graphdef, params), batch, None, z_loss)


def make_eval_step(graphdef: Any, *, z_loss: float = Z_LOSS) -> Callable[[Any, Batch], dict[str, Array]]:
    """The jitted ``(params, batch) -> token sums`` (no dropout), for teacher-forced dev loss. One
    jitted function for every call: a run that evaluates every few steps compiles it once per
    model and batch shape, not once per evaluation."""
    return functools.partial(_eval_sums, graphdef=graphdef, z_loss=z_loss)
