"""Checkpoints: our orbax format (`save` / `load`), importers (`load_hf_t5`, `load_t5x`) and
`load_any`, which recognizes each kind by its files; `clean_leftovers` tidies after a killed save."""

from gqa_jax.checkpoints.hf import load_hf_t5
from gqa_jax.checkpoints.orbax import clean_leftovers, load, save
from gqa_jax.checkpoints.sources import KINDS, kind_of, load_any
from gqa_jax.checkpoints.t5x import load_t5x

__all__ = ["KINDS", "clean_leftovers", "kind_of", "load", "load_any", "load_hf_t5", "load_t5x", "save"]
