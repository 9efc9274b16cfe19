"""Run by ``site`` at the start of every process of the test suite (tests/conftest.py puts this
folder on ``PYTHONPATH``): the suite's MLIR contexts hold only the dialects JAX's lowering uses
(lean_lowering.py)."""

import lean_lowering

lean_lowering.install()
