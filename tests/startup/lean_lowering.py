"""The suite's MLIR contexts hold only the dialects JAX's lowering uses (a test-suite setting, like
the XLA flags of tests/conftest.py: what a test checks does not depend on it).

jax 0.10.2 makes a new MLIR context for every function it lowers, and loads every dialect it links
into it (``mlir.make_ir_context``: ``load_all_available_dialects``), Pallas's included: 6 ms a
context (1 ms here), of a tiny function's 45 ms from ``jax.jit`` to a compiled program. Here
the context loads ``func`` and JAX's own dialects (StableHLO, CHLO, MHLO, Shardy, MPMD), which are
all that JAX's lowering outside Pallas emits; an operation of any other dialect fails to build
(``operation was not registered``), it does not lower differently.

``install()`` patches ``jax._src.interpreters.mlir`` now if it is imported, else when it is (an
import hook: nothing imports JAX earlier than it would have). A JAX whose function differs from the
one replaced is left alone. tests/startup/sitecustomize.py calls it at every start of a process of
the suite (tests/conftest.py puts tests/startup on ``PYTHONPATH``).
"""

import importlib.abc
import importlib.machinery
import sys

MODULE = "jax._src.interpreters.mlir"
DIALECTS = ("func",)  # from the upstream registry; JAX's own dialects register themselves


def _lean(mlir, dialects):
    def make_ir_context():
        context = mlir.JaxIrContext()
        context.append_dialect_registry(mlir.upstream_dialects)
        for name in DIALECTS:
            context.dialects[name]  # loads it
        context.set_thread_pool(mlir.global_thread_pool)
        dialects.sdy.register_dialect(context)
        dialects.mpmd.register_dialect(context)
        dialects.mhlo.register_mhlo_dialect(context)
        dialects.chlo.register_dialect(context)
        dialects.hlo.register_dialect(context)
        return context

    return make_ir_context


def _patch(mlir) -> None:
    from jax._src.lib.mlir import dialects

    code = getattr(mlir.make_ir_context, "__code__", None)
    names = set(code.co_names) if code else set()
    if "load_all_available_dialects" not in names or not hasattr(mlir, "JaxIrContext"):
        return  # not the function this replaces
    mlir.make_ir_context = _lean(mlir, dialects)


class _Hook(importlib.abc.MetaPathFinder):
    """Patches the module right after its own code has run."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if MODULE in sys.modules:
        _patch(sys.modules[MODULE])
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
