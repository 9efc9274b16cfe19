"""KV-cached decoding: prefill, a pure decode step, the compiled greedy / sampling loop.

Letters: ``B`` batch, ``S`` encoder length, ``T`` decoder length (``T_max`` = max_decode_len),
``N`` query heads, ``K`` K/V heads, ``H`` head dim, ``V`` vocab, ``W`` beams.

- ``prefill`` encodes the input once and projects every layer's cross-attention K/V once into
  the cache (at K heads), plus an empty self-attention cache of ``T_max`` positions.
- ``decode_step(model, state) -> state`` is pure and jittable alone: it feeds each row's last
  token, writes its K/V at the row's cache index, and picks the next token (greedy or sampled).
- ``decode_loop`` (public, jitted; its static settings are a frozen ``DecodeConfig``) runs
  ``decode_step`` in a ``lax.while_loop``; ``greedy_decode`` / ``sample_decode`` check the inputs
  on the host and call it. The decoder starts from the pad id 0, rows that emitted EOS keep emitting pad,
  and the loop stops as soon as every row is done.
- The CPU decode fast path (``gqa_jax.cpu_step``) is the static ``DecodeConfig.cpu_fast_path``:
  ``greedy_decode`` / ``sample_decode`` (and ``beam_search``) set it on the host from
  ``cpu_step.use_for(mesh)``; the loop then chunks the prefill and runs
  ``decode_step(..., cpu_fast=True)``. ``decode_step`` alone defaults to the plain einsums.
- ``uncached_greedy_decode`` re-runs the whole teacher-forced decoder each step: the reference
  for tests and the "without cache" row of the benchmark.
- Beam search is in ``gqa_jax.beam_search``, over the same step and plumbing.

Every function takes the model as a ``T5`` module or as its ``(graphdef, state)`` split; the
jitted cores take the split (``nnx.merge`` inside ``jit``).

Sharded decoding: pass ``mesh=`` (``gqa_jax.sharding.make_mesh``). Parameters are placed by the
rule table, input rows split over ``data``, and the loop is traced inside
``sharding.activation_sharding`` so the cache is held at K/V-head granularity over ``model``
(when ``K % model == 0``; replicated otherwise). On several processes pass the inputs as a
global array (``distributed.global_batch``); results are global arrays (``distributed.to_host``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from gqa_jax import cache as kvcache
from gqa_jax import cpu_step, kv_quant
from gqa_jax import sharding as sharding_lib
from gqa_jax.config import DecodeConfig, ModelConfig
from gqa_jax.log import log_once
from gqa_jax.model import DECODER_START_ID, EOS_ID, PAD_ID, T5

Array = jax.Array
ModelLike = T5 | tuple[Any, Any]  # a T5 module, or nnx.split(model)


@struct.dataclass
class DecodeState:
    """The loop carry of greedy / sampled decoding."""

    cache: kvcache.KVCache
    tokens: Array  # [B, T_max] emitted tokens, pad after EOS
    last: Array  # [B] the token fed to the next step
    done: Array  # [B] bool: the row has emitted EOS
    lengths: Array  # [B] tokens emitted, EOS included
    step: Array  # [] int32
    key: Array  # PRNG key for sampling (unused by greedy)
    logits: Array | None = None  # [B, T_max, V] per-step logits, only when asked for


@struct.dataclass
class DecodeResult:
    tokens: Array  # [B, T_max] (greedy / sampling) or [B, W, T_max] (beam search, best first)
    lengths: Array  # [B] or [B, W]
    scores: Array | None = None  # beam search: length-penalized log-probabilities [B, W]
    logits: Array | None = None  # [B, T_max, V] when return_logits=True
    cache: kvcache.KVCache | None = None  # the final cache when return_cache=True


# ------------------------------------------------------------------------ model plumbing
def as_split(model: ModelLike) -> tuple[Any, Any]:
    return nnx.split(model) if isinstance(model, T5) else model


def config_of(model: ModelLike) -> ModelConfig:
    return model.config if isinstance(model, T5) else nnx.merge(*model).config


def mesh_context(mesh: Any, rules: Any) -> Any:
    """Inside a jitted core: the activation-sharding context of a static ``(mesh, rules)``."""
    if mesh is None:
        return contextlib.nullcontext()
    return sharding_lib.activation_sharding(mesh, dict(rules) if rules else sharding_lib.RULES)


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
    logs the cache's replication when its K/V heads cannot split over ``model``."""
    if mesh is None:
        return params, ids
    rules = dict(rules) if rules else sharding_lib.RULES
    sharding_lib.check_rules(rules, mesh)
    sharding_lib.check_batch({"encoder_input_ids": ids}, mesh)
    params = sharding_lib.shard_params(params, mesh, rules)
    _, replicated = kvcache.cache_layout(
        config, mesh, ids.shape[0] * beams, ids.shape[1], max_decode_len, cache_dtype or config.dtype, rules
    )
    if replicated:  # the paper's section 2.2 waste, stated once per shape
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


def prefill(
    model: T5,
    encoder_input_ids: Array,
    max_decode_len: int,
    *,
    chunked: bool = False,
    cache_dtype: str | None = None,
) -> kvcache.KVCache:
    """Encode once and build the cache: cross K/V projected once, empty self K/V ``[B, K, T_max, H]``,
    in ``cache_dtype`` (None: the model's dtype; int8 / fp8: quantized, ``gqa_jax.kv_quant``).

    ``chunked`` (the CPU fast path of the loops): encode a few rows at a time (``lax.map`` over
    chunks of at most ``cpu_step.ENCODE_CHUNK_TOKENS`` tokens, ``cpu_step.encode_chunk_rows``), so
    a chunk's activations and ``[N, S, S]`` attention logits stay in the CPU caches through a layer
    instead of the whole batch's streaming through memory at every op. The numbers agree with the
    batched encoder to float32 rounding (products of other shapes sum in another order)."""
    config = model.config
    B, S = encoder_input_ids.shape
    rows = cpu_step.encode_chunk_rows(B, S) if chunked else B
    if rows < B:
        chunks = encoder_input_ids.reshape(B // rows, rows, S)
        encoded = jax.lax.map(model.encode, chunks).reshape(B, S, -1)  # [B, S, D]
    else:
        encoded = model.encode(encoder_input_ids)  # [B, S, D]
    cross_k, cross_v = model.decoder.cross_kv(encoded)  # per layer [B, K, S, H]
    if cache_dtype is not None:
        cross_k = tuple(kvcache.store(k, cache_dtype) for k in cross_k)
        cross_v = tuple(kvcache.store(v, cache_dtype) for v in cross_v)
    self_k, self_v = kvcache.empty_self_cache(config, B, max_decode_len, cache_dtype or encoded.dtype)
    return kvcache.KVCache(
        self_k=self_k,
        self_v=self_v,
        cross_k=cross_k,
        cross_v=cross_v,
        cross_mask=encoder_input_ids != PAD_ID,
        index=jnp.zeros((B,), jnp.int32),
    )


def init_state(cache: kvcache.KVCache, key: Array, *, vocab_size: int, return_logits: bool) -> DecodeState:
    B, T_max = cache.index.shape[0], cache.max_decode_len
    return DecodeState(
        cache=cache,
        tokens=jnp.full((B, T_max), PAD_ID, jnp.int32),
        last=jnp.full((B,), DECODER_START_ID, jnp.int32),
        done=jnp.zeros((B,), bool),
        lengths=jnp.zeros((B,), jnp.int32),
        step=jnp.zeros((), jnp.int32),
        key=key,
        logits=jnp.zeros((B, T_max, vocab_size), jnp.float32) if return_logits else None,
    )


# ---------------------------------------------------------------------------- token choice
def choose_tokens(
    logits: Array, key: Array, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0
) -> Array:
    """``logits [B, V]`` -> next tokens ``[B]``: argmax at temperature 0 (a Python number), else
    a sample from ``softmax(logits / temperature)`` restricted to the top-k tokens and the
    top-p nucleus. ``temperature`` may be traced; ``top_k`` and ``top_p`` are static."""
    if isinstance(temperature, int | float) and temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / temperature
    if top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]  # [B, 1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]  # [B, V] descending
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the strictly better tokens
        # Keep the smallest prefix whose mass reaches top_p (the best token always stays).
        cutoff = jnp.min(jnp.where(before < top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


# ----------------------------------------------------------------------------- the step
def decode_step(
    model: T5,
    state: DecodeState,
    *,
    eos_id: int = EOS_ID,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    cpu_fast: bool = False,
) -> DecodeState:
    """One token for every row. Pure: returns a new state; jittable alone. ``cpu_fast`` (static):
    the CPU decode fast path for the step's products (``T5.decode_cached``); off by default."""
    kvcache.check_cache(model.config, state.cache)
    logits, cache = model.decode_cached(state.last[:, None], state.cache, cpu_fast=cpu_fast)  # [B, 1, V]
    logits = logits[:, 0]
    key, sub = jax.random.split(state.key)
    token = choose_tokens(logits, sub, temperature=temperature, top_k=top_k, top_p=top_p)
    token = jnp.where(state.done, PAD_ID, token)  # finished rows keep emitting pad
    tokens = jax.lax.dynamic_update_slice(state.tokens, token[:, None], (0, state.step))
    step_logits = state.logits
    if step_logits is not None:
        step_logits = jax.lax.dynamic_update_slice(step_logits, logits[:, None], (0, state.step, 0))
    return state.replace(
        cache=cache,
        tokens=tokens,
        last=token,
        done=state.done | (token == eos_id),
        lengths=state.lengths + (~state.done).astype(jnp.int32),
        step=state.step + 1,
        key=key,
        logits=step_logits,
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "mesh", "rules"))
def decode_loop(
    graphdef: Any,
    params: Any,
    encoder_input_ids: Array,
    key: Array,
    temperature: Array,
    *,
    config: DecodeConfig,
    mesh: Any = None,
    rules: Any = None,
) -> DecodeState:
    """The compiled greedy / sampling loop, prefill included: ``temperature`` is traced (no
    recompile per value); ``config`` (a frozen ``DecodeConfig``), ``mesh`` and ``rules`` (as
    ``sharding.rules_key`` gives them) are static. With a ``mesh`` the trace runs under its
    activation sharding (cache sharded by the rules). ``config.cpu_fast_path`` chooses the CPU
    fast path (chunked prefill, ``decode_step(..., cpu_fast=True)``). ``greedy_decode`` /
    ``sample_decode`` check inputs, set ``cpu_fast_path`` from ``cpu_step.use_for(mesh)`` and
    call this; call it directly to ``.lower()`` the loop (``plan``, the benchmarks), setting
    ``cpu_fast_path`` as they do (its default False is the plain path)."""
    with mesh_context(mesh, rules):
        model = nnx.merge(graphdef, params)
        cache = prefill(
            model,
            encoder_input_ids,
            config.max_decode_len,
            chunked=config.cpu_fast_path,
            cache_dtype=config.cache_dtype,
        )
        state = init_state(cache, key, vocab_size=model.config.vocab_size, return_logits=config.return_logits)

        def step(s: DecodeState) -> DecodeState:
            return decode_step(
                model,
                s,
                eos_id=config.eos_id,
                temperature=0.0 if config.greedy else temperature,
                top_k=config.top_k,
                top_p=config.top_p,
                cpu_fast=config.cpu_fast_path,
            )

        def running(s: DecodeState) -> Array:
            return (s.step < config.max_decode_len) & ~jnp.all(s.done)

        return jax.lax.while_loop(running, step, state)


def greedy_decode(
    model: ModelLike,
    encoder_input_ids: Any,
    max_decode_len: int,
    eos_id: int = EOS_ID,
    *,
    max_input_len: int | None = None,
    truncate: bool = False,
    return_logits: bool = False,
    return_cache: bool = False,
    cache_dtype: str | None = None,
    mesh: Any = None,
    rules: Any = None,
) -> DecodeResult:
    """Greedy decoding with the KV cache. Returns tokens ``[B, T_max]`` (pad after EOS and
    after an early stop) and lengths ``[B]`` (EOS included). ``mesh``: decode sharded (module
    docstring); ``return_cache``: also the final cache (to inspect its bytes and shardings);
    ``cache_dtype``: the cache's dtype (None: the model's; ``"int8"``: quantized, ``kv_quant``)."""
    return sample_decode(
        model,
        encoder_input_ids,
        max_decode_len,
        eos_id,
        temperature=0.0,
        max_input_len=max_input_len,
        truncate=truncate,
        return_logits=return_logits,
        return_cache=return_cache,
        cache_dtype=cache_dtype,
        mesh=mesh,
        rules=rules,
    )


def _check_sampling(temperature: Any, top_k: Any, top_p: Any, vocab_size: int) -> None:
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


def sample_decode(
    model: ModelLike,
    encoder_input_ids: Any,
    max_decode_len: int,
    eos_id: int = EOS_ID,
    *,
    key: Array | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    max_input_len: int | None = None,
    truncate: bool = False,
    return_logits: bool = False,
    return_cache: bool = False,
    cache_dtype: str | None = None,
    mesh: Any = None,
    rules: Any = None,
) -> DecodeResult:
    """Sampling with temperature / top-k / top-p and an explicit PRNG ``key`` (same key, same
    samples). ``temperature=0`` is greedy; ``cache_dtype`` as for ``greedy_decode``."""
    graphdef, params = as_split(model)
    ids = validate_inputs(
        config_of(model), encoder_input_ids, max_decode_len, max_input_len=max_input_len, truncate=truncate
    )
    _check_sampling(temperature, top_k, top_p, config_of(model).vocab_size)
    if temperature > 0 and key is None:
        raise ValueError("sampling needs an explicit PRNG key: sample_decode(..., key=jax.random.key(0))")
    cache_dtype = kv_quant.check_cache_dtype(cache_dtype)
    params, ids = place(
        params, ids, mesh, rules, config_of(model), int(max_decode_len), cache_dtype=cache_dtype
    )
    config = DecodeConfig(
        max_decode_len=int(max_decode_len),
        eos_id=int(eos_id),
        greedy=temperature == 0.0,
        top_k=int(top_k),
        top_p=float(top_p),
        return_logits=return_logits,
        cache_dtype=cache_dtype,
        cpu_fast_path=cpu_step.use_for(mesh),
    )
    state = decode_loop(
        graphdef,
        params,
        ids,
        jax.random.key(0) if key is None else key,
        jnp.float32(temperature),
        config=config,
        mesh=mesh,
        rules=sharding_lib.rules_key(rules),
    )
    return DecodeResult(
        tokens=state.tokens,
        lengths=state.lengths,
        logits=state.logits,
        cache=state.cache if return_cache else None,
    )


# --------------------------------------------------------------------- the cache-free path
@functools.partial(jax.jit, static_argnames=("graphdef", "max_decode_len", "eos_id"))
def _uncached_loop(graphdef, params, encoder_input_ids, *, max_decode_len: int, eos_id: int):
    model = nnx.merge(graphdef, params)
    B = encoder_input_ids.shape[0]
    encoded = model.encode(encoder_input_ids)
    mask = encoder_input_ids != PAD_ID

    def step(carry):
        inputs, tokens, logits_all, done, lengths, t = carry
        logits = model.decode(inputs, encoded, mask)  # [B, T_max, V]: the whole prefix, every step
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


def uncached_greedy_decode(
    model: ModelLike, encoder_input_ids: Any, max_decode_len: int, eos_id: int = EOS_ID
) -> DecodeResult:
    """Greedy decoding without a cache: the full decoder over the whole prefix at every step."""
    graphdef, params = as_split(model)
    ids = validate_inputs(
        config_of(model), encoder_input_ids, max_decode_len, max_input_len=None, truncate=False
    )
    tokens, lengths, logits = _uncached_loop(
        graphdef, params, ids, max_decode_len=int(max_decode_len), eos_id=int(eos_id)
    )
    return DecodeResult(tokens=tokens, lengths=lengths, logits=logits)
