"""What the test suite's time pays for, per process: loaded at interpreter start (``site``) in
every process of a run with ``GQA_JAX_TEST_COSTS=DIR`` (tests/conftest.py puts this folder on
``PYTHONPATH``); does nothing without it.

Each process records the wall-clock spans of its imports (the outermost ones), of JAX's compiles
(tracing, lowering and XLA's compile, a persistent-cache hit included) and of a few gqa_jax
functions (data builds, model builds, training, decoding) and its waits on
child processes, and at exit appends its seconds per
category to ``DIR/<pid>.jsonl`` with the pytest worker it descends from (``GQA_JAX_TEST_WORKER``,
inherited) and when it ran: report.py gives it to the test that worker ran then.
An instant counts once, for the first category in ``CATEGORIES`` that covers it. A pytest worker
writes one line per test (``flush``). A process killed by a signal writes nothing. A child forked
without exec (by the sweep runner's fork server, gqa_jax/experiments/forks.py) starts its own
record at the fork.
"""

import atexit
import functools
import json
import os
import resource
import sys
import threading
import time

DIR_ENV, WORKER_ENV = "GQA_JAX_TEST_COSTS", "GQA_JAX_TEST_WORKER"
CATEGORIES = ("compile", "data", "model", "decode", "train", "import", "wait")
# module -> (category, attribute path) of the functions timed; "train" and "decode" hold the
# whole call (its compiles, model builds and data loading counted as those)
TIMED = {
    "gqa_jax.data.vocab": [("data", "train_vocab")],
    "gqa_jax.data.stdlib_suite": [("data", "build_suite")],
    "gqa_jax.model": [("model", "T5.__init__")],
    "gqa_jax.training.state": [("model", "init_state"), ("model", "create_state")],
    "gqa_jax.training.loop": [("train", "train")],
    "gqa_jax.decoding": [("decode", "greedy_decode"), ("decode", "sample_decode")],
    "gqa_jax.beam_search": [("decode", "beam_search")],
    # blocked on a child process or asleep: its time is the child's (or nobody's); the runner's
    # fork server waiting for a request or a child's exit, the runner waiting for its answer
    "subprocess": [("wait", "Popen.wait"), ("wait", "Popen.communicate")],
    "gqa_jax.experiments.forks": [("wait", "_readable"), ("wait", "_await")],
    "time": [("wait", "sleep")],
}
COMPILE_EVENTS = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration")

_spans: dict[str, list[tuple[float, float]]] = {c: [] for c in CATEGORIES}
_compiles: dict[str, float] = {}  # compile event -> its seconds since the last flush
_state = {"start": time.time(), "cpu": 0.0, "depth": 0}


def _timed(category, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            if category != "wait" or threading.current_thread() is threading.main_thread():
                _spans[category].append((t0, time.time()))

    return wrapper


class _TimedStep:
    """A train step (a jitted function) whose calls are timed; its other attributes (``lower``)
    are the step's."""

    def __init__(self, step):
        self._step, self._call = step, _timed("train", step)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._step, name)


def _wrap_train_step(make):
    @functools.wraps(make)
    def wrapper(*args, **kwargs):
        return _TimedStep(make(*args, **kwargs))

    return wrapper


def _patch(name, module):
    for category, path in TIMED.get(name, ()):
        *owner_path, attr = path.split(".")
        owner = module
        for part in owner_path:
            owner = getattr(owner, part)
        if hasattr(owner, attr):
            setattr(owner, attr, _timed(category, getattr(owner, attr)))
    if name == "gqa_jax.training.step":
        module.make_train_step = _wrap_train_step(module.make_train_step)
    if name == "jax._src.monitoring":
        module.register_event_time_span_listener(_on_compile)


def _on_compile(event, start, end, **_):
    name = event.rsplit("/", 1)[-1]
    if name in COMPILE_EVENTS:
        _spans["compile"].append((start, end))
        _compiles[name] = _compiles.get(name, 0.0) + end - start  # nested traces counted twice


def _hook_imports():
    import _frozen_importlib as bootstrap

    find_and_load = bootstrap._find_and_load

    def timed_find_and_load(name, import_):
        outer = _state["depth"] == 0
        _state["depth"] += 1
        t0 = time.time()
        try:
            module = find_and_load(name, import_)
        finally:
            _state["depth"] -= 1
            if outer:
                _spans["import"].append((t0, time.time()))
        if name in TIMED or name in ("gqa_jax.training.step", "jax._src.monitoring"):
            _patch(name, module)
        return module

    bootstrap._find_and_load = timed_find_and_load
    for name in ("subprocess", "time"):
        _patch(name, __import__(name))


def _union(spans, start, end):
    """The spans clipped to [start, end], merged: a sorted list of disjoint spans."""
    out = []
    for a, b in sorted((max(a, start), min(b, end)) for a, b in spans):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _minus(spans, taken):
    """Seconds of ``spans`` outside ``taken`` (both disjoint and sorted)."""
    total, i = 0.0, 0
    for a, b in spans:
        total += b - a
        while i < len(taken) and taken[i][1] <= a:
            i += 1
        j = i
        while j < len(taken) and taken[j][0] < b:
            total -= min(b, taken[j][1]) - max(a, taken[j][0])
            j += 1
    return total


def _seconds(start, end):
    """Seconds per category in [start, end], each instant counted once (CATEGORIES' order)."""
    out, taken = {}, []
    for category in CATEGORIES:
        spans = _union(_spans[category], start, end)
        out[category] = round(_minus(spans, taken), 3)
        taken = _union(taken + spans, start, end)
    out["wall"] = round(end - start, 3)
    out["other"] = round(out["wall"] - sum(out[c] for c in CATEGORIES), 3)
    return out


def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def flush(test=None, kind="test"):
    """Append the seconds since the last flush to this process's file, under ``test``; ``cpu``:
    this process's CPU seconds (its children's not included)."""
    end, start, cpu = time.time(), _state["start"], _cpu()
    record = {"pid": os.getpid(), "kind": kind, "test": test, "worker": os.environ.get(WORKER_ENV),
              "start": start, "end": end, "argv": sys.argv[:6], "cpu": round(cpu - _state["cpu"], 3),
              **_seconds(start, end), "compiles": {k: round(v, 3) for k, v in _compiles.items()}}  # fmt: skip
    with open(os.path.join(os.environ[DIR_ENV], f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")
    for spans in _spans.values():  # the spans still open at ``end`` are lost: a rare, short overlap
        spans[:] = [s for s in spans if s[1] > end]
    _state["start"], _state["cpu"] = end, cpu
    _compiles.clear()


def _forked():
    """In a child forked without exec (the runner's fork server): a process of its own from now."""
    _state["start"], _state["cpu"] = time.time(), _cpu()
    for spans in _spans.values():
        spans.clear()
    _compiles.clear()


if os.environ.get(DIR_ENV):
    _hook_imports()
    atexit.register(flush, kind="process")
    os.register_at_fork(after_in_child=_forked)

# Found on PYTHONPATH before tests/startup's sitecustomize (tests/conftest.py puts that folder last),
# this one installs what that one does: the measured processes run as the suite's do.
try:
    import lean_lowering
except ImportError:  # not a process of the test suite
    pass
else:
    lean_lowering.install()
