"""Beam search over the decoder's cached step (T5X's length penalty, HF's finishing rule).

Letters: ``B`` batch, ``W`` beams, ``T_max`` = max_decode_len, ``V`` vocab.

The input is encoded once per row and its cache repeated for the row's ``W`` beams; each step
scores ``2W`` candidates per row, keeps the best ``W`` finished and the best ``W`` alive
hypotheses, and reorders the beams' self-attention caches (cross K/V are the same across a row's
beams): by a gather, or under the paper's decode (``one_hot_write``) by T5X's one-hot contraction.
``initial_state``, ``beam_step`` and the ``step`` program are the loop's pieces (``time --predict
--beam-search`` costs ``step``). Scores are ``log p / ((5 + length) / 6) ** alpha``. The input checks and
the placement on a mesh (``gqa_jax.decode_inputs``), the prefill, the decode kernel
(``decoding.decode_config``) and the weights' layout for the steps (``decoding.lay_out``,
``decoding.step_model``) are those of ``gqa_jax.decoding``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from gqa_jax import cache as kvcache
from gqa_jax import decode_inputs, decoding, kv_quant
from gqa_jax import sharding as sharding_lib
from gqa_jax.config import OUR_DECODE, DecodeConfig
from gqa_jax.model import DECODER_START_ID, EOS_ID, PAD_ID

Array = jax.Array


def length_penalty(length: Array, alpha: float) -> Array:
    """T5X / GNMT: ``((5 + length) / 6) ** alpha``."""
    return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


@struct.dataclass
class BeamState:
    cache: kvcache.KVCache  # B * W rows, row b * W + w
    alive_seqs: Array  # [B, W, T_max]
    alive_logp: Array  # [B, W] summed log-probabilities (-inf for empty slots)
    fin_seqs: Array  # [B, W, T_max]
    fin_scores: Array  # [B, W] length-penalized (-inf for empty slots)
    fin_lengths: Array  # [B, W]
    step: Array  # []


def _gather_beams(x: Array, beams: Array) -> Array:
    """``x [B, W_in, ...]``, ``beams [B, W_out]`` -> ``[B, W_out, ...]``."""
    return jnp.take_along_axis(x, beams.reshape(beams.shape + (1,) * (x.ndim - 2)), axis=1)


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "beam_size", "alpha", "mesh", "rules"))
def _beam_loop(
    graphdef, params, encoder_input_ids, *, config: DecodeConfig, beam_size, alpha, mesh=None, rules=None
):
    model = nnx.merge(graphdef, params)
    with decode_inputs.mesh_context(mesh, rules, model.config):
        # encode B rows once, then repeat the cache for W beams per row
        rows = decoding.prefill_chunk_rows(config, *encoder_input_ids.shape)
        cache = decoding.prefill(
            model, encoder_input_ids, config.max_decode_len, cache_dtype=config.cache_dtype, rows=rows,
            decode=config,
        )  # fmt: skip
        weights = decoding.lay_out(graphdef, params, config)
        return _beam_body(graphdef, weights, cache, config=config, beam_size=beam_size, alpha=alpha)


def _beam_body(graphdef, weights, cache: kvcache.KVCache, *, config: DecodeConfig, beam_size, alpha):
    T_max = config.max_decode_len
    state = initial_state(cache, beam_size, T_max)
    W = beam_size

    def running(s: BeamState) -> Array:
        # A row is done when its worst kept finished hypothesis beats the best score any alive
        # beam could still reach (log-probs only fall; the penalty is largest at T_max).
        best_possible = s.alive_logp[:, 0] / length_penalty(jnp.asarray(T_max), alpha)
        done = s.fin_scores[:, W - 1] >= best_possible
        return (s.step < T_max) & ~jnp.all(done)

    s = jax.lax.while_loop(
        running, lambda s: beam_step(graphdef, weights, s, config=config, alpha=alpha), state
    )
    # Pad after EOS: positions past a hypothesis' length are pad.
    positions = jnp.arange(T_max)[None, None, :]
    tokens = jnp.where(positions < s.fin_lengths[:, :, None], s.fin_seqs, PAD_ID)
    return tokens, s.fin_lengths, s.fin_scores


def initial_state(cache: kvcache.KVCache, beam_size: int, max_decode_len: int) -> BeamState:
    """The search's first state: the prefilled cache of ``B`` rows repeated for ``W`` beams per row
    (row ``b * W + w``), one live beam per row, nothing finished."""
    B, W, T_max = cache.cross_mask.shape[0], beam_size, max_decode_len
    rows_of = ("self_k", "self_v", "cross_k", "cross_v", "cross_mask", "encoded")  # the shared index stays
    cache = cache.replace(
        **{f: jax.tree.map(lambda x: jnp.repeat(x, W, axis=0), getattr(cache, f)) for f in rows_of}
    )
    cache = cache.replace(**{f: tuple(map(kv_quant.constrain, getattr(cache, f))) for f in rows_of[:4]})
    neg_inf = jnp.full((B, W), -jnp.inf)
    return BeamState(
        cache=cache,
        alive_seqs=jnp.zeros((B, W, T_max), jnp.int32),
        alive_logp=neg_inf.at[:, 0].set(0.0),  # one live beam at first: no duplicate hypotheses
        fin_seqs=jnp.zeros((B, W, T_max), jnp.int32),
        fin_scores=neg_inf,
        fin_lengths=jnp.zeros((B, W), jnp.int32),
        step=jnp.zeros((), jnp.int32),
    )


def beam_step(graphdef, weights, s: BeamState, *, config: DecodeConfig, alpha: float) -> BeamState:
    """One step of the search: every beam's next token scored, the best ``W`` finished and alive
    hypotheses of each row kept, and the alive beams' self-attention caches reordered. Pure."""
    B, W, T_max = *s.alive_logp.shape, config.max_decode_len
    t = s.step
    last = jnp.where(t == 0, DECODER_START_ID, jax.lax.dynamic_index_in_dim(s.alive_seqs, t - 1, 2, False))
    model = decoding.step_model(graphdef, weights, config)  # in the body: the layout folds
    logits, cache = model.decode_cached(last.reshape(B * W, 1), s.cache)  # [B * W, 1, V]
    V = logits.shape[-1]
    logp = jax.nn.log_softmax(logits[:, 0].astype(jnp.float32)).reshape(B, W, V)
    cand = (s.alive_logp[:, :, None] + logp).reshape(B, W * V)
    # 2W candidates: at most W of them end in EOS, so W can stay alive.
    cand_logp, flat = jax.lax.top_k(cand, 2 * W)  # [B, 2W]
    parent, token = flat // V, (flat % V).astype(jnp.int32)
    seqs = _gather_beams(s.alive_seqs, parent)
    seqs = jax.lax.dynamic_update_slice(seqs, token[:, :, None], (0, 0, t))  # [B, 2W, T_max]
    # A hypothesis may finish only from the top W candidates (as in HF), so one beam
    # without length penalty is exactly greedy.
    ends = ((token == config.eos_id) | (t + 1 == T_max)) & (jnp.arange(2 * W) < W)
    # Finished pool: keep the best W of the old finished and the newly finished.
    new_scores = jnp.where(ends, cand_logp / length_penalty(t + 1, alpha), -jnp.inf)
    scores = jnp.concatenate([s.fin_scores, new_scores], axis=1)  # [B, 3W]
    fin_scores, best = jax.lax.top_k(scores, W)
    fin_seqs = _gather_beams(jnp.concatenate([s.fin_seqs, seqs], axis=1), best)
    lengths = jnp.concatenate([s.fin_lengths, jnp.full((B, 2 * W), t + 1, jnp.int32)], axis=1)
    fin_lengths = _gather_beams(lengths, best)
    # Alive: the best W candidates that did not end in EOS; reorder their caches.
    alive_logp, keep = jax.lax.top_k(jnp.where(token == config.eos_id, -jnp.inf, cand_logp), W)
    parents = _gather_beams(parent, keep)  # [B, W]: each new beam's old beam
    reorder = functools.partial(_reorder, parents=parents, one_hot=config.one_hot_write)
    cache = cache.replace(self_k=tuple(map(reorder, cache.self_k)), self_v=tuple(map(reorder, cache.self_v)))
    return BeamState(cache, _gather_beams(seqs, keep), alive_logp, fin_seqs, fin_scores, fin_lengths, t + 1)


def _reorder(entry: kvcache.Entry, parents: Array, one_hot: bool) -> kvcache.Entry:
    """A self-attention cache entry of the ``B * W`` beams (float, or quantized: values and scales)
    with each row's beams taken from their ``parents [B, W]``: one gather, or (``one_hot``, the
    paper's decode) T5X's contraction with the parents' one-hot (``cache_gather_beams``), which
    reads and writes the whole cache."""
    B, W = parents.shape
    if one_hot:
        pick = jax.nn.one_hot(parents, W, dtype=jnp.int32)  # [B, W_new, W_old]

        def move(x: Array) -> Array:
            rows = x.reshape(B, W, *x.shape[1:])
            return jnp.einsum("beo,bo...->be...", pick, rows).astype(x.dtype).reshape(x.shape)
    else:
        src = (jnp.arange(B)[:, None] * W + parents).reshape(B * W)  # the cache row of each new beam

        def move(x: Array) -> Array:
            return x[src]

    return kv_quant.constrain(jax.tree.map(move, entry))


@functools.partial(
    jax.jit, static_argnames=("graphdef", "config", "alpha", "mesh", "rules"), donate_argnames="state"
)
def step(
    graphdef, weights, state: BeamState, *, config: DecodeConfig, alpha: float, mesh=None, rules=None
) -> BeamState:
    """One search step of every row's beams (the state donated), the weights as
    ``decoding.step_weights`` lays them out: what ``time --predict --beam-search`` costs."""
    with decode_inputs.mesh_context(mesh, rules, decoding.step_model(graphdef, weights, config).config):
        return beam_step(graphdef, weights, state, config=config, alpha=alpha)


def beam_search(
    model: decode_inputs.ModelLike,
    encoder_input_ids: Any,
    max_decode_len: int,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    eos_id: int = EOS_ID,
    max_input_len: int | None = None,
    truncate: bool = False,
    cache_dtype: str | None = None,
    mesh: Any = None,
    rules: Any = None,
    decode: str = OUR_DECODE,
) -> decoding.DecodeResult:
    """Beam search; returns the ``beam_size`` best hypotheses per row, best first:
    tokens ``[B, W, T_max]``, lengths ``[B, W]`` and scores ``log p / ((5 + len) / 6) ** alpha``.

    A hypothesis ends at EOS or at ``max_decode_len``, and only a candidate ranked among the
    step's top ``beam_size`` may end (as in HF). With ``alpha = 0`` one beam is exactly greedy
    decoding; with ``alpha > 0`` a single beam may legitimately prefer a longer hypothesis than
    greedy's, because the penalty rewards length. ``cache_dtype`` and ``decode`` (the paper's
    decode, an instrument for its timings) as for ``greedy_decode``.
    """
    graphdef, params = decode_inputs.as_split(model)
    config = decode_inputs.config_of(model)
    ids = decode_inputs.validate_inputs(
        config, encoder_input_ids, max_decode_len, max_input_len=max_input_len, truncate=truncate
    )
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size} must be >= 1")
    cache_dtype = kv_quant.check_cache_dtype(cache_dtype)
    params, ids = decode_inputs.place(
        params, ids, mesh, rules, config, int(max_decode_len), int(beam_size), cache_dtype=cache_dtype
    )
    tokens, lengths, scores = _beam_loop(
        graphdef,
        params,
        ids,
        config=decoding.decode_config(
            max_decode_len,
            mesh=mesh,
            eos_id=eos_id,
            cache_dtype=cache_dtype,
            prefill_rows=decode_inputs.prefill_rows(config, *ids.shape, mesh),
            decode=decode,
        ),
        beam_size=int(beam_size),
        alpha=float(alpha),
        mesh=mesh,
        rules=sharding_lib.rules_key(rules),
    )
    return decoding.DecodeResult(tokens=tokens, lengths=lengths, scores=scores)
