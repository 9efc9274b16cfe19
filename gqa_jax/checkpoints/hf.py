"""Import a HuggingFace T5 checkpoint (``config.json`` + safetensors) into our ``T5``.

Both HF flavours map onto ``ModelConfig``:

- original T5: ``feed_forward_proj="relu"``, tied embeddings, decoder output scaled by
  ``d_model**-0.5`` -> ``tie_word_embeddings=True`` (our "tied" means tied AND scaled);
- T5.1.1: ``"gated-gelu"``, a separate ``lm_head``, no scaling -> ``tie_word_embeddings=False``.

Whether HF scales the decoder output: transformers 5.x writes ``"scale_decoder_outputs"``
(and always ``"tie_word_embeddings": true``); older files only say
``"tie_word_embeddings": false`` for T5.1.1. An unscaled checkpoint whose ``lm_head`` is absent
or equals ``shared`` becomes an untied model with ``lm_head = shared.T`` (exact copy).

Torch ``Linear`` weights are ``[out, in]``; ours are ``[in, out]`` with explicit head axes:
``q/k/v [N*H, D] -> [D, N, H]``, ``o [D, N*H] -> [N, H, D]``, ``wi [F, D] -> [D, F]``,
``wo [D, F] -> [F, D]``. HF T5 has no K/V-head option, so an import is MHA (K = N).
Only safetensors are read: unpickling a ``pytorch_model.bin`` can run arbitrary code.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so safetensors' numpy reader can return it)
import numpy as np
from flax.nnx import traversals
from safetensors import safe_open

from gqa_jax import model as model_lib
from gqa_jax.config import ModelConfig
from gqa_jax.model import T5

_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}  # safetensors name -> ours
_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")  # copies of shared.weight
# Old checkpoints carry this tensor; HF's own model never uses it (no bias in cross-attention).
_UNUSED = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
_REQUIRED_KEYS = ("vocab_size", "d_model", "d_ff", "d_kv", "num_heads", "num_layers")

Transform = Callable[[np.ndarray], np.ndarray]
Path_ = tuple[Any, ...]  # a path in our parameter tree, e.g. ("encoder", "layers", 0, "mlp", "wo")
TensorMap = dict[str, tuple[tuple[int, ...], Path_, Transform]]  # HF name -> (HF shape, path, HF -> ours)


def load_hf_t5(path: str | os.PathLike, *, dtype: str = "float32") -> tuple[T5, ModelConfig]:
    """Load the HF T5 checkpoint directory ``path`` as ``(model, config)``.

    Parameters keep the stored dtype (float32 / bfloat16 / float16; float32 when the tensors
    disagree or are wider); ``dtype`` is the activation dtype. Raises ``FileNotFoundError`` for
    a missing directory / file, ``ValueError`` for anything that does not map (listing every
    missing, unexpected and mis-shaped tensor at once).
    """
    directory = Path(path)
    hf = _read_config(directory)
    with contextlib.ExitStack() as stack:
        handles = {}  # tensor name -> open safetensors file
        for file in _safetensors_files(directory):
            f = stack.enter_context(safe_open(str(file), framework="numpy"))
            for name in f.keys():
                handles[name] = f
        shapes = {n: tuple(f.get_slice(n).get_shape()) for n, f in handles.items()}
        stored = {f.get_slice(n).get_dtype() for n, f in handles.items()}
        param_dtype = _DTYPES[stored.pop()] if len(stored) == 1 and stored <= set(_DTYPES) else "float32"
        config = _model_config(hf, dtype=dtype, param_dtype=param_dtype, tie_word_embeddings=False)
        tensors = tensor_map(config)
        _check_tensors(tensors, shapes, config)

        def read(name: str) -> np.ndarray:
            return handles[name].get_tensor(name).astype(jnp.dtype(param_dtype), copy=False)

        shared = read("shared.weight")
        for alias in _ALIASES:
            if alias in shapes and not np.array_equal(read(alias), shared):
                raise ValueError(f"{directory}: {alias} differs from shared.weight; T5 ties them.")
        head = read("lm_head.weight") if "lm_head.weight" in shapes else None
        separate_head = head is not None and not np.array_equal(head, shared)
        scale = (
            hf["scale_decoder_outputs"]
            if "scale_decoder_outputs" in hf
            else hf.get("tie_word_embeddings", True) is not False
        )
        if scale and separate_head:
            raise ValueError(
                f"{directory}: the decoder output is scaled by d_model**-0.5 (scale_decoder_outputs / "
                "tie_word_embeddings) but lm_head.weight differs from shared.weight; our T5 scales "
                "only with tied embeddings, so this checkpoint is not representable."
            )
        config = config.replace(tie_word_embeddings=bool(scale))

        # One tensor at a time onto the device, so the host holds at most one extra copy.
        params: dict[Path_, jax.Array] = {("shared", "embedding"): jnp.asarray(shared)}
        for name, (_, target, transform) in tensors.items():
            if name != "shared.weight":
                params[target] = jnp.asarray(transform(read(name)))
        if not config.tie_word_embeddings:
            params[("lm_head",)] = jnp.asarray((head if separate_head else shared).T)  # [D, V], a copy
        return model_lib.build(config, traversals.unflatten_mapping(params)), config


def _read_config(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise FileNotFoundError(f"HF checkpoint directory {str(directory)!r} does not exist.")
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{str(config_file)!r} not found; a HF checkpoint needs its config.json.")
    return json.loads(config_file.read_text())


def _safetensors_files(directory: Path) -> list[Path]:
    """The safetensors file(s) of ``directory``, sharded (``model.safetensors.index.json``) or not."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({directory / f for f in json.loads(index.read_text())["weight_map"].values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shard(s) that do not exist: {missing}")
        return files
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
    pickles = sorted(p.name for p in directory.glob("*.bin"))
    if pickles:
        raise ValueError(
            f"{directory} holds only pickle weights {pickles}; they are refused because unpickling "
            "runs arbitrary code. Convert them to safetensors first, e.g. in Python with transformers: "
            "T5ForConditionalGeneration.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)."
        )
    raise FileNotFoundError(f"{directory} has neither model.safetensors nor model.safetensors.index.json.")


def _model_config(hf: dict[str, Any], **fields: Any) -> ModelConfig:
    """``ModelConfig`` from a HF T5 ``config.json`` dict (plus our own ``fields``)."""
    missing = [k for k in _REQUIRED_KEYS if k not in hf]
    if missing:
        raise ValueError(f"HF config.json lacks field(s) {missing}.")
    if hf.get("model_type", "t5") not in ("t5", "mt5"):
        raise ValueError(f"HF config.json: model_type={hf['model_type']!r}; only 't5' and 'mt5' import.")
    activation = hf.get("feed_forward_proj", "relu")  # HF's default
    if activation not in ("gated-gelu", "relu"):
        raise ValueError(
            f"HF config.json: feed_forward_proj={activation!r}; "
            "supported: 'gated-gelu' (T5.1.1) and 'relu' (original T5)."
        )
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["d_model"],
        d_ff=hf["d_ff"],
        num_encoder_layers=hf["num_layers"],
        num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
        num_heads=hf["num_heads"],
        head_dim=hf["d_kv"],
        num_kv_heads=hf["num_heads"],
        relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
        dropout_rate=hf.get("dropout_rate", 0.1),
        layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-6),
        mlp_activation=activation,
        **fields,
    )


def tensor_map(c: ModelConfig) -> TensorMap:
    """Every required HF tensor: ``name -> (HF shape, our parameter path, HF -> ours)``."""
    D, F, N, H, V = c.d_model, c.d_ff, c.num_heads, c.head_dim, c.vocab_size

    def same(w: np.ndarray) -> np.ndarray:
        return w

    def transpose(w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w.T)

    def qkv(w: np.ndarray) -> np.ndarray:  # [N*H, D] -> [D, N, H]
        return np.ascontiguousarray(w.T).reshape(D, N, H)

    def out(w: np.ndarray) -> np.ndarray:  # [D, N*H] -> [N, H, D]
        return np.ascontiguousarray(w.T).reshape(N, H, D)

    projections = (("q", "query", (N * H, D), qkv), ("k", "key", (N * H, D), qkv))
    projections += (("v", "value", (N * H, D), qkv), ("o", "out", (D, N * H), out))
    m: TensorMap = {"shared.weight": ((V, D), ("shared", "embedding"), same)}
    for stack, layers in (("encoder", c.num_encoder_layers), ("decoder", c.num_decoder_layers)):
        bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        m[bias] = ((c.relative_attention_num_buckets, N), (stack, "relpos", "embedding"), same)
        m[f"{stack}.final_layer_norm.weight"] = ((D,), (stack, "final_norm", "scale"), same)
        # HF sub-layers in order: (HF module, our attention, our norm); the MLP comes last.
        if stack == "encoder":
            attentions = [("SelfAttention", "attn", "attn_norm")]
        else:
            attentions = [
                ("SelfAttention", "self_attn", "self_attn_norm"),
                ("EncDecAttention", "cross_attn", "cross_attn_norm"),
            ]
        for i in range(layers):
            hf, ours = f"{stack}.block.{i}.layer", (stack, "layers", i)
            for j, (module, attn, norm) in enumerate(attentions):
                for p, q, shape, fn in projections:
                    m[f"{hf}.{j}.{module}.{p}.weight"] = (shape, (*ours, attn, q), fn)
                m[f"{hf}.{j}.layer_norm.weight"] = ((D,), (*ours, norm, "scale"), same)
            j = len(attentions)
            # HF's relu MLP has one input matrix `wi`; ours calls it wi_0.
            inputs = ("wi_0", "wi_1") if c.mlp_activation == "gated-gelu" else ("wi",)
            for k, wi in enumerate(inputs):
                m[f"{hf}.{j}.DenseReluDense.{wi}.weight"] = ((F, D), (*ours, "mlp", f"wi_{k}"), transpose)
            m[f"{hf}.{j}.DenseReluDense.wo.weight"] = ((D, F), (*ours, "mlp", "wo"), transpose)
            m[f"{hf}.{j}.layer_norm.weight"] = ((D,), (*ours, "mlp_norm", "scale"), same)
    return m


def _check_tensors(tensors: TensorMap, shapes: dict[str, tuple[int, ...]], c: ModelConfig) -> None:
    """Raise one ValueError naming every missing, unexpected and mis-shaped tensor."""
    V, D = c.vocab_size, c.d_model
    optional = {"lm_head.weight": (V, D), **dict.fromkeys(_ALIASES, (V, D)), _UNUSED: None}
    expected = {name: shape for name, (shape, _, _) in tensors.items()} | optional
    missing = sorted(set(tensors) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    misshaped = [
        f"{n}: expected {expected[n]}, found {shapes[n]}"
        for n in sorted(set(shapes) & set(expected))
        if expected[n] is not None and shapes[n] != expected[n]
    ]
    problems = [
        f"{title} ({len(items)}): {items}"
        for title, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
        if items
    ]
    if problems:
        raise ValueError(
            f"HF T5 checkpoint does not match its config.json (vocab_size={V}, d_model={D}, d_ff={c.d_ff}, "
            f"num_heads={c.num_heads}, d_kv={c.head_dim}, layers={c.num_encoder_layers}/"
            f"{c.num_decoder_layers}, feed_forward_proj={c.mlp_activation!r}):\n" + "\n".join(problems)
        )
