"""A fork server for the sweep runner's local runs: a ``python -m gqa_jax <stage>`` process spends
2.7 s of CPU importing jax, flax, orbax and the package before it does anything, and a sweep has
tens of runs. The runner starts one ``Server`` (one import); it loads what the stage commands use,
starts no JAX backend, and forks a child per run that runs the command as ``python -m gqa_jax``
would: in a session of its own (the runner signals its process group), stdin /dev/null, its
output appended to the run's log, SIGKILL when the server dies (the server gets it when the
runner dies), its exit code (``-N`` when signal N ended it) reported back to the runner.

Protocol, one JSON object a line: the runner writes ``{"argv": [...], "log": PATH}`` (``argv``
after ``python -m gqa_jax``); the server answers ``{"pid": PID}`` once the child is forked, and
``{"ended": PID, "rc": RC}`` as soon as a child has exited (SIGCHLD wakes it); the runner, waiting
on that pipe (``Server.wait``), hears of it at once. It exits when the runner closes its stdin.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from gqa_jax import metric_writers

# What the stage commands import when they run (``train``, ``convert``, ``evaluate``, ``time``),
# cli/ and tools/ (floors above this one) among them: names imported in the server process only, as
# ``__main__`` imports a command's module, never used here. Loaded once before any fork, with
# tensorboardX (half a train run's imports; it loads when the run starts writing metrics).
PRELOAD = (
    "gqa_jax.cli.train",
    "gqa_jax.cli.convert",
    "gqa_jax.cli.evaluate",
    "gqa_jax.cli.time",
    "gqa_jax.run_config",
    "gqa_jax.distributed",
    "gqa_jax.training",
    "gqa_jax.calibration",
    "gqa_jax.convert",
    "gqa_jax.experiments.evaluate_stage",
    "gqa_jax.tools.t_infer",
)
SERVE = "from gqa_jax.experiments import forks; forks.serve()"  # the server's ``python -c``


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()  # looked up here: between fork and exec a child only makes the call


def die_with_parent() -> None:
    """In a child: SIGKILL when its parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)


def popen_quietly(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)`` without JAX's warning about any fork in a process that
    started a backend: the child execs at once (``preexec_fn``: one prctl, ``die_with_parent``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        return subprocess.Popen(argv, **kwargs)


class Forked:
    """A run the server forked, seen from the runner as a ``subprocess.Popen``: ``pid``,
    ``poll()`` (its exit code, ``-N`` for signal N, None while it runs), ``send_signal``."""

    def __init__(self, server: Server, pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.collect()
            self.returncode = self.server.ended.pop(self.pid, None)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)


class Server:
    """The runner's side: ``start`` forks a run from the server process, started (with ``env``,
    in ``cwd``) at the first run and ended by ``close``."""

    def __init__(self, env: dict[str, str], cwd: Any):
        self.env, self.cwd = env, cwd
        self.ended: dict[int, int] = {}  # pid -> exit code, not yet polled
        self._proc: subprocess.Popen | None = None
        self._children: set[int] = set()
        self._buffer = b""

    @staticmethod
    def serves(argv: Sequence[str]) -> bool:
        """Whether ``argv`` is a command of this package run by this interpreter, on Linux (macOS's
        system libraries are not safe to use in a child forked without an exec)."""
        return sys.platform.startswith("linux") and list(argv[:3]) == [sys.executable, "-m", "gqa_jax"]

    def start(self, argv: Sequence[str], log_path: str) -> Forked:
        """``argv`` (``python -m gqa_jax ...``) forked, its output appended to ``log_path``."""
        if self._proc is None:
            self._proc = popen_quietly(
                [sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                env=self.env, cwd=self.cwd, start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
            os.set_blocking(self._proc.stdout.fileno(), False)
        request = {"argv": list(argv[3:]), "log": str(log_path)}
        self._proc.stdin.write(json.dumps(request).encode() + b"\n")
        self._proc.stdin.flush()
        while True:
            for message in self._read(wait=True):
                if "pid" in message:
                    self._children.add(message["pid"])
                    return Forked(self, message["pid"])

    def collect(self) -> None:
        """Record the children the server says have ended (without waiting)."""
        if self._proc is not None:
            self._read(wait=False)

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` s, less if the server has something to say (a run ended)."""
        if self._proc is None or self._proc.stdout.closed or self._proc.poll() is not None:
            time.sleep(timeout)
        else:
            _await([self._proc.stdout.fileno()], timeout)

    def _read(self, wait: bool) -> list[dict]:
        """The server's messages that have come (with ``wait``, at least one: an error if it has
        ended); its end reads as every child killed (SIGKILL reaches them when it dies)."""
        fd, messages = self._proc.stdout.fileno(), []
        while True:
            if wait and not messages:
                select.select([fd], [], [])
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                if messages or not wait:
                    return messages
                continue
            if not data:
                self.ended.update(dict.fromkeys(self._children, -signal.SIGKILL))
                self._children.clear()
                if wait:
                    raise OSError(f"the runs' fork server (pid {self._proc.pid}) ended: see the output above")
                return messages
            self._buffer += data
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                message = json.loads(line)
                messages.append(message)
                if "ended" in message:
                    self._children.discard(message["ended"])
                    self.ended[message["ended"]] = message["rc"]

    def close(self) -> None:
        """End the server (its children have ended: the runner waited for them)."""
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait()
            self._proc.stdout.close()
            self._proc = None


# ---------------------------------------------------------------------------------- the server
def serve() -> None:
    """The server's loop (stdin: requests, stdout: answers; anything else printed goes to
    stderr): preload, then fork a child per request and report the children that end."""
    answers = os.dup(1)
    os.dup2(2, 1)
    for name in PRELOAD:
        importlib.import_module(name)
    metric_writers.load_tensorboardx()
    # What the preload made lives as long as the server and its children: out of the garbage
    # collector's sight (Python's advice for a fork without exec), a child's collections, its
    # last one at exit among them, no longer walk (and so copy) the server's memory. A quick-scale
    # evaluate run: 1.6 -> 1.1 s.
    gc.freeze()
    os.set_blocking(0, False)
    # a child's exit wakes the select below (SIGCHLD's handler does nothing; its wake-up fd is read)
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    buffer = b""
    while True:
        readable = _readable([0, woken])
        if woken in readable:
            os.read(woken, 4096)
        if 0 in readable:
            data = os.read(0, 65536)
            if not data:  # the runner closed our stdin, or died
                return
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                server = os.getpid()
                pid = os.fork()
                if pid == 0:
                    _run_child(request, answers, server, (woken, wake))  # never returns
                os.write(answers, json.dumps({"pid": pid}).encode() + b"\n")
        _report_ended(answers)


def _await(fds: list[int], timeout: float) -> None:
    """Wait up to ``timeout`` s for one of ``fds`` to be readable."""
    select.select(fds, [], [], timeout)


def _readable(fds: list[int]) -> list[int]:
    """Wait until one of ``fds`` can be read (a request, or a child's exit); those that can."""
    return select.select(fds, [], [])[0]


def _report_ended(answers: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        rc = os.waitstatus_to_exitcode(status)
        os.write(answers, json.dumps({"ended": pid, "rc": rc}).encode() + b"\n")


def _run_child(request: dict, answers: int, server: int, wake_pipe: tuple[int, int]) -> None:
    """In the forked child: run ``python -m gqa_jax ARGV`` as that command runs (``runpy``, as
    ``-m`` does) and exit as it exits (the interpreter's own exit: atexit handlers, threads
    joined, output flushed). A server that died between the fork and ``die_with_parent`` sent no
    signal: the child then exits at once, as the signal would have made it."""
    os.setsid()
    die_with_parent()
    if os.getppid() != server:
        os._exit(128 + signal.SIGKILL)
    signal.set_wakeup_fd(-1)  # the server's, as a fresh interpreter has none
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in (answers, *wake_pipe):
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.set_blocking(0, True)
    np.random.seed()  # a fresh interpreter's global numpy stream, not the server's
    sys.argv = ["-m", *request["argv"]]  # argv[0]: the module's file, once runpy finds it
    runpy.run_module("gqa_jax", run_name="__main__", alter_sys=True)
    sys.exit(0)  # a command that returned without sys.exit
