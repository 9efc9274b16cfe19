"""Greedy decoding without a KV cache: the whole teacher-forced decoder over the prefix at every
step. The reference the cached decode (``gqa_jax.decoding``) is tested against, and the "without
cache" row of ``bench decode``.

Letters: ``B`` batch, ``T_max`` = max_decode_len, ``V`` vocab.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from gqa_jax.decode_inputs import ModelLike, as_split, config_of, validate_inputs
from gqa_jax.decoding import DecodeResult
from gqa_jax.model import EOS_ID, PAD_ID


@functools.partial(jax.jit, static_argnames=("graphdef", "max_decode_len", "eos_id"))
def _loop(graphdef, params, encoder_input_ids, *, max_decode_len: int, eos_id: int):
    model = nnx.merge(graphdef, params)
    B = encoder_input_ids.shape[0]
    encoded = model.encode(encoder_input_ids)
    mask = encoder_input_ids != PAD_ID

    def step(carry):
        inputs, tokens, logits_all, done, lengths, t = carry
        # [B, T_max, V]: the whole prefix, every step
        logits = model.decode_teacher_forced(inputs, encoded, mask)
        logits = jax.lax.dynamic_index_in_dim(logits, t, axis=1, keepdims=False)  # [B, V]
        token = jnp.where(done, PAD_ID, jnp.argmax(logits, -1).astype(jnp.int32))
        tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, t))
        inputs = jax.lax.dynamic_update_slice(
            inputs, token[:, None], (0, jnp.minimum(t + 1, max_decode_len - 1))
        )
        logits_all = jax.lax.dynamic_update_slice(logits_all, logits[:, None], (0, t, 0))
        return (
            inputs,
            tokens,
            logits_all,
            done | (token == eos_id),
            lengths + (~done).astype(jnp.int32),
            t + 1,
        )

    def running(carry):
        return (carry[5] < max_decode_len) & ~jnp.all(carry[3])

    zeros = jnp.zeros((B, max_decode_len), jnp.int32)  # pad = decoder start id = 0
    init = (
        zeros,
        zeros,
        jnp.zeros((B, max_decode_len, model.config.vocab_size), jnp.float32),
        jnp.zeros((B,), bool),
        jnp.zeros((B,), jnp.int32),
        jnp.zeros((), jnp.int32),
    )
    _, tokens, logits, _, lengths, _ = jax.lax.while_loop(running, step, init)
    return tokens, lengths, logits


def greedy_decode(
    model: ModelLike, encoder_input_ids: Any, max_decode_len: int, eos_id: int = EOS_ID
) -> DecodeResult:
    """Greedy decoding without a cache: the full decoder over the whole prefix at every step."""
    graphdef, params = as_split(model)
    ids = validate_inputs(
        config_of(model), encoder_input_ids, max_decode_len, max_input_len=None, truncate=False
    )
    tokens, lengths, logits = _loop(
        graphdef, params, ids, max_decode_len=int(max_decode_len), eos_id=int(eos_id)
    )
    return DecodeResult(tokens=tokens, lengths=lengths, logits=logits)
