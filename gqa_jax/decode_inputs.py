"""Before a decode program runs: the model in either form, the inputs checked on the host, the
parameters and rows placed on a mesh, and the prefill's row chunks on a TPU. ``decoding`` and
``beam_search`` call these; nothing here is traced except ``mesh_context``, which a jitted decode
program enters.
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gqa_jax import cache as kvcache
from gqa_jax import sharding as sharding_lib
from gqa_jax.config import ModelConfig
from gqa_jax.log import log_once
from gqa_jax.model import T5

Array = jax.Array
ModelLike = T5 | tuple[Any, Any]  # a T5 module, or nnx.split(model)

# libtpu 0.0.42.1's compiler dies (a stack overflow in its convolution emitter, the whole process)
# on an encoder whose attention logits [rows, heads, S, S] exceed this many elements per device:
# XXL at input 2048 compiled with 2**31 (8 rows x 64 heads; 64 rows x 8 heads) and crashed with
# 2**32 (16 x 64, 128 x 8) on v4:2x2x2. A TPU decode encodes a larger batch in row chunks.
MAX_ENCODER_LOGITS = 2**31


def as_split(model: ModelLike) -> tuple[Any, Any]:
    return nnx.split(model) if isinstance(model, T5) else model


def config_of(model: ModelLike) -> ModelConfig:
    return model.config if isinstance(model, T5) else nnx.merge(*model).config


def mesh_context(mesh: Any, rules: Any, config: ModelConfig) -> Any:
    """Inside a jitted decode program: the activation-sharding context of a static ``(mesh,
    rules)`` on the decode layout of ``config``'s K/V heads (``cache.decode_mesh``: where K is
    smaller than the model axis, the cache's rows take the rest of it). The parameters stay as
    placed on ``mesh``: the split mesh lays every weight on the same devices."""
    if mesh is None:
        return contextlib.nullcontext()
    return sharding_lib.activation_sharding(
        *kvcache.decode_mesh(config, mesh, dict(rules) if rules else None)
    )


def place(
    params: Any,
    ids: Array,
    mesh: Any,
    rules: Any,
    config: Any,
    max_decode_len: int,
    beams: int = 1,
    cache_dtype: str | None = None,
) -> tuple[Any, Array]:
    """Params by the rule table and input rows over ``data`` (a no-op for arrays already placed);
    logs what of the cache is replicated (``cache.cache_layout``: rows that do not divide the
    devices its layout splits them over)."""
    if mesh is None:
        return params, ids
    rules = dict(rules) if rules else sharding_lib.RULES
    sharding_lib.check_rules(rules, mesh)
    sharding_lib.check_batch({"encoder_input_ids": ids}, mesh)
    params = sharding_lib.shard_params(params, mesh, rules)
    _, replicated = kvcache.cache_layout(
        config, mesh, ids.shape[0] * beams, ids.shape[1], max_decode_len, cache_dtype or config.dtype, rules
    )
    if replicated:  # rows that do not divide the devices, stated once per shape
        log_once(
            (config, mesh.shape_tuple, ids.shape, max_decode_len, beams),
            f"KV cache on mesh {dict(mesh.shape)}: " + sharding_lib.replication_report(replicated),
        )
    if not (isinstance(ids, jax.Array) and not ids.is_fully_addressable):
        ids = jax.device_put(ids, sharding_lib.batch_sharding(mesh))
    return params, ids


def validate_inputs(
    config, encoder_input_ids: Any, max_decode_len: int, *, max_input_len: int | None, truncate: bool
) -> Array:
    """Check decoding inputs on the host; returns the (possibly truncated) ids as int32.
    A global array spread over several processes is checked on this process's rows, and is
    never truncated here (cut the rows before building it)."""
    ids = encoder_input_ids
    spread = isinstance(ids, jax.Array) and not ids.is_fully_addressable
    if not spread:
        try:
            ids = np.asarray(ids)
        except ValueError as e:  # ragged Python lists
            raise ValueError(
                "encoder_input_ids must be a rectangular [batch, length] array; rows of different "
                f"lengths must be padded with 0 to one length ({e})"
            ) from e
    if ids.ndim != 2:
        raise ValueError(f"encoder_input_ids must be [batch, length]; got shape {ids.shape}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"empty input: encoder_input_ids has shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"encoder_input_ids must be integer token ids; got dtype {ids.dtype}")
    for rows in [np.asarray(s.data) for s in ids.addressable_shards] if spread else [ids]:
        if rows.size and (rows.min() < 0 or rows.max() >= config.vocab_size):
            raise ValueError(
                f"encoder_input_ids has ids outside the vocabulary [0, {config.vocab_size}): "
                f"min {rows.min()}, max {rows.max()}"
            )
    if not isinstance(max_decode_len, int | np.integer) or max_decode_len < 1:
        raise ValueError(f"max_decode_len={max_decode_len!r} must be an integer >= 1")
    if max_input_len is not None and ids.shape[1] > max_input_len:
        if not truncate or spread:
            raise ValueError(
                f"inputs of length {ids.shape[1]} exceed max_input_len={max_input_len}; "
                "shorten them or pass truncate=True to cut them explicitly (not for an array "
                "spread over processes: cut its rows before building it)"
            )
        ids = ids[:, :max_input_len]
    return ids.astype(jnp.int32) if spread else jnp.asarray(ids, jnp.int32)


def check_sampling(temperature: Any, top_k: Any, top_p: Any, vocab_size: int) -> None:
    """Sampling settings on the host: a NaN or infinite temperature would silently give pad
    tokens, a top_k above the vocabulary fails inside the compiled loop."""

    def number(x: Any) -> float:  # Python, numpy or 0-d JAX scalars; NaN for anything else
        try:
            return float(x)
        except (TypeError, ValueError):
            return float("nan")

    problems = []
    t = number(temperature)
    if not np.isfinite(t) or t < 0:
        problems.append(f"temperature={temperature!r} must be a finite number >= 0 (0 is greedy)")
    if not isinstance(top_k, int | np.integer) or isinstance(top_k, bool) or not 0 <= top_k <= vocab_size:
        problems.append(f"top_k={top_k!r} must be an integer in [0, {vocab_size}] (0: no top-k)")
    if not 0.0 < number(top_p) <= 1.0:  # NaN fails this too
        problems.append(f"top_p={top_p!r} must be in (0, 1]")
    if problems:
        raise ValueError("sample_decode: " + "; ".join(problems))


def encoder_logits(config: ModelConfig, rows: int, input_len: int, mesh: Any) -> int:
    """Elements per device of the encoder's attention logits ``[rows, heads, S, S]`` on ``mesh``
    (rows over ``data``, heads over the model axis where it divides them)."""
    data, model = (mesh.shape["data"], mesh.shape["model"]) if mesh is not None else (1, 1)
    heads = config.num_heads // model if config.num_heads % model == 0 else config.num_heads
    return rows // data * heads * input_len * input_len


def prefill_rows(config: ModelConfig, batch: int, input_len: int, mesh: Any) -> int | None:
    """Rows per chunk of the prefill's encoder on a TPU (None: the whole batch at once): the largest
    divisor of ``batch`` that splits over ``data`` and keeps ``encoder_logits`` within
    ``MAX_ENCODER_LOGITS``, at least one row per device. Other backends: None (the decode kernel
    chooses: ``decoding.prefill_chunk_rows``)."""
    devices = jax.devices() if mesh is None else list(np.asarray(mesh.devices).flat)
    if devices[0].platform != "tpu" or encoder_logits(config, batch, input_len, mesh) <= MAX_ENCODER_LOGITS:
        return None
    data = 1 if mesh is None else mesh.shape["data"]
    fits = [
        r
        for r in range(data, batch, data)
        if batch % r == 0 and encoder_logits(config, r, input_len, mesh) <= MAX_ENCODER_LOGITS
    ]
    return max(fits, default=data)
