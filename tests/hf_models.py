"""Tiny random HuggingFace T5 models for the parity tests (needs torch and transformers)."""

from __future__ import annotations

import torch
import transformers

V, D, DKV, F, N = 96, 32, 8, 48, 4
ENC_LAYERS, DEC_LAYERS = 3, 2  # different depths, so num_decoder_layers is really read


def tiny_hf_t5(
    *, ffn: str, tie: bool, separate_head: bool, buckets: int, max_distance: int, seed: int, vocab: int = V
):
    """A tiny random HF T5 whose weights make non-trivial logits (random norms and biases too)."""
    torch.manual_seed(seed)
    config = transformers.T5Config(
        vocab_size=vocab,
        d_model=D,
        d_kv=DKV,
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
