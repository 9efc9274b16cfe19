"""``python tests/eight_devices.py OUT_DIR VOCAB`` under
XLA_FLAGS=--xla_force_host_platform_device_count=8: every check of the suite that needs 8 simulated
CPU devices, in one process (one start-up, one JAX; started once per pytest worker by the
``eight_devices`` fixture of tests/conftest.py). Prints one JSON line per row, ``{"part": ...}``:

- ``equivalence`` (tests/sharded_equivalence.py): sharded init, a train step, greedy decoding and
  beam search against one device, per ``EQUIVALENCE_CASES``;
- ``decode`` (tests/sharded_decode.py): every K on the decode layout against one device;
- ``loading``, ``train`` (tests/sharded_loading.py): every checkpoint format loaded onto 2x4, and
  uptraining and fine-tuning from a checkpoint on 2x4, against one device;
- ``plan`` (tests/sharded_plan.py): ``plan`` on a 2x4 mesh, the cache and arguments per device.

A part that raises prints ``{"part": ..., "error": <traceback>}`` and the next part runs.
"""

import contextlib
import gc
import io
import json
import sys
import traceback
from pathlib import Path

gc.disable()  # its imports' objects live as long as it does: frozen below, never walked (tests/conftest.py)

import jax  # noqa: E402
import sharded_decode  # noqa: E402
import sharded_equivalence  # noqa: E402
import sharded_loading  # noqa: E402
import sharded_plan  # noqa: E402

gc.freeze()
gc.enable()

# Replicated (MQA on 8-way model) and sharded K/V heads with rows split too; the full matrix
# (every mesh and K in {1, 2, 8}) takes ~10 minutes here, so it is a script:
# XLA_FLAGS=--xla_force_host_platform_device_count=8 python
# tests/sharded_equivalence.py 1x8:1 1x8:2 1x8:8 2x4:1 2x4:2 2x4:8 4x2:1 4x2:2 4x2:8 8x1:1 8x1:2 8x1:8
EQUIVALENCE_CASES = ("1x8:1", "4x2:8:nobeam")
DECODE_CASES = tuple(f"{mesh}:{k}" for mesh in ("1x8", "2x4") for k in (1, 2, 4, 8))


def parts(out_dir: Path, vocab: str) -> dict:
    equivalence = [(p[0], int(p[1]), p[2:] != ["nobeam"]) for p in (c.split(":") for c in EQUIVALENCE_CASES)]
    decode = [(mesh, int(k)) for mesh, k in (c.split(":") for c in DECODE_CASES)]
    (out_dir / "loading").mkdir(parents=True, exist_ok=True)
    (out_dir / "train").mkdir(parents=True, exist_ok=True)
    return {
        "equivalence": lambda: sharded_equivalence.main(equivalence),
        "decode": lambda: sharded_decode.main(decode),
        "loading": lambda: sharded_loading.main(out_dir / "loading"),
        "train": lambda: sharded_loading.train_from_a_checkpoint(out_dir / "train", vocab),
        "plan": sharded_plan.main,
    }


def main(out_dir: Path, vocab: str) -> None:
    # No other process compiles these 8-device programs: writing each to the suite's persistent
    # compilation cache (tests/conftest.py) would only cost time (~3 s of this process's CPU).
    jax.config.update("jax_enable_compilation_cache", False)
    for name, run in parts(out_dir, vocab).items():
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                run()
        except Exception:  # the other parts still run; the test of this one fails with the traceback
            print(json.dumps({"part": name, "error": traceback.format_exc()}), flush=True)
        for line in printed.getvalue().splitlines():
            if line.startswith("{"):
                print(json.dumps({"part": name, **json.loads(line)}), flush=True)
        gc.collect()  # the part's garbage; what it left alive (jax's caches) is never walked again
        gc.freeze()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
