"""Shared fixtures, built once per test session: a tiny SentencePiece vocabulary, and the
embedded suite's corpus and docsum datasets from 16 stdlib files (for the subprocess tests).

The session's processes (both xdist workers and every subprocess a test starts) share five
settings, all about compile time, which is most of this suite's time (tiny programs, each run a
few times); what the tests check does not depend on them (the suite passes either way; benchmarks
are not tests), and docs/results/testing.md has what each saved:
- XLA's LLVM optimization off (``--xla_backend_optimization_level=0``);
- XLA:CPU's older elemental emitters instead of its MLIR fusion emitters
  (``--xla_cpu_use_fusion_emitters=false``): they compile tiny fusions faster;
- each program's machine code generated in one piece, not split for threads
  (``--xla_cpu_parallel_codegen_split_count=1``): the two workers keep both cores busy already;
- one JAX persistent compilation cache: many tests compile the same programs, in other processes;
- MLIR contexts that hold only the dialects JAX's lowering uses (tests/startup/lean_lowering.py, in
  every process through tests/startup/sitecustomize.py on ``PYTHONPATH``).
"""

import fcntl
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import xla_env

CORPUS_WORDS = (
    "the quick brown fox jumps over lazy dog summarize translate question context answer def return "
    "class import self value list dict alpha beta gamma delta epsilon zeta eta theta iota kappa lambda "
    "mu nu xi omicron pi rho sigma tau upsilon phi chi psi omega"
).split()


STARTUP = Path(__file__).resolve().parent / "startup"  # the suite's processes load its sitecustomize
CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
COSTS_ENV = "GQA_JAX_TEST_COSTS"  # a folder: what each test's time pays for (tests/suite_costs/)
FAST_COMPILE = (
    "--xla_backend_optimization_level=0",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
)


def pytest_configure(config):
    # Importing the test files (jax, flax, orbax, ...) makes millions of objects that live as long as
    # the process: no garbage collection walks them, neither while they are made (collection: 9.2 ->
    # 5.4 s of CPU per process) nor during the tests (``pytest_collection_finish``: frozen). Only
    # where the tests are collected: xdist's controller collects none, and would never turn it back on.
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        gc.disable()
    # In the controller (or a run without xdist), before any worker starts or jax compiles:
    # the workers and their subprocesses inherit the environment. Flags and a cache the user set
    # are kept.
    if costs := _costs():  # this process's subprocesses are its test's (tests/suite_costs/)
        os.environ[costs.WORKER_ENV] = str(os.getpid())
    sys.path.append(str(STARTUP))
    import lean_lowering

    lean_lowering.install()  # here too where this process did not start with tests/startup on its path
    if hasattr(config, "workerinput"):
        return
    # after any folder the user put there: a sitecustomize of theirs (tests/suite_costs/) runs instead
    # of tests/startup's, and installs the same
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, str(STARTUP)])
    flags = os.environ.get("XLA_FLAGS", "")
    for flag in FAST_COMPILE:
        if flag.split("=")[0] not in flags:
            flags = f"{flags} {flag}".strip()
    os.environ["XLA_FLAGS"] = flags
    # The CPU decode kernels where the user's are (gqa_jax.cpu_kernels.library_path's default),
    # for the whole session: the tests that set their own XDG_CACHE_HOME do not compile them again.
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    os.environ.setdefault("GQA_JAX_KERNEL_DIR", os.path.join(cache, "gqa_jax"))
    if os.environ.get(CACHE_ENV):
        return
    config._gqa_jax_cache = tempfile.mkdtemp(prefix="gqa_jax_test_jax_cache_")
    os.environ[CACHE_ENV] = config._gqa_jax_cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")


def pytest_unconfigure(config):
    cache = getattr(config, "_gqa_jax_cache", None)
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
        del os.environ[CACHE_ENV]


@pytest.fixture(scope="session")
def small_vocab(tmp_path_factory):
    """A 300-piece vocabulary (plus 100 sentinels) over English-ish words and code punctuation."""
    from gqa_jax.data.vocab import train_vocab

    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(CORPUS_WORDS, 12)) + " (x, y): [1] = {2}." for _ in range(3000)]
    lines += ["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 :-_"] * 3
    out = tmp_path_factory.mktemp("vocab") / "spm.model"
    return train_vocab(lines, size=300, out=out)


@pytest.fixture(scope="session")
def suite_subset(tmp_path_factory):
    """``(data_dir, env)``: stdlib_corpus and stdlib_docsum built from the first 16 stdlib files,
    and the environment that selects that subset in a subprocess."""
    from gqa_jax.data import stdlib_extract, stdlib_suite

    env = dict(os.environ, **{stdlib_extract.MAX_FILES_ENV: "16"})
    env.pop(stdlib_extract.ROOT_ENV, None)
    data = tmp_path_factory.mktemp("suite")
    old = os.environ.get(stdlib_extract.MAX_FILES_ENV)
    os.environ[stdlib_extract.MAX_FILES_ENV] = "16"
    try:
        stdlib_suite.build_suite(data, names=("stdlib_corpus", "stdlib_docsum"), log=lambda _: None)
    finally:
        if old is None:
            del os.environ[stdlib_extract.MAX_FILES_ENV]
        else:
            os.environ[stdlib_extract.MAX_FILES_ENV] = old
    return data, env


def once_per_run(tmp_path_factory, name, make):
    """``make()``'s JSON-able result, made by one process of this test run (the first xdist worker
    to ask; the other waits for it and reads it) and kept in the run's base temporary directory."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's directory, above each worker's own
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / f"{name}.json"
        if not done.exists():
            done.write_text(json.dumps(make()))
        return json.loads(done.read_text())


@pytest.fixture(scope="session")
def eight_devices(tmp_path_factory, small_vocab):
    """``part -> rows``: what tests/eight_devices.py printed for that part (every check that needs 8
    simulated devices, in one process, once per test run); a part that raised fails the test that
    reads it, with its traceback."""
    here = Path(__file__).resolve().parent

    def run():
        out = tmp_path_factory.mktemp("eight_devices")
        proc = subprocess.run(
            [sys.executable, str(here / "eight_devices.py"), str(out), str(small_vocab.path)],
            env=xla_env.cpu_devices(8), capture_output=True, text=True, timeout=900, cwd=here.parent,
        )  # fmt: skip
        return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-3000:]}

    result = once_per_run(tmp_path_factory, "eight_devices", run)
    assert result["returncode"] == 0, result["stderr"]
    rows = [json.loads(line) for line in result["stdout"].splitlines() if line.startswith("{")]

    def read(part):
        if errors := [r["error"] for r in rows if r["part"] == part and "error" in r]:
            pytest.fail(f"tests/eight_devices.py, part {part}:\n{errors[0]}")
        return [{k: v for k, v in r.items() if k != "part"} for r in rows if r["part"] == part]

    return read


# The few tests that start other processes or whole training runs take a minute or more each,
# and each worker starts with some of them, so the suite does not end on one long tail. The
# README's command uses "--dist worksteal": worker 0 gets the first half of this order, worker 1
# the second, and an idle worker takes half of the other's queue (from its end). Worker 0 starts
# with the main job's test (its demo runs two runs at a time) and then, one after the other, the
# tests that start two or more JAX processes: side by side they oversubscribe the 2 cores
# (measured: the two-process resume took 118 s beside the demo, 74 s beside one-process tests).
# Worker 1 starts with the tests of the ``eight_devices`` fixture (all on one worker: its process
# runs once there) and the heavy one-process groups. (xdist's default "load" scheduling gave
# worker 0 every slow test in its first chunk: worker 1 sat idle for the last 4 minutes.)
EIGHT_DEVICES = (
    "test_sharding.py::test_sharded_init_train_step_and_decoding_equal_one_device_on_every_mesh",
    "test_sharding.py::test_every_k_decodes_on_the_decode_layout_as_on_one_device",
    "test_checkpoints_sharded.py",
    "test_plan.py::test_eight_devices_cache_and_arguments_per_device",
)
FIRST = (
    ("test_mini.py", "test_resume.py", "test_multihost.py"),
    (*EIGHT_DEVICES, "test_runner.py", "test_training.py", "test_plan.py"),
)


def pytest_collection_modifyitems(items):
    def place(item):  # (worker, rank) of a slow test, None for the rest
        name = item.nodeid.split("/")[-1]
        for worker, names in enumerate(FIRST):
            for rank, prefix in enumerate(names):
                if name.startswith(prefix):
                    return worker, rank
        return None

    heads = [sorted((it for it in items if (place(it) or (None,))[0] == w), key=place) for w in (0, 1)]
    rest = [it for it in items if place(it) is None]
    half = max(len(items) // 2 - len(heads[0]), 0)
    items[:] = heads[0] + rest[:half] + heads[1] + rest[half:]


def _costs():
    """tests/suite_costs/sitecustomize.py when this run measures what its time pays for."""
    module = sys.modules.get("sitecustomize")
    return module if os.environ.get(COSTS_ENV) and hasattr(module, "flush") else None


def pytest_collection_finish(session):
    gc.freeze()  # what the test files imported (pytest_configure)
    gc.enable()
    if costs := _costs():
        costs.flush("(collection)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    yield
    # What a test left alive (jax's caches of traces and executables, fixtures) is frozen too: the
    # collector then walks only what the next test makes, not the whole worker at every full
    # collection (the compile-heavy files' user CPU 76-78 -> 72 s, the same peak memory). The
    # garbage the test made is collected first.
    gc.collect()
    gc.freeze()
    if costs := _costs():
        costs.flush(item.nodeid)
