"""KV-cached decoding: prefill, a pure decode step, and the decode programs every tool runs.

Letters: ``B`` batch, ``S`` encoder length, ``T`` decoder length (``T_max`` = max_decode_len),
``N`` query heads, ``K`` K/V heads, ``H`` head dim, ``V`` vocab, ``W`` beams.

- ``prefill`` encodes the input once and projects every layer's cross-attention K/V once into
  the cache (at K heads), plus an empty self-attention cache of ``T_max`` positions.
- ``decode_step(model, state) -> state`` is pure and jittable alone: it feeds each row's last
  token, writes its K/V at the cache index, and picks the next token (greedy or sampled).
- The decode programs (jitted; their static settings a frozen ``DecodeConfig`` from
  ``decode_config``): ``start`` (the prefill and the loop's first state), ``step`` (one step),
  ``finish`` (the steps in a ``lax.while_loop`` until every row is done) and
  ``prefill_and_decode`` (``start`` then ``finish`` in one program). ``step`` and ``finish`` take
  the weights as ``step_weights`` lays them out for the steps, once per decode. ``greedy_decode``
  / ``sample_decode`` check the inputs on the host and call ``prefill_and_decode``;
  ``beam_search``, ``plan``, ``time`` and the benchmarks run or lower the same programs, so one
  path is measured and predicted. The decoder starts from the pad id 0, rows that emitted EOS keep
  emitting pad, and the loop stops as soon as every row is done.
- The decode kernel (``DecodeConfig.kernel``: ``"einsum"``, or ``"cpu"``, the CPU fast path of
  ``gqa_jax.cpu_step``) is chosen once, by ``decode_config`` for the mesh, and read here only:
  it lays out the step's weights (``step_weights``) and the prefill's row chunks
  (``prefill_chunk_rows``); the model's code is the same under both.
- Beam search is in ``gqa_jax.beam_search``, over the same step; the host-side checks and the
  placement on a mesh are in ``gqa_jax.decode_inputs``.

Every entry point takes the model as a ``T5`` module or as its ``(graphdef, state)`` split; the
programs take the split (``nnx.merge`` inside ``jit``).

Sharded decoding: pass ``mesh=`` (``gqa_jax.sharding.make_mesh``). Parameters are placed by the
rule table, input rows split over ``data``, and the programs are traced inside
``sharding.activation_sharding`` on the decode layout (``cache.decode_mesh``): the cache's K/V
heads over ``model`` as far as K allows and its rows over ``data`` and the rest of the model axis,
so no device holds a copy of another's cache (Pope et al. 2022's batch-sharded multiquery). On
several processes pass the inputs as a global array (``distributed.global_batch``); results are
global arrays (``distributed.to_host``).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from gqa_jax import cache as kvcache
from gqa_jax import cpu_step, kv_quant
from gqa_jax import model as model_lib
from gqa_jax import sharding as sharding_lib
from gqa_jax.config import CPU_KERNEL, EINSUM_KERNEL, OUR_DECODE, DecodeConfig, ModelConfig, decode_switches
from gqa_jax.decode_inputs import (
    ModelLike,
    as_split,
    check_sampling,
    config_of,
    mesh_context,
    place,
    prefill_rows,
    validate_inputs,
)
from gqa_jax.model import DECODER_START_ID, EOS_ID, PAD_ID, T5

Array = jax.Array


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


def decode_config(
    max_decode_len: int,
    *,
    mesh: Any = None,
    eos_id: int = EOS_ID,
    greedy: bool = True,
    top_k: int = 0,
    top_p: float = 1.0,
    return_logits: bool = False,
    cache_dtype: str | None = None,
    prefill_rows: int | None = None,
    decode: str = OUR_DECODE,
) -> DecodeConfig:
    """The static settings of a decode program on ``mesh`` (None: one device), its kernel chosen
    for the mesh by ``cpu_step.kernel_for``: the one place that choice is made, for the decoding
    API, beam search and every tool that lowers or times a decode program. ``prefill_rows``: as
    ``decode_inputs.prefill_rows`` gives it for the batch (None: the whole batch at once).
    ``decode``: ``ours``, or the paper's decode or some of its switches (``config.decode_switches``:
    instruments for its timings)."""
    return DecodeConfig(
        max_decode_len=int(max_decode_len),
        eos_id=int(eos_id),
        greedy=bool(greedy),
        top_k=int(top_k),
        top_p=float(top_p),
        return_logits=return_logits,
        cache_dtype=cache_dtype,
        kernel=cpu_step.kernel_for(mesh),
        prefill_rows=prefill_rows,
        **decode_switches(decode),
    )


@struct.dataclass
class StepWeights:
    """The parameters as a decode step reads them, laid out for ``kernel`` by :func:`step_weights`
    (under ``"cpu"`` the step's products out-major, ``cpu_step.out_major``, and ``model`` the
    model's config; else the parameters as they are)."""

    params: Any
    kernel: str = struct.field(pytree_node=False)
    model: ModelConfig | None = struct.field(pytree_node=False, default=None)


def step_weights(graphdef: Any, params: Any, config: DecodeConfig) -> StepWeights:
    """The model split (``graphdef``, ``params``) laid out for the steps of ``config``'s kernel,
    once per decode: ``step`` and ``finish`` take them, so a step never lays out a weight itself."""
    if config.kernel != CPU_KERNEL:
        return StepWeights(params, config.kernel)
    return StepWeights(_out_major(params), config.kernel, config_of((graphdef, params)))


_out_major = jax.jit(cpu_step.out_major)


def lay_out(graphdef: Any, params: Any, config: DecodeConfig) -> StepWeights:
    """:func:`step_weights` inside a program that also prefills: behind a barrier, so XLA keeps the
    layout (and hoists it out of the step loop) instead of folding the transpose back."""
    if config.kernel != CPU_KERNEL:
        return StepWeights(params, config.kernel)
    laid = jax.lax.optimization_barrier(cpu_step.out_major(params))
    return StepWeights(laid, config.kernel, config_of((graphdef, params)))


def step_model(graphdef: Any, weights: StepWeights, config: DecodeConfig) -> T5:
    """Inside a step program, in the loop's body: the model a step runs. Under ``"cpu"`` it is
    built for that kernel (``T5(kernel=)``: a group's query heads attended one at a time) and
    reads the weights in their step layout (``cpu_step.in_major``: a transpose XLA folds into each
    product's operand layout where the body uses it; made outside the body, XLA would copy the
    weights back instead)."""
    if not isinstance(weights, StepWeights) or weights.kernel != config.kernel:
        got = weights.kernel if isinstance(weights, StepWeights) else type(weights).__name__
        raise ValueError(
            f"the step programs take StepWeights for kernel {config.kernel!r}, got {got}: "
            "lay the parameters out with decoding.step_weights(graphdef, params, config)"
        )
    if weights.kernel != CPU_KERNEL:
        return nnx.merge(graphdef, weights.params)
    cpu_graphdef, shapes = nnx.split(model_lib.abstract(weights.model, CPU_KERNEL))
    return nnx.merge(cpu_graphdef, cpu_step.in_major(weights.params, cpu_step.shapes_of(shapes)))


def prefill_chunk_rows(config: DecodeConfig, batch: int, input_len: int) -> int:
    """Rows the prefill's encoder takes at a time: ``config.prefill_rows`` where given (a TPU
    compiler's limit), row chunks of ``cpu_step.encode_chunk_rows`` under the ``"cpu"`` kernel,
    else the whole batch."""
    if config.prefill_rows is not None:
        return config.prefill_rows
    return cpu_step.encode_chunk_rows(batch, input_len) if config.kernel == CPU_KERNEL else batch


def prefill(
    model: T5,
    encoder_input_ids: Array,
    max_decode_len: int,
    *,
    cache_dtype: str | None = None,
    rows: int | None = None,
    decode: DecodeConfig | None = None,
) -> kvcache.KVCache:
    """Encode once and build the cache: cross K/V projected once, empty self K/V ``[B, K, T_max, H]``,
    in ``cache_dtype`` (None: the model's dtype; int8 / fp8: quantized, ``gqa_jax.kv_quant``).
    ``rows`` (None: the whole batch): the encoder takes that many rows at a time (``lax.map`` over
    chunks, :func:`prefill_chunk_rows`); the numbers agree with the batched encoder to float32
    rounding. ``decode``: a program's settings, whose paper's-decode switches (None: none) keep the
    encoder output instead of the cross K/V (``cross_recompute``) and hold the self cache in the form
    they ask for (``cache.CacheForm``)."""
    config = model.config
    B, S = encoder_input_ids.shape
    rows = B if rows is None else rows
    if rows < B:
        chunks = encoder_input_ids.reshape(B // rows, rows, S)
        encoded = jax.lax.map(model.encode, chunks).reshape(B, S, -1)  # [B, S, D]
    else:
        encoded = model.encode(encoder_input_ids)  # [B, S, D]
    recompute = decode is not None and decode.cross_recompute  # the paper's: no cross cache
    cross_k, cross_v = ((), ()) if recompute else model.decoder.cross_kv(encoded)  # per layer [B, K, S, H]
    cross_k = tuple(kvcache.store(k, cache_dtype or k.dtype) for k in cross_k)  # laid out as the cache
    cross_v = tuple(kvcache.store(v, cache_dtype or v.dtype) for v in cross_v)
    form = kvcache.CacheForm() if decode is None else kvcache.CacheForm.of(decode)
    self_k, self_v = kvcache.empty_self_cache(config, B, max_decode_len, cache_dtype or encoded.dtype, form)
    return kvcache.KVCache(
        self_k=self_k,
        self_v=self_v,
        cross_k=cross_k,
        cross_v=cross_v,
        cross_mask=encoder_input_ids != PAD_ID,
        index=jnp.zeros((), jnp.int32),  # one position for every row
        encoded=encoded if recompute else None,
        form=form,
    )


def init_state(cache: kvcache.KVCache, key: Array, *, vocab_size: int, return_logits: bool) -> DecodeState:
    B, T_max = cache.cross_mask.shape[0], cache.max_decode_len
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
    logits: Array,
    key: Array,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    kernel: str = EINSUM_KERNEL,
) -> Array:
    """``logits [B, V]`` -> next tokens ``[B]``: argmax at temperature 0 (a Python number; under
    the ``"cpu"`` kernel ``cpu_step.argmax``), else a sample from ``softmax(logits / temperature)``
    restricted to the top-k tokens and the top-p nucleus. ``temperature`` may be traced; ``top_k``
    and ``top_p`` are static."""
    if isinstance(temperature, int | float) and temperature == 0.0:
        if kernel == CPU_KERNEL:
            return cpu_step.argmax(logits)
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
) -> DecodeState:
    """One token for every row. Pure: returns a new state; jittable alone."""
    kvcache.check_cache(model.config, state.cache)
    logits, cache = model.decode_cached(state.last[:, None], state.cache)  # [B, 1, V]
    logits = logits[:, 0]
    key, sub = jax.random.split(state.key)
    token = choose_tokens(logits, sub, temperature=temperature, top_k=top_k, top_p=top_p, kernel=model.kernel)
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


# ------------------------------------------------------------------- the decode programs
# Every program takes the model split (graphdef static, params traced) and a static
# ``DecodeConfig``, ``mesh`` and ``rules`` (as ``sharding.rules_key`` gives them); with a mesh its
# trace runs under the mesh's activation sharding. ``prefill_and_decode`` is ``start`` then ``finish``
# in one program; the tools lower or time the pieces (``step`` alone: the stepped benchmark and the
# TPU prediction; ``finish``: the decoder's steps timed apart from the prefill).
def _start(model: T5, ids: Array, key: Array, config: DecodeConfig) -> DecodeState:
    rows = prefill_chunk_rows(config, *ids.shape)
    T = config.max_decode_len
    cache = prefill(model, ids, T, cache_dtype=config.cache_dtype, rows=rows, decode=config)
    return init_state(cache, key, vocab_size=model.config.vocab_size, return_logits=config.return_logits)


def _step(
    graphdef: Any, weights: StepWeights, state: DecodeState, temperature: Array, config: DecodeConfig
) -> DecodeState:
    return decode_step(
        step_model(graphdef, weights, config),
        state,
        eos_id=config.eos_id,
        temperature=0.0 if config.greedy else temperature,
        top_k=config.top_k,
        top_p=config.top_p,
    )


def _finish(
    graphdef: Any, weights: StepWeights, state: DecodeState, temperature: Array, config: DecodeConfig
) -> DecodeState:
    def running(s: DecodeState) -> Array:
        return (s.step < config.max_decode_len) & ~jnp.all(s.done)

    return jax.lax.while_loop(running, lambda s: _step(graphdef, weights, s, temperature, config), state)


_STATIC = ("graphdef", "config", "mesh", "rules")


@functools.partial(jax.jit, static_argnames=_STATIC)
def start(
    graphdef, params, encoder_input_ids, key, *, config: DecodeConfig, mesh=None, rules=None
) -> DecodeState:
    """The prefill: encoder, cross K/V into the cache, the empty self cache, the loop's first state."""
    model = nnx.merge(graphdef, params)
    with mesh_context(mesh, rules, model.config):
        return _start(model, encoder_input_ids, key, config)


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames="state")
def step(
    graphdef, weights: StepWeights, state, temperature, *, config: DecodeConfig, mesh=None, rules=None
) -> DecodeState:
    """One decode step of every row (the state donated: the cache is updated in place); the
    weights as :func:`step_weights` lays them out."""
    with mesh_context(mesh, rules, step_model(graphdef, weights, config).config):
        return _step(graphdef, weights, state, temperature, config)


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames="state")
def finish(
    graphdef, weights: StepWeights, state, temperature, *, config: DecodeConfig, mesh=None, rules=None
) -> DecodeState:
    """The decoder's steps from ``state`` (a ``lax.while_loop``) until every row is done or
    ``max_decode_len`` tokens are out (the state donated); the weights as :func:`step_weights`
    lays them out."""
    with mesh_context(mesh, rules, step_model(graphdef, weights, config).config):
        return _finish(graphdef, weights, state, temperature, config)


@functools.partial(jax.jit, static_argnames=_STATIC)
def prefill_and_decode(
    graphdef, params, encoder_input_ids, key, temperature, *, config: DecodeConfig, mesh=None, rules=None
) -> DecodeState:
    """The whole greedy / sampling decode in one program: ``start`` then ``finish``, the weights
    laid out for the steps in between. ``temperature`` is traced (no recompile per value).
    ``greedy_decode`` / ``sample_decode`` check inputs, build ``config`` with ``decode_config``
    and call this; call it directly to ``.lower()`` the loop (``plan``, the benchmarks), with a
    config from ``decode_config``."""
    model = nnx.merge(graphdef, params)
    with mesh_context(mesh, rules, model.config):
        state = _start(model, encoder_input_ids, key, config)
        return _finish(graphdef, lay_out(graphdef, params, config), state, temperature, config)


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
    decode: str = OUR_DECODE,
) -> DecodeResult:
    """Greedy decoding with the KV cache. Returns tokens ``[B, T_max]`` (pad after EOS and
    after an early stop) and lengths ``[B]`` (EOS included). ``mesh``: decode sharded (module
    docstring); ``return_cache``: also the final cache (to inspect its bytes and shardings);
    ``cache_dtype``: the cache's dtype (None: the model's; ``"int8"``: quantized, ``kv_quant``);
    ``decode``: ``ours`` or the paper's decode, an instrument for its timings (``decode_config``)."""
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
        decode=decode,
    )


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
    decode: str = OUR_DECODE,
) -> DecodeResult:
    """Sampling with temperature / top-k / top-p and an explicit PRNG ``key`` (same key, same
    samples). ``temperature=0`` is greedy; ``cache_dtype`` and ``decode`` as for ``greedy_decode``."""
    graphdef, params = as_split(model)
    ids = validate_inputs(
        config_of(model), encoder_input_ids, max_decode_len, max_input_len=max_input_len, truncate=truncate
    )
    check_sampling(temperature, top_k, top_p, config_of(model).vocab_size)
    if temperature > 0 and key is None:
        raise ValueError("sampling needs an explicit PRNG key: sample_decode(..., key=jax.random.key(0))")
    cache_dtype = kv_quant.check_cache_dtype(cache_dtype)
    params, ids = place(
        params, ids, mesh, rules, config_of(model), int(max_decode_len), cache_dtype=cache_dtype
    )
    config = decode_config(
        max_decode_len,
        mesh=mesh,
        eos_id=eos_id,
        greedy=temperature == 0.0,
        top_k=top_k,
        top_p=top_p,
        return_logits=return_logits,
        cache_dtype=cache_dtype,
        prefill_rows=prefill_rows(config_of(model), *ids.shape, mesh),
        decode=decode,
    )
    state = prefill_and_decode(
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
