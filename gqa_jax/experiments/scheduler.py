"""Running a sweep's runs as child processes: ``Scheduler`` starts each run when it may (its
dependencies done, at most ``jobs`` at once, a timed run alone here and on the machine's
``TimeGate``), polls them, and records each one's end in its ``run.json`` and the runner's log.

A run's output goes to ``ROOT/<name>/log.txt``; on exit 0 with its outputs there and readable
(``outputs.problem``) the run is ``done``, else ``failed``, with the last error line of its log
(``outputs.error_line``) printed beside the log's path. ``Interrupts`` turns the runner's SIGINT /
SIGTERM into a clean stop: the signal goes on to every running child's process group (a train run
saves a checkpoint and exits), the runner waits for them (``STOP_WAIT_S``, then kills them; a
second Ctrl-C is passed on too, and abandons their checkpoints; a third kills them) and records
them ``stopped``. Each child runs in its own session, so a Ctrl-C at the terminal reaches the
runner alone, and gets SIGKILL if the runner dies (Linux ``PR_SET_PDEATHSIG``). A run's
``python -m gqa_jax ...`` is forked by ``forks.Server`` (the package imported once, not per run).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax import paths, shipped
from gqa_jax.experiments import forks, outputs
from gqa_jax.experiments.locks import TimeGate
from gqa_jax.experiments.sweep import STAGES, TRAIN_STAGES, Run, command

RUN_FILE, LOG_FILE = outputs.RUN_FILE, outputs.LOG_FILE
EXCLUSIVE = ("time",)  # stages that run alone: their clock must not share the machine
CACHE_DIR = "jax_cache"  # ROOT/jax_cache: the runs' compilation cache (local launcher)
STOP_WAIT_S = 600.0  # how long a stop waits for the children to save and exit before killing them


def exclusive(run: Run) -> bool:
    """Whether ``run`` must run alone: a timed run (its clock must not share the machine); a
    predicted one (``time --predict``) only compiles and shares it like any other run."""
    return run.stage in EXCLUSIVE and not run.args.get("predict")


def status(root: Path, name: str) -> str | None:
    """A run's recorded status (``done`` / ``failed`` / ``stopped`` / ``redo`` / ``running``),
    None when never started."""
    return outputs.record(root, name).get("status")


def full_command(run: Run, root: Path, launcher: str = "local", tpu: Sequence[str] = ()) -> list[str]:
    """The complete argv of ``run``: ``python -m gqa_jax ...`` locally; on a TPU pod the same
    command behind ``scripts/launch_tpu.sh [TPU OPTIONS] --``."""
    argv = [sys.executable if launcher == "local" else "python", "-m", "gqa_jax", *command(run, root)]
    if launcher == "tpu":
        return [str(shipped.folder("scripts") / "launch_tpu.sh"), *tpu, "--", *argv]
    return argv


def write_status(root: Path, run: Run, argv: list[str], state: str, **fields: Any) -> None:
    """``ROOT/<name>/run.json``: the run's name, stage, command, root, tags, ``state`` and ``fields``."""
    directory = root / run.name
    directory.mkdir(parents=True, exist_ok=True)
    record = {"name": run.name, "stage": run.stage, "command": argv, "root": str(root),
              "tags": dict(run.tags), "status": state, **fields}  # fmt: skip
    paths.write_text_atomic(directory / RUN_FILE, json.dumps(record, indent=2, default=str) + "\n")


def _popen(argv: list[str], log_file: Any, env: dict[str, str], server: forks.Server) -> Any:
    """``argv`` started, its output to ``log_file``: a run of this package forked by ``server``
    (``forks``: no interpreter start-up), any other command a new process."""
    if server.serves(argv):
        return server.start(argv, log_file.name)
    return forks.popen_quietly(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=shipped.checkout(),
        env=env,
        start_new_session=True,  # the terminal's Ctrl-C reaches the runner, which passes it on
        preexec_fn=forks.die_with_parent,
    )


def _signal(proc: Any, signum: int) -> None:
    """Send ``signum`` to ``proc``'s process group when it leads one (its own children too), else
    to ``proc``; nothing when it has ended."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signum)
            return
        proc.send_signal(signum)
    except (ProcessLookupError, PermissionError):
        return


def stage_progress(runs: Sequence[Run], done: set[str]) -> str:
    """``"pretrain 2/2, uptrain 9/9, finetune 5/27"``: the runs done of each stage, in the
    pipeline's order, for the stages the selection has."""
    parts = []
    for stage in STAGES:
        names = [r.name for r in runs if r.stage == stage]
        if names:
            parts.append(f"{stage} {sum(n in done for n in names)}/{len(names)}")
    return ", ".join(parts)


def eta(
    stage_seconds: Mapping[str, Sequence[float]], left: Sequence[tuple[Run, float]], jobs: int = 1
) -> str:
    """The progress line's ETA: each run ``left`` (with the seconds it has run so far, 0 when not
    started) costs the mean time of the done runs of its stage, less what it has run; runs that
    share the machine divide by ``jobs``, a ``time`` run (it runs alone) does not. Runs of a stage
    none of whose runs is done yet are counted, never guessed from another stage's runs (a
    pre-training run takes minutes where an evaluate run takes seconds)."""
    total, timed, untimed = 0.0, 0, {}
    for r, elapsed in left:
        seen = stage_seconds.get(r.stage)
        if seen:
            share = 1 if exclusive(r) else jobs
            total += max(0.0, sum(seen) / len(seen) - elapsed) / share
            timed += 1
        else:
            untimed[r.stage] = untimed.get(r.stage, 0) + 1
    text = f", ETA {total / 60:.1f} min for {timed} more" if timed else ""
    if untimed:
        counts = ", ".join(f"{untimed[s]} {s}" for s in STAGES if s in untimed)
        text += f"{',' if timed else ';'} {counts} not timed yet"
    return text


def recorded_seconds(root: Path, name: str) -> float | None:
    """How long a done run took, from its ``run.json`` (None when not recorded)."""
    seconds = outputs.record(root, name).get("seconds")
    return float(seconds) if isinstance(seconds, (int, float)) else None


def child_env(root: Path, launcher: str) -> dict[str, str]:
    """The runs' environment: ours, plus (locally) JAX's persistent compilation cache in
    ``ROOT/jax_cache`` unless ``JAX_COMPILATION_CACHE_DIR`` is set: seeds of a run compile the
    same programs, and the cache compiles them once."""
    env = dict(os.environ)
    if launcher == "local" and not env.get("JAX_COMPILATION_CACHE_DIR"):
        env["JAX_COMPILATION_CACHE_DIR"] = str(root / CACHE_DIR)
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    return env


def now() -> str:
    """This moment as ``run.json`` records it (UTC, whole seconds)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class Interrupts:
    """Context manager: while inside (in the main thread), SIGINT / SIGTERM are counted
    (``signum``: the first one, ``count``: how many) instead of raising or killing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        self.signum = self.signum or signum

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()


@dataclasses.dataclass
class _Child:
    """A run the runner started and has not seen end."""

    run: Run
    head: str  # "[i/n] name (stage)": the run in the runner's log lines
    argv: list[str]
    proc: Any  # a subprocess.Popen, or a forks.Forked
    log_file: Any  # ROOT/<name>/log.txt, open for the child's output
    offset: int  # where this start's output begins in it
    t0: float  # time.time() when it started
    started: str  # the same, as run.json records it


@dataclasses.dataclass
class Setup:
    """What a ``Scheduler`` runs, and how: the launcher, the runs already done, each run's outputs
    (``outputs.needed``), the runner's ``Interrupts`` and the machine's ``TimeGate`` (local)."""

    launcher: str
    tpu: Sequence[str]
    jobs: int
    done: set[str]
    outputs: Mapping[str, Sequence[str]]
    interrupts: Interrupts
    gate: TimeGate | None
    log: Callable[[str], None]


class Scheduler:
    """Starts ``runs`` in the sweep's order as their dependencies are done (at most ``jobs`` at
    once; a timed run alone), polls them, and records each one's end in its run.json and the log;
    stops them on an interrupt."""

    def __init__(self, runs: Sequence[Run], root: Path, setup: Setup):
        self.runs, self.root, self.setup, self.log = runs, root, setup, setup.log
        self.env = child_env(root, setup.launcher)
        self.forks = forks.Server(self.env, shipped.checkout())  # started at the first run of ours
        self.failed: dict[str, str] = {}  # run -> the failed run that stops it
        self.stopped: list[str] = []  # runs stopped by an interrupt
        self.done = set(setup.done)
        self.stage_seconds: dict[str, list[float]] = {}  # the done runs' times (those done before too)
        for r in runs:
            took = recorded_seconds(root, r.name) if r.name in self.done else None
            if took is not None:
                self.stage_seconds.setdefault(r.stage, []).append(took)
        self.pending = list(enumerate(runs, 1))  # (its number in the sweep, run), in the sweep's order
        self.running: dict[str, _Child] = {}
        self._waiting_for = ""  # what the runner waits for on the TimeGate, once said

    def run(self) -> None:
        """Until every run has ended, been skipped or been blocked by a failure, or an interrupt
        has stopped the runs."""
        stops = self.setup.interrupts
        try:
            while (self.pending or self.running) and not stops.signum:
                self._start_what_may()
                self._wait()
            if self.running:
                self._stop_children()
        finally:
            self.forks.close()

    def _head(self, i: int, r: Run) -> str:
        return f"[{i}/{len(self.runs)}] {r.name} ({r.stage})"

    def _start_what_may(self) -> None:
        """Start what may start, in the sweep's order: skip done runs, stop blocked branches."""
        for i, r in list(self.pending):
            if len(self.running) >= self.setup.jobs or any(exclusive(c.run) for c in self.running.values()):
                break
            if r.name in self.done:
                self.pending.remove((i, r))
                self.log(f"{self._head(i, r)}: done before, skipped")
                continue
            blocked = [self.failed[d] for d in r.deps if d in self.failed]
            if blocked:
                self.pending.remove((i, r))
                self.failed[r.name] = blocked[0]
                self.log(f"{self._head(i, r)}: not run, its dependency {blocked[0]} failed")
                continue
            unfinished = {x.name for _, x in self.pending} | set(self.running)
            if any(d in unfinished for d in r.deps) or (exclusive(r) and self.running):
                if self.setup.jobs == 1 or exclusive(r):
                    break  # keep the order: a time run waits for the runs before it
                continue
            gate = self.setup.gate
            if self.setup.interrupts.signum or (gate and not gate.may_start(exclusive(r))):
                if gate and gate.waiting_for != self._waiting_for:
                    self._waiting_for = gate.waiting_for
                    self.log(f"{self._head(i, r)}: waiting for {gate.waiting_for}")
                break
            self._waiting_for = ""
            self.pending.remove((i, r))
            self._start(i, r)

    def _start(self, i: int, r: Run) -> None:
        argv = full_command(r, self.root, self.setup.launcher, self.setup.tpu)
        (self.root / r.name).mkdir(parents=True, exist_ok=True)
        log_path = self.root / r.name / LOG_FILE
        started = now()
        write_status(self.root, r, argv, "running", started=started)
        self.log(f"{self._head(i, r)}: running ... (log {log_path})")
        f = open(log_path, "a")
        f.write(f"\n$ {shlex.join(argv)}\n")
        f.flush()
        proc = _popen(argv, f, self.env, self.forks)
        self.running[r.name] = _Child(r, self._head(i, r), argv, proc, f, f.tell(), time.time(), started)

    def _wait(self) -> None:
        """Wait until a running run ends (or an interrupt comes), and finish every run that has;
        with nothing running (the TimeGate said wait), half a second."""
        until = time.time() + 0.5
        while not self.setup.interrupts.signum:
            ended = self._finish_ended()
            if ended and not self.running and self.setup.gate:
                self.setup.gate.idle()  # the other runners' runs may start now
            if ended or (not self.running and time.time() >= until):
                break
            self.forks.wait(0.1)  # woken at once when a forked run ends; others polled

    def _stop_children(self) -> None:
        """Pass the interrupt on to every running child and wait for them (``STOP_WAIT_S``, then
        SIGKILL); a second interrupt is passed on as SIGINT (a train run abandons its checkpoint),
        a third kills them. Each is recorded stopped (or done, when it ended with its outputs)."""
        stops = self.setup.interrupts
        name = signal.Signals(stops.signum).name
        self.log(f"{name}: stopping {len(self.running)} running run(s) ({', '.join(self.running)}): a train "
                 f"run saves a checkpoint first; waiting up to {STOP_WAIT_S:.0f} s, then they are killed "
                 "(Ctrl-C again: a train run abandons the checkpoint it is saving)")  # fmt: skip
        for child in self.running.values():
            _signal(child.proc, stops.signum)
        seen, deadline = stops.count, time.time() + STOP_WAIT_S
        while self.running:
            if stops.count > seen or time.time() > deadline:
                kill = stops.count >= 3 or time.time() > deadline
                what = "killing them" if kill else "SIGINT again (a train run abandons its save)"
                self.log(f"stopping {', '.join(self.running)}: {what}")
                for child in self.running.values():
                    _signal(child.proc, signal.SIGKILL if kill else signal.SIGINT)
                seen, deadline = stops.count, deadline if not kill else float("inf")
            self._finish_ended()
            time.sleep(0.05)

    def _finish_ended(self) -> list[str]:
        """Finish every running child that has ended; their names."""
        ended = {name: rc for name, child in self.running.items() if (rc := child.proc.poll()) is not None}
        for name, rc in ended.items():
            self._finish(self.running.pop(name), rc)
        return list(ended)

    def _finish(self, child: _Child, rc: int) -> None:
        child.log_file.close()
        took = time.time() - child.t0
        why = outputs.problem(self.root / child.run.name, self.setup.outputs.get(child.run.name, ()))
        if rc == 0 and why is None:
            self._record_done(child, took)
        elif self.setup.interrupts.signum:
            self._record_stopped(child, took, rc)
        else:
            self._record_failed(child, took, rc, f"exit 0, but {why}" if rc == 0 else None)

    def _record_done(self, child: _Child, took: float) -> None:
        r = child.run
        self.stage_seconds.setdefault(r.stage, []).append(took)
        self.done.add(r.name)
        write_status(self.root, r, child.argv, "done", started=child.started, seconds=took, finished=now())
        t = time.time()
        left = [(x, 0.0) for _, x in self.pending if x.name not in self.done]
        left += [(c.run, t - c.t0) for c in self.running.values()]
        progress = stage_progress(self.runs, self.done) + eta(self.stage_seconds, left, self.setup.jobs)
        self.log(f"{child.head}: done in {took:.0f} s; {progress}")

    def _record_stopped(self, child: _Child, took: float, rc: int) -> None:
        r = child.run
        write_status(self.root, r, child.argv, "stopped", started=child.started, seconds=took, returncode=rc,
                     log=str(self.root / r.name / LOG_FILE))  # fmt: skip
        self.stopped.append(r.name)
        again = "resumes it from its last checkpoint" if r.stage in TRAIN_STAGES else "redoes it"
        self.log(f"{child.head}: stopped ({_exit(rc)}) after {took:.0f} s, not done; a rerun {again}")

    def _record_failed(self, child: _Child, took: float, rc: int, error: str | None) -> None:
        r = child.run
        self.failed[r.name] = r.name
        log_path = self.root / r.name / LOG_FILE
        error = error or outputs.error_line(_read_from(log_path, child.offset)) or "(the log says nothing)"
        write_status(self.root, r, child.argv, "failed", started=child.started, seconds=took, returncode=rc,
                     log=str(log_path), error=error)  # fmt: skip
        self.log(f"{child.head}: FAILED ({_exit(rc)}) after {took:.0f} s: {error}")
        self.log(f"  command: {shlex.join(child.argv)}\n  log: {log_path}")
        for d in r.deps:
            why = outputs.problem(self.root / d, self.setup.outputs.get(d, ()))
            if why:
                self.log(f"  its dependency {d} is recorded done, but its {why}: the next run of the sweep "
                         f"redoes {d} first")  # fmt: skip


def _exit(rc: int) -> str:
    """``exit 2``, or ``killed by SIGKILL`` for a child a signal ended (a negative return code)."""
    if rc >= 0:
        return f"exit {rc}"
    try:
        return f"killed by {signal.Signals(-rc).name}"
    except ValueError:
        return f"killed by signal {-rc}"


def _read_from(file: Path, offset: int, limit: int = 65536) -> str:
    """The last ``limit`` bytes of ``file`` from ``offset`` on, as text ('' when unreadable)."""
    try:
        with open(file, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
