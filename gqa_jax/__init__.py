"""gqa_jax: grouped-query attention (Ainslie et al., 2023) for T5.1.1 in JAX / Flax NNX."""

import gc
import sys

# A ``python -m gqa_jax ...`` process (``-m`` is argv[0] while Python imports the package) is the
# command's alone, and what importing jax, flax and the package makes lives as long as it does:
# no garbage collection while they import, then out of the collector's sight (``gc.freeze``), so
# neither the import, the command nor the exit walks it. 0.3-0.5 s of a command's start and end.
_OWN_PROCESS = sys.argv[:1] == ["-m"] and gc.isenabled()
if _OWN_PROCESS:
    gc.disable()

from gqa_jax import backends  # noqa: E402

backends.skip_absent_tpu()  # before any backend starts (gqa_jax/backends.py)

from gqa_jax.config import ModelConfig, preset  # noqa: E402
from gqa_jax.model import T5  # noqa: E402

if _OWN_PROCESS:
    gc.freeze()
    gc.enable()

__version__ = "0.1.0"
__all__ = ["ModelConfig", "T5", "preset", "__version__"]
