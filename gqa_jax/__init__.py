"""gqa_jax: grouped-query attention (Ainslie et al., 2023) for T5.1.1 in JAX / Flax NNX."""

from gqa_jax import backends

backends.skip_absent_tpu()  # before any backend starts (gqa_jax/backends.py)

from gqa_jax.config import ModelConfig, preset  # noqa: E402
from gqa_jax.model import T5  # noqa: E402

__version__ = "0.1.0"
__all__ = ["ModelConfig", "T5", "preset", "__version__"]
