"""Any starting checkpoint, recognized by its files: ours, HuggingFace (safetensors or Flax), T5X.

``load_any`` is what ``convert --src``, uptraining's ``source=`` and fine-tuning's ``init=``
call, so every one of them accepts the same checkpoints and records which kind it found.
"""

from __future__ import annotations

import json
import os

from etils import epath
from jax.sharding import Mesh

from gqa_jax import paths
from gqa_jax.checkpoints import hf, orbax, t5x
from gqa_jax.config import ModelConfig
from gqa_jax.model import T5

KINDS = ("gqa_jax", "huggingface", "huggingface_flax", t5x.LEGACY, t5x.ORBAX)
_DESCRIPTIONS = (
    "a gqa_jax checkpoint (checkpoint.json)",
    "a HuggingFace T5 directory (config.json with d_kv, and model.safetensors[.index.json] or "
    f"{hf.FLAX_FILE})",
    "a T5X checkpoint_N directory (a `checkpoint` msgpack file, or an orbax `state/` directory)",
)


def kind_of(path: str | os.PathLike) -> str | None:
    """Which of ``KINDS`` the directory ``path`` holds, None if none."""
    path = epath.Path(path)
    if (path / orbax.MARKER).is_file():
        return "gqa_jax"
    if _is_hf_config(path / "config.json"):
        flavour = hf.weights_flavour(path)
        if flavour is not None:
            return "huggingface" if flavour == hf.SAFETENSORS else "huggingface_flax"
    return t5x.layout_of(path)


def check_source(path: str | os.PathLike) -> str:
    """The kind of the checkpoint at ``path``, from its files alone (nothing loaded): what a
    command checks before slower work (a vocabulary, a dataset); FileNotFoundError or ValueError
    naming what is wrong."""
    path = paths.resolve(path, "source")
    if not path.exists():
        raise FileNotFoundError(f"source {path} does not exist")
    kind = kind_of(path)
    if kind is None:
        config = path / "config.json"
        if config.is_file() and not _is_hf_config(config) and hf.weights_flavour(path) is not None:
            raise ValueError(
                f"source {path} has HuggingFace weights but its config.json is not a T5 config "
                f"(unreadable, truncated or of another model): download {config} again"
            )
        raise ValueError(f"source {path} is not a checkpoint: expected " + "; or ".join(_DESCRIPTIONS))
    return kind


def load_any(
    path: str | os.PathLike, *, mesh: Mesh | None = None, param_dtype: str | None = None
) -> tuple[T5, ModelConfig, str]:
    """Load ``path`` as ``(model, config, kind)``, ``kind`` one of ``KINDS``; with ``mesh`` the
    parameters are created sharded (each device reading its block where the format allows), with
    ``param_dtype`` cast to it as they are read (e.g. ``"bfloat16"`` for decoding)."""
    kind = check_source(path)
    path = paths.resolve(path, "source")
    if kind == "gqa_jax":
        model, config = orbax.load(path, mesh=mesh, param_dtype=param_dtype)
    elif kind in ("huggingface", "huggingface_flax"):
        model, config = hf.load_hf_t5(path, mesh=mesh, param_dtype=param_dtype)
    else:
        model, config = t5x.load_t5x(path, mesh=mesh, param_dtype=param_dtype)
    return model, config, kind


def _is_hf_config(config: epath.Path) -> bool:
    if not config.is_file():
        return False
    try:
        fields = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(fields, dict) and "d_kv" in fields
