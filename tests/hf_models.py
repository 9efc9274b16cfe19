"""Tiny random HuggingFace T5 models for the parity tests (needs torch and transformers)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
import transformers

V, D, DKV, F, N = 96, 32, 8, 48, 4
ENC_LAYERS, DEC_LAYERS = 3, 2  # different depths, so num_decoder_layers is really read


def tiny_hf_t5(
    *,
    ffn: str,
    tie: bool,
    separate_head: bool,
    buckets: int,
    max_distance: int,
    seed: int,
    vocab: int = V,
    d_kv: int = DKV,
):
    """A tiny random HF T5 whose weights make non-trivial logits (random norms and biases too)."""
    torch.manual_seed(seed)
    config = transformers.T5Config(
        vocab_size=vocab,
        d_model=D,
        d_kv=d_kv,
        d_ff=F,
        num_heads=N,
        num_layers=ENC_LAYERS,
        num_decoder_layers=DEC_LAYERS,
        dropout_rate=0.0,
        feed_forward_proj=ffn,
        tie_word_embeddings=tie,
        relative_attention_num_buckets=buckets,
        relative_attention_max_distance=max_distance,
    )
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif "relative_attention_bias" in name or name == "shared.weight":
                p.normal_(0.0, 1.0)
            else:  # [out, in] Linear weights: unit-variance outputs
                p.normal_(0.0, p.shape[1] ** -0.5)
        if separate_head:  # transformers 5 ties lm_head to shared unless it gets its own Parameter
            model.lm_head.weight = torch.nn.Parameter(torch.randn(vocab, D) * D**-0.5)
    return model


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Encoder ids with 0, 3 and 6 right-padded positions; decoder ids starting with 0."""
    rng = np.random.default_rng(seed)
    enc = rng.integers(2, V, size=(3, 10))
    for row, pads in enumerate((0, 3, 6)):
        enc[row, enc.shape[1] - pads :] = 0
    dec = rng.integers(1, V, size=(3, 7))
    dec[:, 0] = 0
    return enc, dec


def max_logit_diff(hf_model, model) -> float:
    """The largest |logit| difference between the HF model and ours on ``batch()``."""
    enc, dec = batch()
    with torch.no_grad():
        ref = hf_model(
            input_ids=torch.tensor(enc),
            attention_mask=torch.tensor(enc != 0),
            decoder_input_ids=torch.tensor(dec),
        ).logits.numpy()
    ours = np.asarray(model(jnp.asarray(enc), jnp.asarray(dec)))
    assert ours.shape == ref.shape == (3, 7, V)
    assert np.abs(ref).max() > 1.0, "reference logits are trivial"
    return float(np.abs(ours - ref).max())
