"""Import a HuggingFace T5 checkpoint (``config.json`` + safetensors or ``flax_model.msgpack``).

Both HF flavours map onto ``ModelConfig``:

- original T5: ``feed_forward_proj="relu"``, tied embeddings, decoder output scaled by
  ``d_model**-0.5`` -> ``tie_word_embeddings=True`` (our "tied" means tied AND scaled);
- T5.1.1: ``"gated-gelu"``, a separate ``lm_head``, no scaling -> ``tie_word_embeddings=False``.

Whether HF scales the decoder output: transformers 5.x writes ``"scale_decoder_outputs"``
(and always ``"tie_word_embeddings": true``); older files only say
``"tie_word_embeddings": false`` for T5.1.1. An unscaled checkpoint whose ``lm_head`` is absent
or equals ``shared`` becomes an untied model with ``lm_head = shared.T`` (exact copy).

Weights, in this order of preference: ``model.safetensors`` (or a sharded
``model.safetensors.index.json``), then ``flax_model.msgpack`` (HF's Flax weights, which the
smaller ``google/t5-v1_1-*`` repositories ship; read with flax's msgpack restore, no pickle).
Torch ``Linear`` weights are ``[out, in]``, Flax kernels ``[in, out]``; ours are ``[in, out]``
with explicit head axes: ``q/k/v [N*H, D]`` (Flax ``[D, N*H]``) ``-> [D, N, H]``, ``o [D, N*H]``
(Flax ``[N*H, D]``) ``-> [N, H, D]``, ``wi [F, D] -> [D, F]``, ``wo [D, F] -> [F, D]``. HF T5 has
no K/V-head option, so an import is MHA (K = N). ``pytorch_model.bin`` is refused: unpickling it
can run arbitrary code.

Safetensors are read one slice at a time, so with a ``mesh`` each device's block is read alone
(``layout.materialize``); a msgpack file is one message, read whole on each host.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so safetensors' numpy reader can return it)
import numpy as np
from etils import epath
from flax import serialization
from flax.nnx import traversals
from jax.sharding import Mesh
from safetensors import safe_open

from gqa_jax import model as model_lib
from gqa_jax import paths
from gqa_jax.checkpoints import layout
from gqa_jax.checkpoints.layout import Tensor
from gqa_jax.config import ModelConfig
from gqa_jax.model import T5

_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}  # safetensors name -> ours
_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")  # copies of shared.weight
# Old checkpoints carry this tensor; HF's own model never uses it (no bias in cross-attention).
_UNUSED = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
_REQUIRED_KEYS = ("vocab_size", "d_model", "d_ff", "d_kv", "num_heads", "num_layers")
SAFETENSORS, FLAX = "safetensors", "flax"  # the two weight flavours
FLAX_FILE = "flax_model.msgpack"
Shapes = dict[str, tuple[int, ...]]


def load_hf_t5(
    path: str | os.PathLike,
    *,
    dtype: str = "float32",
    mesh: Mesh | None = None,
    param_dtype: str | None = None,
) -> tuple[T5, ModelConfig]:
    """Load the HF T5 checkpoint directory ``path`` as ``(model, config)``.

    Parameters keep the stored dtype (float32 / bfloat16 / float16; float32 when the tensors
    disagree or are wider); ``dtype`` is the activation dtype. With ``mesh`` every parameter is
    created sharded by the rule table. Raises ``FileNotFoundError`` for a missing directory /
    file, ``ValueError`` for anything that does not map (listing every missing, unexpected and
    mis-shaped tensor at once).
    ``param_dtype`` (e.g. ``"bfloat16"`` for decoding) casts every parameter as it is read, so no
    device ever holds the stored-dtype copy; None keeps the stored dtype.
    """
    directory = paths.resolve(path, "HF checkpoint")
    hf = _read_config(directory)
    with _open_weights(directory) as (flavour, shapes, dtypes, reader):
        as_stored = layout.stored_dtype(dtypes.values())
        config = _model_config(hf, dtype=dtype, param_dtype=as_stored, tie_word_embeddings=False)
        tensors = tensor_map(config, flavour)
        optional = (*_ALIASES, _UNUSED) if flavour == SAFETENSORS else ()
        head_name = "lm_head.weight" if flavour == SAFETENSORS else "lm_head.kernel"
        layout.check(
            tensors | {head_name: _head(config, flavour)},
            shapes,
            f"HF T5 checkpoint {directory} does not match its config.json ({_describe(config)})",
            optional=(*optional, head_name),
        )
        shared_name = "shared.weight" if flavour == SAFETENSORS else "shared.embedding"
        shared = reader(shared_name, ())
        for alias in _ALIASES:
            if alias in shapes and not np.array_equal(reader(alias, ()), shared):
                raise ValueError(f"{directory}: {alias} differs from shared.weight; T5 ties them.")
        head = reader(head_name, ()) if head_name in shapes else None
        # torch's lm_head is [V, D] like shared; Flax's kernel is [D, V]
        if head is not None and flavour == FLAX:
            head = head.T
        separate_head = head is not None and not np.array_equal(head, shared)
        del shared, head
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
        config = config.replace(
            tie_word_embeddings=bool(scale), param_dtype=param_dtype or config.param_dtype
        )
        extra = {}
        if not config.tie_word_embeddings:  # lm_head [D, V]: its own tensor, or a copy of shared
            if separate_head:
                extra[("lm_head",)] = (_head(config, flavour), head_name)
            else:
                V, D = config.vocab_size, config.d_model
                extra[("lm_head",)] = (Tensor(("lm_head",), (D, V), ((1,), (0,))), shared_name)
        params = layout.materialize(tensors, reader, config, mesh=mesh, extra=extra)
        return model_lib.build(config, params), config


def weights_flavour(directory: str | os.PathLike) -> str | None:
    """``"safetensors"`` or ``"flax"``: which weights ``load_hf_t5`` would read, None if neither."""
    directory = epath.Path(directory)
    if (directory / "model.safetensors.index.json").is_file() or (directory / "model.safetensors").is_file():
        return SAFETENSORS
    return FLAX if (directory / FLAX_FILE).is_file() else None


def _head(config: ModelConfig, flavour: str) -> Tensor:
    """A separate lm_head: torch ``[V, D]``, Flax ``[D, V]``; ours ``[D, V]``."""
    D, V = config.d_model, config.vocab_size
    return Tensor(("lm_head",), (D, V), ((1,), (0,)) if flavour == SAFETENSORS else ((0,), (1,)))


def _describe(c: ModelConfig) -> str:
    return (
        f"vocab_size={c.vocab_size}, d_model={c.d_model}, d_ff={c.d_ff}, num_heads={c.num_heads}, "
        f"d_kv={c.head_dim}, layers={c.num_encoder_layers}/{c.num_decoder_layers}, "
        f"feed_forward_proj={c.mlp_activation!r}"
    )


@contextlib.contextmanager
def _open_weights(directory: epath.Path) -> Iterator[tuple[str, Shapes, dict[str, str], layout.Reader]]:
    """``(flavour, shapes, dtypes, reader)`` of ``directory``'s weights, open while in use."""
    flavour = weights_flavour(directory)
    if flavour == FLAX:
        try:
            tree = serialization.msgpack_restore((directory / FLAX_FILE).read_bytes())
        except Exception as e:  # msgpack's errors for a truncated file are of many types
            raise _damaged(directory / FLAX_FILE, e) from None
        if set(tree) == {"params"}:  # some writers keep Flax's top-level collection
            tree = tree["params"]
        arrays = {".".join(map(str, k)): np.asarray(v) for k, v in traversals.flatten_mapping(tree).items()}
        dtypes = {n: a.dtype.name for n, a in arrays.items()}
        yield FLAX, {n: a.shape for n, a in arrays.items()}, dtypes, lambda name, index: arrays[name][index]
        return
    with contextlib.ExitStack() as stack:
        handles = {}  # tensor name -> open safetensors file
        for file in _safetensors_files(directory):
            opener = _ObjectSafetensors if paths.is_remote(file) else safe_open
            try:
                f = stack.enter_context(opener(os.fspath(file), framework="numpy"))
            except FileNotFoundError:
                raise
            except Exception as e:  # safetensors' SafetensorError: a short or garbled header
                raise _damaged(file, e) from None
            for name in f.keys():
                handles[name] = f
        slices = {n: f.get_slice(n) for n, f in handles.items()}
        shapes = {n: tuple(s.get_shape()) for n, s in slices.items()}
        dtypes = {n: _DTYPES.get(s.get_dtype(), s.get_dtype()) for n, s in slices.items()}

        def reader(name: str, index: layout.Index) -> np.ndarray:
            return slices[name][index] if index else handles[name].get_tensor(name)

        yield SAFETENSORS, shapes, dtypes, reader


def _read_config(directory: epath.Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise FileNotFoundError(f"HF checkpoint directory {str(directory)!r} does not exist.")
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{str(config_file)!r} not found; a HF checkpoint needs its config.json.")
    return _read_json(config_file)


def _read_json(file: epath.Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON ({e}): the file is damaged; download it again") from None


def _damaged(file: Any, e: Exception) -> ValueError:
    return ValueError(
        f"{file} cannot be read ({type(e).__name__}: {str(e)[:200]}): the file is damaged (truncated or "
        "overwritten); download it again"
    )


def _safetensors_files(directory: epath.Path) -> list[epath.Path]:
    """The safetensors file(s) of ``directory``, sharded (``model.safetensors.index.json``) or not."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({directory / f for f in _read_json(index)["weight_map"].values()})
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
    raise FileNotFoundError(
        f"{directory} has no weights: no model.safetensors, model.safetensors.index.json or {FLAX_FILE}."
    )


class _ObjectSafetensors:
    """``safe_open`` for a safetensors file on an object store (gs://): the header is read once,
    and each block as the byte range of the leading-axis rows it covers (safetensors stores
    tensors row-major), so a device's block costs about its own bytes."""

    _NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "I64": np.int64,
              "I32": np.int32}  # fmt: skip

    def __init__(self, file: str, framework: str = "numpy"):
        self._file = epath.Path(file)
        self._handle = self._file.open("rb")
        (size,) = np.frombuffer(self._handle.read(8), "<u8")
        header = json.loads(self._handle.read(int(size)))
        header.pop("__metadata__", None)
        self._base, self._header = 8 + int(size), header

    def __enter__(self) -> _ObjectSafetensors:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._handle.close()

    def keys(self) -> list[str]:
        return list(self._header)

    def get_slice(self, name: str) -> _ObjectSlice:
        return _ObjectSlice(self, name)

    def get_tensor(self, name: str) -> np.ndarray:
        return self.get_slice(name)[()]

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        entry = self._header[name]
        if entry["dtype"] not in self._NUMPY:
            raise ValueError(f"{self._file}: tensor {name} has dtype {entry['dtype']}, not a T5 weight's")
        dtype, shape = np.dtype(self._NUMPY[entry["dtype"]]), tuple(entry["shape"])
        row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        self._handle.seek(self._base + entry["data_offsets"][0] + start * row)
        data = self._handle.read((stop - start) * row)
        return np.frombuffer(data, dtype).reshape((stop - start, *shape[1:]))


class _ObjectSlice:
    def __init__(self, owner: _ObjectSafetensors, name: str):
        self._owner, self._name = owner, name
        self._entry = owner._header[name]

    def get_shape(self) -> list[int]:
        return list(self._entry["shape"])

    def get_dtype(self) -> str:
        return self._entry["dtype"]

    def __getitem__(self, index: layout.Index) -> np.ndarray:
        shape = self.get_shape()
        if not shape:
            return self._owner.rows(self._name, 0, 1).reshape(())
        index = index if isinstance(index, tuple) else (index,)
        first = index[0] if index else slice(None)
        start, stop, _ = first.indices(shape[0])
        return self._owner.rows(self._name, start, stop)[(slice(None), *index[1:])]


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


def tensor_map(c: ModelConfig, flavour: str = SAFETENSORS) -> dict[str, Tensor]:
    """Every required HF tensor of ``flavour`` (``"safetensors"``: torch names and ``[out, in]``
    weights; ``"flax"``: Flax names and ``[in, out]`` kernels), name -> where it goes in ours.
    The lm_head is not in it: whether there is one depends on the weights (see ``load_hf_t5``)."""
    D, F, N, H, V = c.d_model, c.d_ff, c.num_heads, c.head_dim, c.vocab_size
    torch = flavour == SAFETENSORS

    def name(module: str, leaf: str) -> str:  # leaf: "kernel" (a projection), "embedding" or "weight"
        return f"{module}.{'weight' if torch else leaf}"

    def kernel(path: tuple[Any, ...], shape: tuple[int, ...], axes: tuple[tuple[int, ...], ...]) -> Tensor:
        return Tensor(path, shape, axes[::-1] if torch else axes)  # torch Linear weights are [out, in]

    m = {name("shared", "embedding"): layout.same(("shared", "embedding"), (V, D))}
    for stack, layers in (("encoder", c.num_encoder_layers), ("decoder", c.num_decoder_layers)):
        bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias"
        buckets = c.relative_attention_num_buckets
        m[name(bias, "embedding")] = layout.same((stack, "relpos", "embedding"), (buckets, N))
        m[f"{stack}.final_layer_norm.weight"] = layout.same((stack, "final_norm", "scale"), (D,))
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
                at = f"{hf}.{j}.{module}"
                for p, q in (("q", "query"), ("k", "key"), ("v", "value")):  # [D, N*H] -> [D, N, H]
                    m[name(f"{at}.{p}", "kernel")] = kernel((*ours, attn, q), (D, N, H), ((0,), (1, 2)))
                m[name(f"{at}.o", "kernel")] = kernel((*ours, attn, "out"), (N, H, D), ((0, 1), (2,)))
                m[f"{hf}.{j}.layer_norm.weight"] = layout.same((*ours, norm, "scale"), (D,))
            j = len(attentions)
            # HF's relu MLP has one input matrix `wi`; ours calls it wi_0.
            inputs = ("wi_0", "wi_1") if c.mlp_activation == "gated-gelu" else ("wi",)
            mlp = f"{hf}.{j}.DenseReluDense"
            for k, wi in enumerate(inputs):
                m[name(f"{mlp}.{wi}", "kernel")] = kernel((*ours, "mlp", f"wi_{k}"), (D, F), ((0,), (1,)))
            m[name(f"{mlp}.wo", "kernel")] = kernel((*ours, "mlp", "wo"), (F, D), ((0,), (1,)))
            m[f"{hf}.{j}.layer_norm.weight"] = layout.same((*ours, "mlp_norm", "scale"), (D,))
    return m
