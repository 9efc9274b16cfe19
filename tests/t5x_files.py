"""T5X checkpoints written by the tests in T5X's documented layouts (legacy msgpack + zarr, and
orbax), and our model's weights under T5X's names. Shared by the import and sharded-loading tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from flax import serialization
from flax.nnx import traversals

from gqa_jax.model import flat_params


def write_legacy(directory: Path, tensors: dict[str, np.ndarray], *, inline: tuple[str, ...] = ()) -> Path:
    """T5X's legacy layout: zarr arrays (gzip) in sibling directories, a msgpack `checkpoint` of
    specs with paths relative to the directory; names in ``inline`` are stored in the msgpack."""
    directory.mkdir(parents=True)
    target = {}
    for name, array in tensors.items():
        if name in inline:
            target[name] = array
            continue
        relative = f"target.{name}"
        metadata = {"shape": list(array.shape), "chunks": [max(1, n // 2) for n in array.shape],
                    "compressor": {"id": "gzip"}, "dtype": array.dtype.str}  # fmt: skip
        spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": relative}, "metadata": metadata}
        store = ts.open(
            {**spec, "kvstore": {"driver": "file", "path": str(directory / relative)}}, create=True
        )
        store.result().write(array).result()
        target[name] = spec
    contents = {
        "version": 3,
        "optimizer": {"target": nest(target), "state": {"step": np.int32(1_000_000), "param_states": {}}},
    }
    (directory / "checkpoint").write_bytes(serialization.msgpack_serialize(contents))
    return directory


def write_orbax(directory: Path, tensors: dict[str, np.ndarray]) -> Path:
    """Newer T5X: an orbax PyTree checkpoint of {target, state} in checkpoint_N/state."""
    tree = {"target": nest(tensors), "state": {"step": np.int32(1_000_000)}}
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save(directory / "state", tree)
    return directory


def nest(flat: dict[str, object]) -> dict:
    return traversals.unflatten_mapping({tuple(k.split(".")): v for k, v in flat.items()})


# Each stack's attention sub-layers: (ours, HF module, T5X attention, T5X layer norm), in order.
SUBLAYERS = {
    "encoder": [("attn", "SelfAttention", "attention", "pre_attention_layer_norm")],
    "decoder": [
        ("self_attn", "SelfAttention", "self_attention", "pre_self_attention_layer_norm"),
        ("cross_attn", "EncDecAttention", "encoder_decoder_attention", "pre_cross_attention_layer_norm"),
    ],
}


def t5x_from_ours(source, *, split_query: bool = False) -> dict[str, np.ndarray]:
    """Our model's weights under T5X / Flaxformer names: kernels with heads merged (the query 3-D
    when ``split_query``), a single K/V head as Flaxformer's multi-query ``[D, H]``."""
    config = source.config
    ours = {".".join(map(str, p)): np.asarray(v) for p, v in flat_params(source).items()}
    t = {"token_embedder.embedding": ours["shared.embedding"], "decoder.logits_dense.kernel": ours["lm_head"]}
    for stack, layers in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
        t[f"{stack}.relpos_bias.rel_embedding"] = ours[f"{stack}.relpos.embedding"].T  # [N, buckets]
        t[f"{stack}.{stack}_norm.scale"] = ours[f"{stack}.final_norm.scale"]
        for i in range(layers):
            a, b = f"{stack}.layers.{i}", f"{stack}.layers_{i}"
            for mine, _, attn, norm in SUBLAYERS[stack]:
                q = ours[f"{a}.{mine}.query"]  # [D, N, H]
                t[f"{b}.{attn}.query.kernel"] = q if split_query else q.reshape(q.shape[0], -1)
                for kv in ("key", "value"):
                    k = ours[f"{a}.{mine}.{kv}"]  # [D, K, H]
                    t[f"{b}.{attn}.{kv}.kernel"] = k[:, 0] if k.shape[1] == 1 else k.reshape(k.shape[0], -1)
                t[f"{b}.{attn}.out.kernel"] = ours[f"{a}.{mine}.out"].reshape(-1, config.d_model)  # [N*H, D]
                t[f"{b}.{norm}.scale"] = ours[f"{a}.{mine}_norm.scale"]
            for m in ("wi_0", "wi_1", "wo"):
                t[f"{b}.mlp.{m}.kernel"] = ours[f"{a}.mlp.{m}"]
            t[f"{b}.pre_mlp_layer_norm.scale"] = ours[f"{a}.mlp_norm.scale"]
    return t
