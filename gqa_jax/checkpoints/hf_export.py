"""Export our (MHA) ``T5`` to a HuggingFace ``transformers.T5ForConditionalGeneration``.

The import table of ``checkpoints/hf.py`` (:func:`gqa_jax.checkpoints.hf.tensor_map`) read
backwards (``Tensor.to_stored``): ours ``[D, N, H]`` -> HF ``[N*H, D]``, ``[N, H, D]`` ->
``[D, N*H]``, ``[D, F]`` -> ``[F, D]`` (torch ``Linear`` weights are ``[out, in]``); embeddings,
the relative position tables and the norms as they are. HF T5 has no K/V-head option and
scales the decoder output only with tied embeddings, so only an MHA model with an untied
``lm_head`` (T5.1.1) is exported. ``torch`` and ``transformers`` are imported on call.
"""

from __future__ import annotations

import numpy as np

from gqa_jax import model as model_lib
from gqa_jax.checkpoints.hf import tensor_map
from gqa_jax.config import ModelConfig
from gqa_jax.model import T5


def to_hf(model: T5, config: ModelConfig, device: str = "cpu", dtype: str = "float32"):
    """A ``transformers.T5ForConditionalGeneration`` holding ``model``'s (MHA) weights, on
    ``device`` at ``dtype`` (in eval mode, no random initialization)."""
    import torch
    import transformers

    grouped = [
        kind
        for kind in ("encoder_self", "decoder_self", "cross")
        if config.kv_heads(kind) != config.num_heads
    ]
    if grouped or config.tie_word_embeddings:
        raise ValueError(f"to_hf: HF T5 needs MHA and an untied lm_head; grouped={grouped}")
    hf_config = transformers.T5Config(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        d_kv=config.head_dim,
        d_ff=config.d_ff,
        num_layers=config.num_encoder_layers,
        num_decoder_layers=config.num_decoder_layers,
        num_heads=config.num_heads,
        relative_attention_num_buckets=config.relative_attention_num_buckets,
        relative_attention_max_distance=config.relative_attention_max_distance,
        dropout_rate=0.0,
        layer_norm_epsilon=config.layer_norm_epsilon,
        feed_forward_proj=config.mlp_activation,
        tie_word_embeddings=False,  # transformers 5: "do not scale the decoder output"
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    with torch.device("meta"):  # no random init; every parameter is assigned below
        hf = transformers.T5ForConditionalGeneration(hf_config)
    flat = model_lib.flat_params(model)

    def assign(name: str, array: np.ndarray) -> torch.nn.Parameter:
        module_name, _, leaf = name.rpartition(".")
        param = torch.nn.Parameter(torch.from_numpy(np.array(array, dtype=np.float32)), requires_grad=False)
        setattr(hf.get_submodule(module_name), leaf, param)
        return param

    for name, tensor in tensor_map(config).items():
        assign(name, tensor.to_stored(np.asarray(flat[tensor.path])))
    shared = hf.shared.weight
    hf.encoder.embed_tokens.weight = shared  # HF ties these to `shared` at init (not on meta)
    hf.decoder.embed_tokens.weight = shared
    assign("lm_head.weight", np.asarray(flat[("lm_head",)]).T)  # untied (T5.1.1)
    left = [n for n, t in [*hf.named_parameters(), *hf.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"to_hf: parameters not assigned: {left}")
    return hf.to(device=device, dtype=getattr(torch, dtype)).eval()
