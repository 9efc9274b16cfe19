"""Checkpoints: our orbax format (`save` / `load`) and importers (`load_hf_t5`)."""

from gqa_jax.checkpoints.hf import load_hf_t5
from gqa_jax.checkpoints.orbax import load, save

__all__ = ["load", "load_hf_t5", "save"]
