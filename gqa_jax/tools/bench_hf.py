"""The HuggingFace side of ``bench decode`` (table d): whether HF can run here, where, the parity
check of its logits against ours on the same weights (``checkpoints.hf_export.to_hf``), and its
``generate`` timed by the same rule as ours (``measurement.measure``). ``torch`` and ``transformers``
are imported on call."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gqa_jax.config import ModelConfig
from gqa_jax.model import T5
from gqa_jax.tools.measurement import measure, on_accelerator


def hf_unavailable(dtype: str = "float32") -> str | None:
    """None if HF can run beside us at ``dtype`` (on our device kind), else the reason."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        return "skipped: transformers/torch not installed"
    if on_accelerator() and not torch.cuda.is_available():
        return f"skipped: JAX runs on {jax.default_backend()} but torch sees no CUDA device"
    if hf_device() == "cpu" and dtype != "float32":
        return f"skipped: on the CPU the HF comparison runs at float32 only (--dtype {dtype})"
    return None


def hf_device() -> str:
    """Where HF runs: the GPU when JAX runs on one (and torch sees it), else the CPU."""
    import torch

    return "cuda" if on_accelerator() and torch.cuda.is_available() else "cpu"


def hf_parity(hf, model: T5, config: ModelConfig, seed: int) -> tuple[float, float]:
    """Max |logits difference| of HF vs ours on a small batch (2 x 16 inputs, 8 decoder tokens),
    and the largest |logit| (the scale a low-precision difference is judged against)."""
    import torch

    rng = np.random.default_rng(seed + 1)
    enc = rng.integers(2, config.vocab_size, size=(2, 16))
    dec = rng.integers(2, config.vocab_size, size=(2, 8))
    dec[:, 0] = 0
    device = next(hf.parameters()).device
    with torch.inference_mode():
        logits = hf(
            input_ids=torch.tensor(enc, device=device), decoder_input_ids=torch.tensor(dec, device=device)
        )
        ref = logits.logits.float().cpu().numpy()
    graphdef, params = nnx.split(model)
    forward = jax.jit(lambda p, e, d: nnx.merge(graphdef, p)(e, d))  # eager would compile op by op
    ours = np.asarray(forward(params, jnp.asarray(enc), jnp.asarray(dec)), np.float32)
    return float(np.abs(ours - ref).max()), float(np.abs(ref).max())


def bench_hf(hf, ids: np.ndarray, T: int, runs: int) -> dict[str, Any]:
    """HF ``generate``: greedy, KV cache on, exactly T new tokens; first call excluded."""
    import torch

    device = next(hf.parameters()).device
    input_ids = torch.tensor(ids, device=device)
    mask = input_ids != 0

    def generate():
        with torch.inference_mode():
            out = hf.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=T,
                min_new_tokens=T,
                num_beams=1,
                do_sample=False,
                use_cache=True,
                decoder_start_token_id=0,
            )
        if device.type == "cuda":
            torch.cuda.synchronize()  # block_until_ready for torch
        return out

    timing, out = measure(generate, runs)
    if out.shape != (ids.shape[0], T + 1):  # the start token, then T new tokens
        raise RuntimeError(f"HF generate returned shape {tuple(out.shape)}, expected {(ids.shape[0], T + 1)}")
    return {
        **timing,
        "tokens": out[:, 1:].cpu().numpy(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
    }
