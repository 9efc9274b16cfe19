"""T5.1.1 encoder-decoder whose attentions can be MHA, GQA-K or MQA (Flax NNX).

Letters: ``B`` batch, ``S`` encoder length, ``T`` decoder length, ``D`` d_model, ``V`` vocab,
``N`` query heads.

Read top to bottom: an encoder layer is pre-norm self-attention + pre-norm MLP, each added to
the residual stream after dropout; a decoder layer adds pre-norm cross-attention between them.
Each stack owns one relative position bias table shared by all its layers (bidirectional in the
encoder, causal in the decoder, none in cross-attention). Which attentions are grouped comes
from ``ModelConfig.grouped_attentions``; every attention uses the same ``Attention`` class with
``config.kv_heads(kind)`` K/V heads.

Padding is id 0: it is masked as a key in the encoder and in cross-attention. The decoder input
starts with id 0 (the start token), so decoder self-attention is masked causally only.

Rematerialization (``config.remat``): with teacher forcing each layer runs under
``nnx.remat`` (``jax.checkpoint``), keeping for the backward pass only what the policy saves --
``full``: the layer's inputs; ``save_dots``: every matmul output; ``save_dots_no_batch``: the
projections (matmuls without batch dimensions), recomputing the attention scores -- and
recomputing the rest. Scanned layers (``config.scan_layers``): with teacher forcing each stack
stacks its layers' parameters inside the step and runs them as one ``lax.scan``, so one layer is
compiled instead of L (the parameters stay per layer, in the checkpoint as here). Decoding has
no backward pass and runs the layers one by one.

Packed examples (several documents in one row, see ``gqa_jax.data.pipeline``) pass segment ids
(1, 2, ... per document, 0 for padding): every attention is then also masked to its own
document, so packed documents never attend to each other. Relative positions need no reset:
within one document the distance between two tokens is the same as in the packed row.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx import traversals

from gqa_jax import cache
from gqa_jax.attention import Attention
from gqa_jax.config import EINSUM_KERNEL, ModelConfig
from gqa_jax.layers import (
    MLP,
    Embed,
    KeyStream,
    RelativePositionBias,
    RMSNorm,
    Rngs,
    dropout,
    dtype_of,
    fan_in_init,
    project,
)
from gqa_jax.sharding import constrain

Array = jax.Array

PAD_ID = 0
EOS_ID = 1
DECODER_START_ID = 0
CROSS_RECOMPUTE_SCOPE = "paper_cross_kv"  # the name scope of the paper's decode's per-step cross projection


_REMAT = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_saveable,
    "save_dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _rematerialized(call: Any, remat: str) -> Any:
    """``call(layer, *arrays)`` under ``nnx.remat`` with the policy ``remat`` (plain for "none")."""
    return call if remat == "none" else nnx.remat(call, policy=_REMAT[remat])


def _run_layers(
    layers: Any, call: Any, carry: Any, per_layer: list, rngs: Rngs | None, *, remat: str, scan: bool
) -> tuple[Any, list]:
    """``carry, out_i = call(layer_i, carry, per_layer[i], rngs)`` for each layer in order; returns
    ``(carry, [out_i])``. ``remat`` wraps each call in ``jax.checkpoint`` with that policy. ``scan``
    stacks the layers' parameters (and ``per_layer``) and runs them as one ``lax.scan``, so the
    layer is traced and compiled once instead of L times; its dropout then draws each layer's key
    from one split of ``rngs`` (other masks than the loop's, same distribution)."""
    if not scan:
        run, outs = _rematerialized(call, remat), []
        for layer, inputs in zip(layers, per_layer, strict=True):
            carry, out = run(layer, carry, inputs, rngs)
            outs.append(out)
        return carry, outs
    graphdef = nnx.split(layers[0])[0]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *[nnx.state(layer) for layer in layers])  # [L, ...]
    inputs = jax.tree.map(lambda *a: jnp.stack(a), *per_layer) if per_layer[0] is not None else None
    keys = None if rngs is None else jax.random.split(rngs.dropout(), len(layers))

    def body(carry: Any, xs: Any) -> tuple[Any, Any]:
        state, layer_inputs, key = xs
        return call(nnx.merge(graphdef, state), carry, layer_inputs, None if key is None else KeyStream(key))

    if remat != "none":
        body = jax.checkpoint(body, policy=_REMAT[remat])
    carry, outs = jax.lax.scan(body, carry, (stacked, inputs, keys))
    return carry, [jax.tree.map(lambda a, i=i: a[i], outs) for i in range(len(layers))]


class EncoderLayer(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: Rngs):
        self.attn_norm = RMSNorm(config.d_model, config)
        self.attn = Attention(config, config.kv_heads("encoder_self"), rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, config)
        self.mlp = MLP(config, rngs=rngs)
        self.rate = config.dropout_rate

    def __call__(self, x: Array, *, bias: Array, mask: Array, rngs: Rngs | None) -> Array:
        """``x [B, S, D]``, ``bias [N, S, S]``, ``mask [B, 1, S]`` -> ``[B, S, D]``."""
        h = self.attn_norm(x)
        x = x + dropout(self.attn(h, h, bias=bias, mask=mask, rngs=rngs), self.rate, rngs)
        x = x + dropout(self.mlp(self.mlp_norm(x), rngs), self.rate, rngs)
        return constrain(x, "hidden")


class DecoderLayer(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: Rngs, kernel: str = EINSUM_KERNEL):
        self.self_attn_norm = RMSNorm(config.d_model, config)
        kv = config.kv_heads
        self.self_attn = Attention(config, kv("decoder_self"), rngs=rngs, cached=True, kernel=kernel)
        self.cross_attn_norm = RMSNorm(config.d_model, config)
        self.cross_attn = Attention(config, kv("cross"), rngs=rngs, cached=True, kernel=kernel)
        self.mlp_norm = RMSNorm(config.d_model, config)
        self.mlp = MLP(config, rngs=rngs, kernel=kernel)
        self.rate = config.dropout_rate

    def __call__(
        self,
        y: Array,
        cross_kv: tuple[Array, Array] | Array,
        *,
        self_bias: Array,
        self_mask: Array,
        cross_mask: Array,
        self_kv: tuple[Array, Array] | None = None,
        index: Array | None = None,
        form: cache.CacheForm = cache.OUR_FORM,
        rngs: Rngs | None = None,
    ) -> tuple[Array, tuple[Array, Array]]:
        """One decoder layer, teacher-forced or cached (the same code for both).

        ``y [B, T, D]``; ``cross_kv``: encoder keys/values ``[B, K, S, H]`` (or, in the paper's
        decode, the encoder output ``[B, S, D]`` to project them from, at every step); ``self_bias``
        ``[N, T, S']`` or ``[B, N, T, S']``; ``self_mask`` broadcastable to ``[B, T, S']``;
        ``cross_mask [B, 1, S]``. Without ``self_kv`` the keys are these T positions
        (``S' = T``); with ``self_kv`` (``[B, K, T_max, H]`` each, laid out and written as ``form``
        says) the new keys/values are written at positions ``index + 0..T-1`` of every row
        (``index`` a scalar) and the queries attend over the whole cache (``S' = T_max``).
        Returns ``(y, (keys, values))``, the latter being the updated cache.
        """
        h = self.self_attn_norm(y)
        q, k, v = self.self_attn.project_qkv(h)  # [B, T, N, H], [B, K, T, H] x 2
        if self_kv is not None:
            k, v = cache.write(self_kv[0], k, index, form), cache.write(self_kv[1], v, index, form)
        attn = self.self_attn.attend(
            q, cache.attended(k, form), cache.attended(v, form), bias=self_bias, mask=self_mask, rngs=rngs
        )
        y = y + dropout(attn, self.rate, rngs)
        h = self.cross_attn_norm(y)
        q = self.cross_attn.project_q(h)  # [B, T, N, H]
        if not isinstance(cross_kv, tuple):  # the paper's decode: projected again, held as a cache holds K/V
            dtype = cache.dtype_name(self_kv[0]) if self_kv is not None else cross_kv.dtype
            with jax.named_scope(CROSS_RECOMPUTE_SCOPE):  # its ops' names say where the compiler put them
                cross_kv = tuple(cache.store(x, dtype) for x in self.cross_attn.project_kv(cross_kv))
        attn = self.cross_attn.attend(q, *cross_kv, mask=cross_mask, rngs=rngs)
        y = y + dropout(attn, self.rate, rngs)
        y = y + dropout(self.mlp(self.mlp_norm(y), rngs), self.rate, rngs)
        return constrain(y, "hidden"), (k, v)


class Encoder(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: Rngs):
        self.relpos = RelativePositionBias(config, bidirectional=True, rngs=rngs)
        self.layers = nnx.List([EncoderLayer(config, rngs=rngs) for _ in range(config.num_encoder_layers)])
        self.final_norm = RMSNorm(config.d_model, config)
        self.rate = config.dropout_rate
        self.remat, self.scan = config.remat, config.scan_layers

    def __call__(self, x: Array, mask: Array, *, rngs: Rngs | None = None) -> Array:
        """Embedded inputs ``x [B, S, D]``, key mask ``[B, S]`` (or a full ``[B, S, S]`` mask)
        -> encoded ``[B, S, D]``."""
        pos = jnp.arange(x.shape[1])
        bias = self.relpos(pos, pos)  # [N, S, S], computed once, shared by all layers
        mask = mask[:, None, :] if mask.ndim == 2 else mask  # [B, 1 or S, S]
        x = dropout(x, self.rate, rngs)

        def call(layer: EncoderLayer, x: Array, _: None, rngs: Rngs | None) -> tuple[Array, None]:
            return layer(x, bias=bias, mask=mask, rngs=rngs), None

        per_layer = [None] * len(self.layers)
        x, _ = _run_layers(self.layers, call, x, per_layer, rngs, remat=self.remat, scan=self.scan)
        return dropout(self.final_norm(x), self.rate, rngs)


class Decoder(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: Rngs, kernel: str = EINSUM_KERNEL):
        self.relpos = RelativePositionBias(config, bidirectional=False, rngs=rngs)
        layers = [DecoderLayer(config, rngs=rngs, kernel=kernel) for _ in range(config.num_decoder_layers)]
        self.layers = nnx.List(layers)
        self.final_norm = RMSNorm(config.d_model, config)
        self.rate = config.dropout_rate
        self.remat, self.scan = config.remat, config.scan_layers

    def cross_kv(self, encoded: Array) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
        """Every layer's cross-attention keys and values ``[B, K, S, H]`` from ``encoded [B, S, D]``."""
        kvs = [layer.cross_attn.project_kv(encoded) for layer in self.layers]
        return tuple(k for k, _ in kvs), tuple(v for _, v in kvs)

    def __call__(
        self,
        y: Array,
        cross_kv: tuple[tuple[Array, ...], tuple[Array, ...]] | Array,
        cross_mask: Array,
        *,
        self_kv: tuple[tuple[Array, ...], tuple[Array, ...]] | None = None,
        index: Array | None = None,
        form: cache.CacheForm = cache.OUR_FORM,
        segment_ids: Array | None = None,
        rngs: Rngs | None = None,
    ) -> tuple[Array, tuple[tuple[Array, ...], tuple[Array, ...]]]:
        """Embedded decoder inputs ``y [B, T, D]`` -> ``([B, T, D], self keys/values per layer)``.

        ``cross_kv``: every layer's cross-attention keys and values, or the encoder output ``[B, S,
        D]`` each layer projects them from (the paper's decode). ``cross_mask`` is ``[B, S]`` (a
        key mask) or ``[B, T, S]``. Teacher forcing
        (``self_kv=None``): positions ``0..T-1`` attend causally to each other, and only within
        their own segment when ``segment_ids [B, T]`` are given (packed rows).
        Cached: every row's tokens sit at positions ``index + 0..T-1`` (one index: the rows step
        together) and attend to every cached position up to their own; the bias is computed for
        just these query positions.
        """
        T = y.shape[1]
        q_pos = jnp.arange(T) if self_kv is None else index + jnp.arange(T)  # [T]
        k_pos = q_pos if self_kv is None else jnp.arange(cache.length_of(self_kv[0][0], form))  # or [T_max]
        bias = self.relpos(q_pos, k_pos)  # [N, T, T] or [N, T, T_max]
        causal = k_pos <= q_pos[:, None]  # [T, T] or [T, T_max]: key position <= query position
        if segment_ids is not None:
            if self_kv is not None:
                raise ValueError("segment_ids (packed rows) are for teacher forcing, not cached decoding")
            causal = causal & (segment_ids[:, :, None] == segment_ids[:, None, :])  # [B, T, T]
        cross_mask = cross_mask[:, None, :] if cross_mask.ndim == 2 else cross_mask  # [B, 1 or T, S]
        y = dropout(y, self.rate, rngs)

        def call(layer: DecoderLayer, y: Array, kv: Any, rngs: Rngs | None) -> tuple[Array, Any]:
            cross, own = kv  # this layer's cross K/V, and its cached self K/V (None: teacher forcing)
            return layer(y, cross, self_bias=bias, self_mask=causal, cross_mask=cross_mask,
                         self_kv=own, index=index, form=form, rngs=rngs)  # fmt: skip

        L = len(self.layers)
        own = [None] * L if self_kv is None else [(self_kv[0][i], self_kv[1][i]) for i in range(L)]
        per_layer = [
            ((cross_kv[0][i], cross_kv[1][i]) if isinstance(cross_kv, tuple) else cross_kv, own[i])
            for i in range(L)
        ]
        teacher = self_kv is None  # decoding has no backward pass and runs the layers one by one
        y, kvs = _run_layers(self.layers, call, y, per_layer, rngs, remat=self.remat if teacher else "none",
                             scan=self.scan and teacher)  # fmt: skip
        return dropout(self.final_norm(y), self.rate, rngs), (
            tuple(k for k, _ in kvs),
            tuple(v for _, v in kvs),
        )


class T5(nnx.Module):
    """The encoder-decoder. ``T5(config, rngs=nnx.Rngs(0))(encoder_ids, decoder_ids) -> logits``.
    ``kernel``: the decode kernel of the program it is built for (``config.KERNELS``; a decode
    program on one CPU device builds its step's model with ``"cpu"``: ``gqa_jax.decoding``); it
    changes how the decoder and output layer take their products (``layers.project``, the
    attention's loop order), never the numbers."""

    def __init__(self, config: ModelConfig, *, rngs: Rngs, kernel: str = EINSUM_KERNEL):
        self.config = config
        self.shared = Embed(config, rngs=rngs)
        self.encoder = Encoder(config, rngs=rngs)
        self.decoder = Decoder(config, rngs=rngs, kernel=kernel)
        self.kernel = kernel
        if not config.tie_word_embeddings:
            D, V = config.d_model, config.vocab_size
            self.lm_head = nnx.Param(fan_in_init(D)(rngs.params(), (D, V), dtype_of(config.param_dtype)))

    def encode(
        self,
        encoder_input_ids: Array,
        *,
        segment_ids: Array | None = None,
        rngs: Rngs | None = None,
    ) -> Array:
        """``encoder_input_ids [B, S]`` -> encoded ``[B, S, D]`` (padding id 0 is masked; with
        ``segment_ids [B, S]`` each token attends only within its own segment)."""
        _check_ids("encoder_input_ids", encoder_input_ids)
        mask = encoder_input_ids != PAD_ID  # [B, S]
        if segment_ids is not None:
            mask = mask[:, None, :] & (segment_ids[:, :, None] == segment_ids[:, None, :])  # [B, S, S]
        return self.encoder(self.shared(encoder_input_ids), mask, rngs=rngs)

    def logits(self, hidden: Array) -> Array:
        """Decoder output ``[B, T, D]`` -> logits ``[B, T, V]`` (float32)."""
        if self.config.tie_word_embeddings:
            # Original T5 (tied): rescale before reusing the embedding as the output layer.
            hidden = hidden * (self.config.d_model**-0.5)
            out = project("BTD,VD->BTV", hidden, self.shared.embedding[...].astype(hidden.dtype), self.kernel)
        else:
            w = self.lm_head[...].astype(hidden.dtype)
            out = project("BTD,DV->BTV", hidden, w, self.kernel)
        return constrain(out.astype(jnp.float32), "logits")

    def decode_teacher_forced(
        self,
        decoder_input_ids: Array,
        encoded: Array,
        encoder_mask: Array,
        *,
        segment_ids: Array | None = None,
        rngs: Rngs | None = None,
    ) -> Array:
        """Teacher-forced decoder: ``decoder_input_ids [B, T]``, ``encoded [B, S, D]``,
        ``encoder_mask [B, S]`` (or ``[B, T, S]``), decoder ``segment_ids [B, T]`` for packed
        rows -> logits ``[B, T, V]``."""
        _check_ids("decoder_input_ids", decoder_input_ids)
        y = self.shared(decoder_input_ids)
        hidden, _ = self.decoder(
            y, self.decoder.cross_kv(encoded), encoder_mask, segment_ids=segment_ids, rngs=rngs
        )
        return self.logits(hidden)

    def decode_cached(self, decoder_input_ids: Array, kv: cache.KVCache) -> tuple[Array, cache.KVCache]:
        """Decode ``decoder_input_ids [B, T]`` (usually T = 1) at the cache's positions.

        Returns logits ``[B, T, V]`` and the cache with these tokens' keys/values written and
        ``index`` advanced by T. Pure: the input cache is not modified.
        """
        y = self.shared(decoder_input_ids)
        hidden, self_kv = self.decoder(
            y,
            (kv.cross_k, kv.cross_v) if kv.encoded is None else kv.encoded,  # the paper's: projected per step
            kv.cross_mask,
            self_kv=(kv.self_k, kv.self_v),
            index=kv.index,
            form=kv.form,
        )
        new = kv.replace(self_k=self_kv[0], self_v=self_kv[1], index=kv.index + decoder_input_ids.shape[1])
        return self.logits(hidden), new

    def __call__(
        self,
        encoder_input_ids: Array,
        decoder_input_ids: Array,
        *,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        rngs: Rngs | None = None,
    ) -> Array:
        """``[B, S]`` and ``[B, T]`` token ids -> logits ``[B, T, V]``. ``rngs`` enables dropout.

        Packed rows pass both ``encoder_segment_ids [B, S]`` and ``decoder_segment_ids [B, T]``
        (segment n of the decoder is the target of segment n of the encoder)."""
        _check_ids("encoder_input_ids", encoder_input_ids)
        _check_ids("decoder_input_ids", decoder_input_ids)
        if encoder_input_ids.shape[0] != decoder_input_ids.shape[0]:
            raise ValueError(
                f"batch sizes differ: encoder_input_ids {encoder_input_ids.shape} vs "
                f"decoder_input_ids {decoder_input_ids.shape}"
            )
        if (encoder_segment_ids is None) != (decoder_segment_ids is None):
            raise ValueError("packed rows need both encoder_segment_ids and decoder_segment_ids, or neither")
        encoded = self.encode(encoder_input_ids, segment_ids=encoder_segment_ids, rngs=rngs)
        cross_mask = encoder_input_ids != PAD_ID  # [B, S]
        if encoder_segment_ids is not None:
            same = decoder_segment_ids[:, :, None] == encoder_segment_ids[:, None, :]  # [B, T, S]
            cross_mask = cross_mask[:, None, :] & same
        return self.decode_teacher_forced(
            decoder_input_ids, encoded, cross_mask, segment_ids=decoder_segment_ids, rngs=rngs
        )


def _check_ids(name: str, ids: Array) -> None:
    if ids.ndim != 2:
        raise ValueError(f"{name} must be [batch, length] token ids; got shape {ids.shape}")
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"{name} must be integer token ids; got dtype {ids.dtype}")


def shift_right(target_ids: Array, segment_ids: Array | None = None) -> Array:
    """Teacher forcing: decoder inputs are the targets shifted right behind the start id 0.

    With ``segment_ids [B, T]`` (packed rows) every segment starts again with the start id, so
    no document sees the last token of the one packed before it."""
    shifted = jnp.pad(target_ids, ((0, 0), (1, 0)), constant_values=DECODER_START_ID)[:, :-1]
    if segment_ids is not None:
        prev = jnp.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1]
        shifted = jnp.where(segment_ids == prev, shifted, DECODER_START_ID)
    return shifted


# ------------------------------------------------------------------------ building a model
Path_ = tuple[Any, ...]  # a parameter path, e.g. ("decoder", "layers", 0, "self_attn", "key")
FlatParams = dict[Path_, Any]


def abstract(config: ModelConfig, kernel: str = EINSUM_KERNEL) -> T5:
    """The model's structure with shape-only parameters: no memory, no random numbers drawn.

    A fresh module each call, so callers may fill it in place: a clone of one template traced per
    config and kernel (cloning is much cheaper than tracing the constructor, which builds every
    layer's arrays abstractly)."""
    return nnx.clone(_abstract_template(config, kernel))


@functools.lru_cache(maxsize=16)
def _abstract_template(config: ModelConfig, kernel: str) -> T5:
    return nnx.eval_shape(lambda: T5(config, rngs=KeyStream(0), kernel=kernel))  # KeyStream: why not nnx.Rngs


def build(config: ModelConfig, params: Any = None, *, seed: int = 0) -> T5:
    """The one way to make a model from a config: random weights from ``seed`` when ``params`` is
    None; else a ``T5`` holding ``params`` (a model, its Param state or a pure nested dict as
    ``nnx.to_pure_dict`` gives, arrays of any kind), with no random initialization first. Params
    that do not match the config are one ``ValueError`` naming every mismatch."""
    if params is None:
        return T5(config, rngs=KeyStream(seed))  # the weights nnx.Rngs(seed) draws (layers.KeyStream)
    flat = flat_params(params)
    check_params(flat, config, "params")
    model = abstract(config)
    state = nnx.state(model, nnx.Param)
    # host arrays placed without a program per shape (jnp.asarray compiles one); jax arrays, a
    # loader's global ones across processes among them, as they are
    arrays = {p: v if isinstance(v, jax.Array) else jax.device_put(v) for p, v in flat.items()}
    nnx.replace_by_pure_dict(state, traversals.unflatten_mapping(arrays))
    nnx.update(model, state)
    return model


def flat_params(model_or_params: T5 | nnx.State | dict) -> FlatParams:
    """``{path: array}`` of a model, its Param state or a pure nested dict (digit keys -> ints)."""
    if isinstance(model_or_params, nnx.Module):
        model_or_params = nnx.state(model_or_params, nnx.Param)
    if isinstance(model_or_params, nnx.State):
        model_or_params = nnx.to_pure_dict(model_or_params)
    if not isinstance(model_or_params, dict):
        raise ValueError(
            "expected a T5, an nnx.State or a nested dict of parameters, "
            f"got {type(model_or_params).__name__}"
        )
    flat = traversals.flatten_mapping(model_or_params)
    return {tuple(int(k) if isinstance(k, str) and k.isdigit() else k for k in p): v for p, v in flat.items()}


def check_params(flat: FlatParams, config: ModelConfig, what: str) -> None:
    """Raise a ValueError naming every parameter missing, extra, or with another shape / dtype."""
    expected = flat_params(nnx.to_pure_dict(nnx.state(abstract(config), nnx.Param)))
    problems = [f"{dotted(p)}: missing" for p in sorted(expected.keys() - flat.keys(), key=dotted)]
    problems += [f"{dotted(p)}: not in the model" for p in sorted(flat.keys() - expected.keys(), key=dotted)]
    for p in sorted(expected.keys() & flat.keys(), key=dotted):
        want, got = expected[p], flat[p]
        if tuple(want.shape) != tuple(np.shape(got)) or jnp.dtype(want.dtype) != jnp.dtype(got.dtype):
            problems.append(
                f"{dotted(p)}: config expects {tuple(want.shape)} {want.dtype}, "
                f"got {tuple(np.shape(got))} {got.dtype}"
            )
    if problems:
        raise ValueError(f"{what} do not match the config:\n  " + "\n  ".join(problems))


def dotted(path: Path_) -> str:
    return ".".join(map(str, path))
