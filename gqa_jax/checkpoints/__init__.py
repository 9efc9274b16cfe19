"""Checkpoints: our orbax format (`save` / `load`), importers (`load_hf_t5`, `load_t5x`) and
`load_any`, which recognizes each kind by its files (`check_source`: the kind alone, nothing
loaded); `clean_leftovers` tidies after a killed save."""

from gqa_jax.checkpoints.hf import load_hf_t5
from gqa_jax.checkpoints.orbax import clean_leftovers, load, save
from gqa_jax.checkpoints.sources import KINDS, check_source, kind_of, load_any
from gqa_jax.checkpoints.t5x import load_t5x

__all__ = [
    "KINDS", "check_source", "clean_leftovers", "kind_of", "load", "load_any", "load_hf_t5", "load_t5x",
    "save",
]  # fmt: skip
