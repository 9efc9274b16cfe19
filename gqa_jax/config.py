"""Model configuration: one frozen dataclass, the T5.1.1 presets, and their validation.

The attention kinds of an encoder-decoder are named

- ``encoder_self``: encoder self-attention (bidirectional; MHA in the paper),
- ``decoder_self``: decoder self-attention (causal),
- ``cross``: decoder-to-encoder cross-attention.

``grouped_attentions`` lists which of them use ``num_kv_heads`` K/V heads; the others keep
``num_heads`` (MHA). The paper groups decoder self- and cross-attention only (section 3.1).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

ATTENTION_KINDS = ("encoder_self", "decoder_self", "cross")
MLP_KINDS = ("gated-gelu", "relu")  # T5.1.1 uses gated-gelu; the original T5 used relu.
DTYPES = ("float32", "bfloat16", "float16")
# What each layer keeps for the backward pass (the rest is recomputed); see model.py.
REMAT_POLICIES = ("none", "full", "save_dots", "save_dots_no_batch")
# The decode kernel: how a decode step takes its products. "einsum", the plain products of any
# backend, or "cpu", the CPU fast path (gqa_jax.cpu_step); a model is built for one (T5(kernel=)).
EINSUM_KERNEL, CPU_KERNEL = "einsum", "cpu"
KERNELS = (EINSUM_KERNEL, CPU_KERNEL)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and options of a T5-style encoder-decoder with grouped-query attention.

    ``num_kv_heads`` = K: ``K == num_heads`` is MHA, ``K == 1`` is MQA, anything between that
    divides ``num_heads`` is GQA-K. ``None`` means MHA (K = N). ``remat`` (one of
    ``REMAT_POLICIES``) trades training memory for recomputation and ``scan_layers`` runs the
    layers as one ``lax.scan`` (one layer compiled instead of L); neither changes the outputs.
    """

    vocab_size: int = 32128
    d_model: int = 512
    d_ff: int = 1024
    num_encoder_layers: int = 8
    num_decoder_layers: int = 8
    num_heads: int = 6
    head_dim: int = 64
    num_kv_heads: int | None = None
    grouped_attentions: tuple[str, ...] = ("decoder_self", "cross")
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.0
    tie_word_embeddings: bool = False
    mlp_activation: str = "gated-gelu"
    layer_norm_epsilon: float = 1e-6
    dtype: str = "float32"  # activations
    param_dtype: str = "float32"
    remat: str = "none"
    scan_layers: bool = False

    def __post_init__(self) -> None:
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        object.__setattr__(self, "grouped_attentions", tuple(self.grouped_attentions))
        self._validate()

    def _validate(self) -> None:
        positive = (
            "vocab_size",
            "d_model",
            "d_ff",
            "num_encoder_layers",
            "num_decoder_layers",
            "num_heads",
            "head_dim",
            "relative_attention_num_buckets",
            "relative_attention_max_distance",
        )
        bad = [
            f"{name}={getattr(self, name)!r}"
            for name in positive
            if not _is_positive_int(getattr(self, name))
        ]
        if bad:
            raise ValueError(f"ModelConfig: these fields must be positive integers: {', '.join(bad)}")
        n, k = self.num_heads, self.num_kv_heads
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"ModelConfig: num_kv_heads={k!r} must be an integer >= 1 (1 is MQA).")
        if k > n:
            raise ValueError(
                f"ModelConfig: num_kv_heads={k} is larger than num_heads={n}; "
                "GQA needs 1 <= num_kv_heads <= num_heads."
            )
        if n % k:
            raise ValueError(
                f"ModelConfig: num_heads={n} is not divisible by num_kv_heads={k}; "
                f"choose num_kv_heads from {divisors(n)}."
            )
        unknown = [a for a in self.grouped_attentions if a not in ATTENTION_KINDS]
        if unknown:
            raise ValueError(
                f"ModelConfig: unknown attention name(s) {unknown} in grouped_attentions; "
                f"known: {list(ATTENTION_KINDS)}."
            )
        if len(set(self.grouped_attentions)) != len(self.grouped_attentions):
            raise ValueError(f"ModelConfig: grouped_attentions={self.grouped_attentions} repeats a name.")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"ModelConfig: dropout_rate={self.dropout_rate} must be in [0, 1).")
        if self.mlp_activation not in MLP_KINDS:
            raise ValueError(
                f"ModelConfig: mlp_activation={self.mlp_activation!r}; known: {list(MLP_KINDS)}."
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"ModelConfig: {name}={getattr(self, name)!r}; known: {list(DTYPES)}.")
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"ModelConfig: scan_layers={self.scan_layers!r} must be True or False.")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"ModelConfig: remat={self.remat!r}; known: {list(REMAT_POLICIES)}.")
        if not self.layer_norm_epsilon > 0:
            raise ValueError(f"ModelConfig: layer_norm_epsilon={self.layer_norm_epsilon} must be > 0.")

    # ----------------------------------------------------------------------------- helpers
    def kv_heads(self, attention: str) -> int:
        """Number of K/V heads of one attention kind (``num_kv_heads`` if grouped, else N)."""
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {attention!r}; known: {list(ATTENTION_KINDS)}")
        return self.num_kv_heads if attention in self.grouped_attentions else self.num_heads

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["grouped_attentions"] = list(self.grouped_attentions)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"ModelConfig: unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**d)


def _is_positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


# T5.1.1 shapes from the Flaxformer gin files (docs/paper.md). Layers are encoder = decoder.
_PRESETS: dict[str, dict[str, int]] = {
    "small": dict(d_model=512, d_ff=1024, layers=8, num_heads=6),
    "base": dict(d_model=768, d_ff=2048, layers=12, num_heads=12),
    "large": dict(d_model=1024, d_ff=2816, layers=24, num_heads=16),
    "xl": dict(d_model=2048, d_ff=5120, layers=24, num_heads=32),
    "xxl": dict(d_model=4096, d_ff=10240, layers=24, num_heads=64),
}
T5_1_1_PRESETS = tuple(_PRESETS)
PRESETS = (*T5_1_1_PRESETS, "tiny")


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A T5.1.1 preset (small, base, large, xl, xxl) or ``tiny`` (for tests), with overrides.

    ``preset("xxl", num_kv_heads=8)`` is the paper's GQA-8-XXL.
    """
    if name == "tiny":
        base: dict[str, Any] = dict(
            vocab_size=128,
            d_model=32,
            d_ff=64,
            num_encoder_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            head_dim=8,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
        )
    elif name in _PRESETS:
        p = _PRESETS[name]
        base = dict(
            vocab_size=32128,
            d_model=p["d_model"],
            d_ff=p["d_ff"],
            num_encoder_layers=p["layers"],
            num_decoder_layers=p["layers"],
            num_heads=p["num_heads"],
            head_dim=64,
        )
    else:
        raise ValueError(f"unknown preset {name!r}; known: {list(PRESETS)}")
    base.update(overrides)
    return ModelConfig(**base)


# The paper's decode (T5X with Flaxformer, as its public code of May 2023 decoded: docs/paper.md):
# research instruments that reproduce the paper's decode timings, each a DecodeConfig switch of its
# own so each can be measured alone; never a way to decode (the tokens are ours, the cost T5X's).
#   cross_recompute  cross-attention K/V projected from the encoder output at every step in every
#                    layer (no cross-attention cache: the cache carries the encoder output instead)
#   one_hot_write    the self-attention cache written as ``cached + new * one_hot(index)`` (the whole
#                    cache read and written per layer and step), not one dynamic_update_slice; in beam
#                    search its beams also reordered by T5X's one-hot contraction, not a gather
#   t5x_layout       the self-attention cache held ``[B, K, H, T]`` (length last, T5X's) and moved
#                    back to ``[B, K, T, H]`` (moveaxis) for the attention at every step
PAPER_SWITCHES = ("cross_recompute", "one_hot_write", "t5x_layout")
OUR_DECODE, PAPER_DECODE = "ours", "paper"  # no switch; every switch


def decode_switches(name: str) -> dict[str, bool]:
    """A decode's name -> its switches: ``ours``, ``paper`` (all of them), or switch names joined
    by ``+`` (``cross_recompute``, ``one_hot_write+t5x_layout``; ``-`` for ``_`` too)."""
    text = str(name).strip().lower().replace("-", "_")
    if text == OUR_DECODE:
        on: set[str] = set()
    elif text == PAPER_DECODE:
        on = set(PAPER_SWITCHES)
    else:
        on = {part.strip() for part in text.split("+")}
        unknown = sorted(on - set(PAPER_SWITCHES))
        if unknown or not on:
            raise ValueError(
                f"decode {name!r}: choose {OUR_DECODE}, {PAPER_DECODE}, or switches of the paper's decode "
                f"joined by '+' from {', '.join(PAPER_SWITCHES)} (e.g. cross_recompute+one_hot_write)"
            )
    return {switch: switch in on for switch in PAPER_SWITCHES}


def decode_name(switches: dict[str, bool] | Any) -> str:
    """The canonical name of a decode's switches (a dict, or anything with them as attributes, a
    ``DecodeConfig``): ``ours``, ``paper``, or the switches that are on joined by ``+``."""
    get = switches.get if isinstance(switches, dict) else lambda k: getattr(switches, k)
    on = [s for s in PAPER_SWITCHES if get(s)]
    return OUR_DECODE if not on else PAPER_DECODE if len(on) == len(PAPER_SWITCHES) else "+".join(on)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """The static settings of a compiled decode program (hashable: ``jax.jit`` compiles once per
    value). ``greedy=False`` samples at the loop's traced temperature, restricted to the top
    ``top_k`` tokens (0: all) and the ``top_p`` nucleus; ``return_logits`` keeps every step's;
    ``cache_dtype`` (None: the model's dtype) is the KV cache's (``gqa_jax.kv_quant``).
    ``kernel`` (one of ``KERNELS``): how the step takes its products; ``decoding.decode_config``
    chooses it for the mesh (``cpu_step.kernel_for``: ``"cpu"`` on one CPU device), the default
    ``"einsum"`` being the plain products of any backend; ``gqa_jax.decoding`` alone reads it.
    ``prefill_rows``: the prefill encodes this many rows at a time (None: the kernel's choice;
    ``decode_inputs.prefill_rows`` sets it where a TPU's compiler needs it). ``cross_recompute``,
    ``one_hot_write``, ``t5x_layout``: the paper's decode (``PAPER_SWITCHES``), instruments for its
    timings, all off by default."""

    max_decode_len: int
    eos_id: int = 1
    greedy: bool = True
    top_k: int = 0
    top_p: float = 1.0
    return_logits: bool = False
    cache_dtype: str | None = None
    kernel: str = EINSUM_KERNEL
    prefill_rows: int | None = None
    cross_recompute: bool = False
    one_hot_write: bool = False
    t5x_layout: bool = False

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"DecodeConfig: kernel={self.kernel!r}; choose from {', '.join(KERNELS)}")
        if self.prefill_rows is not None and not _is_positive_int(self.prefill_rows):
            raise ValueError(f"DecodeConfig: prefill_rows={self.prefill_rows!r} must be a positive integer")
