"""Import T5X and Flaxformer T5 checkpoints: the public T5.1.1 checkpoints the paper starts from.

Two layouts, both read through TensorStore (each tensor, or one device's slice of it, alone):

- legacy (T5X's own checkpointer, e.g. ``gs://t5-data/pretrained_models/t5x/t5_1_1_base/
  checkpoint_1000000``): a file ``checkpoint``, the msgpack (flax serialization) of
  ``{"version": 3, "optimizer": {"target": params, "state": optimizer state}}``. Each large
  leaf is a TensorStore spec (a dict with ``driver: "zarr"``, a ``kvstore`` whose ``path`` is
  relative to the checkpoint directory, and ``metadata``) naming a sibling zarr directory such
  as ``target.encoder.layers_0.attention.query.kernel``; small leaves may be inline arrays.
  Version 2 stored bfloat16 as uint16, which is reinterpreted.
- orbax (newer T5X): ``checkpoint_N/state/``, an orbax PyTree checkpoint of the same
  ``{"target": ..., "state": ...}`` tree; ``_METADATA`` lists the arrays, which are zarr arrays
  in the directory (or in its OCDBT database).

Only ``target`` (the parameters) is read. T5X's ``examples/t5/network.py`` and Flaxformer's T5
name them alike; ours in brackets:

    token_embedder.embedding [V, D]                          (shared.embedding)
    {encoder,decoder}.relpos_bias.rel_embedding [N, buckets] (relpos.embedding [buckets, N])
    encoder.layers_i.pre_attention_layer_norm.scale          (attn_norm.scale)
    encoder.layers_i.attention.{query,key,value,out}.kernel  (attn.*)
    decoder.layers_i.pre_self_attention_layer_norm.scale, .self_attention.*,
        .pre_cross_attention_layer_norm.scale, .encoder_decoder_attention.*  (self_attn*, cross_attn*)
    *.layers_i.pre_mlp_layer_norm.scale, .mlp.{wi_0,wi_1,wo}.kernel (relu: .mlp.wi)  (mlp_norm, mlp)
    encoder.encoder_norm.scale, decoder.decoder_norm.scale   (final_norm.scale)
    decoder.logits_dense.kernel [D, V]                       (lm_head)

Attention kernels are 2-D with the heads merged, ``query [D, N*H]``, ``out [N*H, D]`` (or 3-D,
``[D, N, H]`` / ``[N, H, D]``, when written with split head kernels); ``key`` / ``value`` hold
``[D, K*H]``: Flaxformer's multi-query attention stores them without a head axis, ``[D, H]``,
which is K = 1. No ``logits_dense`` means the logits come from the embedding, scaled by
``d_model**-0.5`` (T5 1.0): our tied model. As in T5 the 1/sqrt(H) of the attention logits is
folded into the query kernel, so the weights map as they are.

A checkpoint holds no hyperparameters beyond its shapes: ``relative_attention_max_distance``
(128), ``layer_norm_epsilon`` (1e-6) and dropout (0) take ``ModelConfig``'s defaults unless a
``config`` is passed (e.g. ``preset("xxl")``), which is then checked against every shape.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import tensorstore as ts
from etils import epath
from flax import serialization
from jax.sharding import Mesh

from gqa_jax import model as model_lib
from gqa_jax.checkpoints import layout
from gqa_jax.checkpoints.layout import Tensor
from gqa_jax.config import ModelConfig
from gqa_jax.model import T5

LEGACY, ORBAX = "t5x", "t5x_orbax"  # the two layouts, as `kind`s
# our attention kind -> (T5X stack, T5X layer norm, T5X attention, our norm, our attention)
_STACKS = {
    "encoder_self": ("encoder", "pre_attention_layer_norm", "attention", "attn_norm", "attn"),
    "decoder_self": ("decoder", "pre_self_attention_layer_norm", "self_attention", "self_attn_norm",
                     "self_attn"),
    "cross": ("decoder", "pre_cross_attention_layer_norm", "encoder_decoder_attention", "cross_attn_norm",
              "cross_attn"),
}  # fmt: skip
Shape = tuple[int, ...]
_LAYER = re.compile(r"^(encoder|decoder)\.layers_(\d+)\.")


def load_t5x(
    path: str | os.PathLike,
    *,
    config: ModelConfig | None = None,
    dtype: str = "float32",
    mesh: Mesh | None = None,
    param_dtype: str | None = None,
) -> tuple[T5, ModelConfig]:
    """Load the T5X checkpoint directory ``path`` (``checkpoint_N``, legacy or orbax layout) as
    ``(model, config)``.

    ``config`` None infers the model from the stored shapes (parameters keep the stored dtype,
    ``dtype`` is the activation dtype); a given ``config`` must match every shape. With ``mesh``
    every parameter is created sharded by the rule table, each device reading only its block.
    Raises ``FileNotFoundError`` when ``path`` is not a T5X checkpoint and ``ValueError`` listing
    every missing, unexpected and mis-shaped tensor at once.
    ``param_dtype`` (e.g. ``"bfloat16"`` for decoding) casts every parameter as it is read, so no
    device ever holds the stored-dtype copy; None keeps the stored dtype.
    """
    _, stores = open_t5x(path)
    shapes = {name: tuple(store.shape) for name, store in stores.items()}
    if config is None:
        config = infer_config(shapes, {n: _dtype_name(s) for n, s in stores.items()}, dtype=dtype)
    tensors = tensor_map(config, shapes)
    layout.check(tensors, shapes, f"T5X checkpoint {path} does not match the model ({_describe(config)})")

    def reader(name: str, index: layout.Index) -> np.ndarray:
        store = stores[name]
        try:
            block = (store[index] if index else store).read().result()
        except ValueError as e:  # TensorStore's errors for truncated / unreadable chunks
            raise ValueError(f"T5X checkpoint {path}: cannot read {name}: {e}") from e
        return block.view(ml_dtypes.bfloat16) if store.dtype.numpy_dtype == np.uint16 else block

    config = config.replace(param_dtype=param_dtype or config.param_dtype)
    params = layout.materialize(tensors, reader, config, mesh=mesh)
    return model_lib.build(config, params), config


def layout_of(path: str | os.PathLike) -> str | None:
    """``"t5x"`` (legacy) or ``"t5x_orbax"`` when ``path`` looks like a T5X checkpoint, else None."""
    root = epath.Path(path)
    if (root / "state" / "_METADATA").is_file() or (root / "_METADATA").is_file():
        return ORBAX
    return LEGACY if (root / "checkpoint").is_file() else None


def open_t5x(path: str | os.PathLike) -> tuple[str, dict[str, ts.TensorStore]]:
    """``(kind, {name: open TensorStore})`` of every ``target`` array of the checkpoint ``path``;
    names are dotted T5X names without the ``target.`` prefix."""
    root = epath.Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"T5X checkpoint directory {os.fspath(root)!r} does not exist.")
    kind = layout_of(root)
    if kind == ORBAX:  # checkpoint_N/state, or the `state` directory itself
        return ORBAX, _open_orbax(root / "state" if (root / "state").is_dir() else root)
    if kind == LEGACY:
        return LEGACY, _open_legacy(root)
    steps = sorted(p.name for p in root.iterdir() if p.name.startswith("checkpoint_"))
    hint = f"; it holds {steps}: pass one of them" if steps else ""
    raise FileNotFoundError(
        f"{os.fspath(root)} is not a T5X checkpoint: no `checkpoint` file (legacy layout) and no "
        f"`state/_METADATA` (orbax layout){hint}."
    )


def _open_legacy(root: epath.Path) -> dict[str, ts.TensorStore]:
    file = root / "checkpoint"
    try:
        contents = serialization.msgpack_restore(file.read_bytes())
    except Exception as e:  # msgpack's errors for truncated / foreign files are of many types
        raise ValueError(f"{os.fspath(file)}: not a readable T5X msgpack checkpoint ({e})") from e
    version = contents.get("version", 0) if isinstance(contents, dict) else None
    state = contents.get("optimizer", contents) if isinstance(contents, dict) else None
    if not isinstance(state, dict) or "target" not in state:
        raise ValueError(f"{os.fspath(file)}: no `optimizer.target` parameter tree in this T5X checkpoint.")
    if version is not None and version < 2:
        raise ValueError(f"{os.fspath(file)}: T5X checkpoint version {version}; versions 2 and 3 are read.")
    stores = {}
    for name, leaf in _leaves(state["target"]):
        if isinstance(leaf, Mapping) and {"driver", "kvstore"} <= set(leaf):
            stores[name] = _open(_resolve(dict(leaf), root, name), name, root)
        else:  # an inline array
            stores[name] = ts.array(np.asarray(leaf))
    return stores


def _resolve(spec: dict[str, Any], root: epath.Path, name: str) -> dict[str, Any]:
    """A T5X spec whose kvstore path is relative to ``root``, made absolute (local or gs://)."""
    kvstore = dict(spec.get("kvstore") or {})
    relative = kvstore.get("path", spec.pop("path", None))  # tensorstore < 0.1.14 kept `path` outside
    if relative is None:
        raise ValueError(f"{os.fspath(root)}: the TensorStore spec of {name} names no path: {spec}")
    spec.pop("metadata", None)  # the stored .zarray is the truth; its copy in the msgpack may be stale
    spec["kvstore"] = _kvstore(os.fspath(root), relative)
    return spec


def _kvstore(root: str, relative: str) -> dict[str, Any]:
    """The kvstore of ``relative`` under the directory ``root`` (a local path or gs://bucket/...)."""
    remote = re.fullmatch(r"gs://([^/]+)/?(.*)", root)
    if remote:
        return {"driver": "gcs", "bucket": remote.group(1), "path": os.path.join(remote.group(2), relative)}
    if "://" in root:
        raise ValueError(f"{root}: only local paths and gs:// are supported for T5X checkpoints")
    return {"driver": "file", "path": os.path.join(root, relative)}


def _open_orbax(state: epath.Path) -> dict[str, ts.TensorStore]:
    try:
        meta = json.loads((state / "_METADATA").read_text())
        entries = meta["tree_metadata"].values()
    except (ValueError, KeyError, AttributeError) as e:
        raise ValueError(f"{os.fspath(state / '_METADATA')}: not an orbax PyTree metadata file ({e})") from e
    driver = "zarr3" if meta.get("use_zarr3") else "zarr"
    stores = {}
    for entry in entries:
        keys = [str(k["key"]) for k in entry["key_metadata"]]
        if keys[0] != "target" or entry["value_metadata"].get("value_type") == "scalar":
            continue
        name = ".".join(keys)
        if meta.get("use_ocdbt"):
            kvstore = {"driver": "ocdbt", "base": _kvstore(os.fspath(state), ""), "path": name}
        else:
            kvstore = _kvstore(os.fspath(state), name)
        stores[name[len("target.") :]] = _open({"driver": driver, "kvstore": kvstore}, name, state)
    if not stores:
        raise ValueError(f"{os.fspath(state)}: the orbax checkpoint holds no `target` arrays.")
    return stores


def _open(spec: dict[str, Any], name: str, root: epath.Path) -> ts.TensorStore:
    try:
        return ts.open(spec, open=True, read=True).result()
    except ValueError as e:
        raise ValueError(f"T5X checkpoint {os.fspath(root)}: cannot open {name}: {e}") from e


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted names and leaves of a nested dict; a dict holding a TensorStore spec is a leaf."""
    items = []
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and not {"driver", "kvstore"} <= set(value):
            items += _leaves(value, f"{name}.")
        else:
            items.append((name, value))
    return items


def _dtype_name(store: ts.TensorStore) -> str:
    numpy_dtype = store.dtype.numpy_dtype
    return "bfloat16" if numpy_dtype == np.uint16 else np.dtype(numpy_dtype).name


# ------------------------------------------------------------------------------ names and shapes
def infer_config(
    shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str], *, dtype: str
) -> ModelConfig:
    """The ``ModelConfig`` the stored shapes imply (defaults for what shapes cannot show)."""
    needed = [
        "token_embedder.embedding",
        "encoder.relpos_bias.rel_embedding",
        "encoder.layers_0.attention.query.kernel",
    ]
    gated = "encoder.layers_0.mlp.wi_0.kernel" in shapes
    needed.append("encoder.layers_0.mlp.wi_0.kernel" if gated else "encoder.layers_0.mlp.wi.kernel")
    keys = {kind: f"{s}.layers_0.{attn}.key.kernel" for kind, (s, _, attn, _, _) in _STACKS.items()}
    missing = [n for n in (*needed, *keys.values()) if n not in shapes]
    if missing:
        raise ValueError(
            f"cannot infer the model from this T5X checkpoint: it lacks {missing}; is it a T5 "
            "encoder-decoder? Pass config= to check it against a known model instead."
        )
    V, D = shapes["token_embedder.embedding"]
    N, buckets = shapes["encoder.relpos_bias.rel_embedding"]
    query = shapes["encoder.layers_0.attention.query.kernel"]
    H = query[2] if len(query) == 3 else query[1] // N
    kv = {kind: (s[1] if len(s) == 3 else s[1] // H) for kind, s in ((k, shapes[n]) for k, n in keys.items())}
    grouped = tuple(kind for kind, k in kv.items() if k != N)
    if len({kv[kind] for kind in grouped}) > 1:
        raise ValueError(
            f"T5X checkpoint: K/V heads per attention {kv} differ between grouped attentions; "
            "a ModelConfig has one num_kv_heads."
        )
    layers = {stack: {int(m.group(2)) for m in map(_LAYER.match, shapes) if m and m.group(1) == stack}
              for stack in ("encoder", "decoder")}  # fmt: skip
    fields = {"grouped_attentions": grouped} if grouped else {}
    return ModelConfig(
        vocab_size=V,
        d_model=D,
        d_ff=shapes[needed[-1]][1],
        num_encoder_layers=len(layers["encoder"]),
        num_decoder_layers=len(layers["decoder"]),
        num_heads=N,
        head_dim=H,
        num_kv_heads=kv[grouped[0]] if grouped else N,
        relative_attention_num_buckets=buckets,
        tie_word_embeddings="decoder.logits_dense.kernel" not in shapes,
        mlp_activation="gated-gelu" if gated else "relu",
        dtype=dtype,
        param_dtype=layout.stored_dtype(dtypes.values()),
        **fields,
    )


def tensor_map(c: ModelConfig, shapes: Mapping[str, Shape] = {}) -> dict[str, Tensor]:  # noqa: B006
    """Every T5X tensor of a model ``c``, name -> where it goes in ours. Attention kernels are
    2-D (heads merged) unless ``shapes`` shows them 3-D."""
    D, F, N, H, V = c.d_model, c.d_ff, c.num_heads, c.head_dim, c.vocab_size

    def kernel(name: str, path: tuple[Any, ...], shape: tuple[int, ...], merged: tuple[tuple[int, ...], ...]):
        split = len(shapes.get(name, ())) == len(shape)  # stored with the head axis (3-D)
        return layout.same(path, shape) if split else Tensor(path, shape, merged)

    m = {"token_embedder.embedding": layout.same(("shared", "embedding"), (V, D))}
    for stack, layers in (("encoder", c.num_encoder_layers), ("decoder", c.num_decoder_layers)):
        buckets = c.relative_attention_num_buckets  # T5X [N, buckets], ours [buckets, N]
        m[f"{stack}.relpos_bias.rel_embedding"] = Tensor(
            (stack, "relpos", "embedding"), (buckets, N), ((1,), (0,))
        )
        m[f"{stack}.{stack}_norm.scale"] = layout.same((stack, "final_norm", "scale"), (D,))
        for i in range(layers):
            ours = (stack, "layers", i)
            for kind, (s, norm, attn, our_norm, our_attn) in _STACKS.items():
                if s != stack:
                    continue
                at, K = f"{stack}.layers_{i}.{attn}", c.kv_heads(kind)
                m[f"{stack}.layers_{i}.{norm}.scale"] = layout.same((*ours, our_norm, "scale"), (D,))
                for proj, heads in (("query", N), ("key", K), ("value", K)):  # [D, X*H] -> [D, X, H]
                    name = f"{at}.{proj}.kernel"
                    m[name] = kernel(name, (*ours, our_attn, proj), (D, heads, H), ((0,), (1, 2)))
                name = f"{at}.out.kernel"  # [N*H, D] -> [N, H, D]
                m[name] = kernel(name, (*ours, our_attn, "out"), (N, H, D), ((0, 1), (2,)))
            mlp = f"{stack}.layers_{i}.mlp"
            m[f"{stack}.layers_{i}.pre_mlp_layer_norm.scale"] = layout.same(
                (*ours, "mlp_norm", "scale"), (D,)
            )
            inputs = ("wi_0", "wi_1") if c.mlp_activation == "gated-gelu" else ("wi",)  # ours: wi_0
            for k, wi in enumerate(inputs):
                m[f"{mlp}.{wi}.kernel"] = layout.same((*ours, "mlp", f"wi_{k}"), (D, F))
            m[f"{mlp}.wo.kernel"] = layout.same((*ours, "mlp", "wo"), (F, D))
    if not c.tie_word_embeddings:
        m["decoder.logits_dense.kernel"] = layout.same(("lm_head",), (D, V))
    return m


def _describe(c: ModelConfig) -> str:
    return (
        f"vocab_size={c.vocab_size}, d_model={c.d_model}, d_ff={c.d_ff}, num_heads={c.num_heads}, "
        f"head_dim={c.head_dim}, num_kv_heads={c.num_kv_heads} in {list(c.grouped_attentions)}, "
        f"layers={c.num_encoder_layers}/{c.num_decoder_layers}, mlp={c.mlp_activation!r}, "
        f"tied={c.tie_word_embeddings}"
    )
