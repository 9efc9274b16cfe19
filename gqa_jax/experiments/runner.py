"""Run a sweep: every run's command in dependency order, locally (one after another, or ``jobs``
at a time) or through ``scripts/launch_tpu.sh`` on every worker of a TPU VM pod.

Locally each run is a ``python -m gqa_jax ...`` subprocess writing ``ROOT/<name>/log.txt``; on exit
0 the runner writes ``ROOT/<name>/run.json`` with status ``done``. A rerun skips done runs and
starts the others again: an interrupted training run resumes from its checkpoints (its own
command does that), an interrupted convert / evaluate / time run is redone in its own directory.
A done run whose command the sweep now gives otherwise (``changed_runs``: a changed ``--set``,
sweep file or data path; not another checkout, interpreter or place of the root), and every
run begun after it, is an error unless ``redo_changed``: then they are moved aside and run again.
A failed run stops its branch: every run that depends on it (directly or not) is not started, and
the runner prints the failing command and its log; the other branches go on. Killing the runner
kills the runs it is waiting for (a child gets SIGKILL when its parent dies, on Linux).

With ``jobs > 1`` a run starts as soon as its dependencies are done, in the sweep's order; a
``time`` run never shares the machine (nothing else runs while it does). Local runs share JAX's
persistent compilation cache in ``ROOT/jax_cache`` (unless ``JAX_COMPILATION_CACHE_DIR`` is set), so
a run that compiles what an earlier one did starts sooner (docs/experiments.md).
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax import paths, shipped
from gqa_jax.experiments.sweep import STAGES, Run, Sweep, command, order

RUN_FILE = "run.json"
LOG_FILE = "log.txt"
LAUNCHERS = ("local", "tpu")
EXCLUSIVE = ("time",)  # stages that run alone: their clock must not share the machine


def exclusive(run: Run) -> bool:
    """Whether ``run`` must run alone: a timed run (its clock must not share the machine); a
    predicted one (``time --predict``) only compiles and shares it like any other run."""
    return run.stage in EXCLUSIVE and not run.args.get("predict")


CACHE_DIR = "jax_cache"  # ROOT/jax_cache: the runs' compilation cache (local launcher)


def status(root: Path, name: str) -> str | None:
    """A run's recorded status (``done`` / ``failed`` / ``running``), None when never started."""
    file = root / name / RUN_FILE
    try:
        return json.loads(file.read_text()).get("status")
    except (OSError, ValueError):
        return None


_CONFIG_DIR = re.compile(r"^[^:]*/configs/(?=[^/:]+\.py(?::|$))")  # a checkout's configs/, wherever it is


def _portable(argv: Sequence[str], root: str | None) -> list[str]:
    """A run's argv after ``python -m gqa_jax`` with the checkout's configs/ folder written
    ``configs/`` and the sweep's ``root`` written ``ROOT``: the same run from another checkout,
    interpreter or place of the root is the same command."""
    argv = [str(a) for a in argv]
    for i in range(len(argv) - 1):
        if argv[i : i + 2] == ["-m", "gqa_jax"]:
            argv = argv[i + 2 :]
            break
    argv = [_CONFIG_DIR.sub("configs/", a) for a in argv]
    return [a.replace(f"{root}/", "ROOT/") for a in argv] if root else argv


def _difference(old: Sequence[str], new: Sequence[str]) -> str:
    """What changed between two argvs, in words (the arguments only one of them has)."""
    gone, added = [a for a in old if a not in new], [a for a in new if a not in old]
    short = lambda a: a if len(a) <= 80 else a[:77] + "..."  # noqa: E731
    show = lambda args: " ".join(map(short, args[:3])) + (" ..." if len(args) > 3 else "")  # noqa: E731
    words = ([f"now {show(added)}"] if added else []) + ([f"was {show(gone)}"] if gone else [])
    return ", ".join(words) or "its arguments in another order"


def changed_runs(runs: Sequence[Run], root: Path) -> dict[str, str]:
    """The done runs whose recorded command is not the one the sweep gives now (a changed
    ``--set``, sweep file or data path), each with what changed, and the runs begun (done or not)
    that depend on one of them: their inputs changed, and skipping or resuming them would mix
    settings in one report."""
    changed: dict[str, str] = {}
    for r in runs:
        state = status(root, r.name)
        if state is None:  # not begun
            continue
        try:
            record = json.loads((root / r.name / RUN_FILE).read_text())
        except (OSError, ValueError):
            record = {}
        recorded, now = record.get("command"), _portable(command(r, root), str(root))
        if state == "done" and isinstance(recorded, list):
            before = _portable(recorded, record.get("root"))
            if before != now:
                changed[r.name] = _difference(before, now)
                continue
        if upstream := [d for d in r.deps if d in changed]:
            changed[r.name] = f"it depends on {upstream[0]}, which changed"
    return changed


def _refuse_changed(changed: Mapping[str, str], root: Path) -> None:
    listed = "; ".join(f"{n}: {why}" for n, why in list(changed.items())[:3])
    more = f"; and {len(changed) - 3} more (--dry-run lists them)" if len(changed) > 3 else ""
    raise ValueError(
        f"{len(changed)} run(s) under {root} were made by another command than the sweep gives now "
        f"({listed}{more}): rerun with --redo-changed to run them again (their directories are moved "
        "aside to <name>.changed-<time>, nothing is deleted), or give another --root"
    )


def full_command(run: Run, root: Path, launcher: str = "local", tpu: Sequence[str] = ()) -> list[str]:
    """The complete argv of ``run``: ``python -m gqa_jax ...`` locally; on a TPU pod the same
    command behind ``scripts/launch_tpu.sh [TPU OPTIONS] --``."""
    argv = [sys.executable if launcher == "local" else "python", "-m", "gqa_jax", *command(run, root)]
    if launcher == "tpu":
        return [str(shipped.folder("scripts") / "launch_tpu.sh"), *tpu, "--", *argv]
    return argv


def _write_status(root: Path, run: Run, argv: list[str], state: str, **fields: Any) -> None:
    directory = root / run.name
    directory.mkdir(parents=True, exist_ok=True)
    record = {"name": run.name, "stage": run.stage, "command": argv, "root": str(root),
              "tags": dict(run.tags), "status": state, **fields}  # fmt: skip
    paths.write_text_atomic(directory / RUN_FILE, json.dumps(record, indent=2, default=str) + "\n")


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()  # looked up here: between fork and exec the child only makes the call


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the runner dies (Linux prctl PR_SET_PDEATHSIG)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)


def _popen(argv: list[str], log_file: Any, env: dict[str, str]) -> subprocess.Popen:
    with warnings.catch_warnings():
        # JAX warns about any fork in a process that imported it; the child execs at once and
        # calls nothing before (``_die_with_parent``: one prctl through a pointer looked up here).
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        return subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=shipped.checkout(),
            env=env,
            preexec_fn=_die_with_parent,
        )


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
    try:
        seconds = json.loads((root / name / RUN_FILE).read_text()).get("seconds")
    except (OSError, ValueError):
        return None
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


def run_sweep(
    sweep: Sweep,
    root: str | os.PathLike,
    *,
    only: str | None = None,
    dry_run: bool = False,
    launcher: str = "local",
    tpu: Sequence[str] = (),
    jobs: int = 1,
    redo_changed: bool = False,
    log: Callable[[str], None] = print,
    out: Callable[[str], None] = print,
) -> int:
    """Run (or with ``dry_run`` print) ``sweep``'s runs under ``root``; returns 0 when every
    selected run is done, 1 when one failed or was blocked by a failure.

    ``jobs``: how many runs at once (local launcher; a run starts when its dependencies are
    done, in the sweep's order). A ``time`` run always runs alone: nothing starts beside it, and
    it starts when nothing else runs, so its clock measures decoding only (a predicted one,
    ``time --predict``, runs nothing and is not held apart)."""
    _check_launch(launcher, jobs)
    root = paths.local(root, "sweep root", "a sweep keeps its runs' status and logs on this machine's disk")
    if root.exists() and not root.is_dir():
        raise ValueError(f"--root {root} is a file, not a directory")
    runs = order(sweep, only)
    changed = changed_runs(runs, root)
    if dry_run:
        _print_commands(runs, root, changed, launcher, tpu, out)
        return 0
    if changed and not redo_changed:
        _refuse_changed(changed, root)
    _set_aside(changed, root, log)
    scheduler = _Scheduler(runs, root, launcher, tpu, jobs, log)
    scheduler.run()
    if scheduler.failed:
        roots = sorted(set(scheduler.failed.values()))
        log(
            f"sweep {sweep.name}: {len(scheduler.failed)} run(s) not done because of {', '.join(roots)}; "
            "fix and rerun"
        )
        return 1
    log(f"sweep {sweep.name}: every selected run is done ({len(runs)})")
    return 0


def _check_launch(launcher: str, jobs: int) -> None:
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; choose from {', '.join(LAUNCHERS)}")
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs!r} must be a positive integer")
    if launcher == "tpu" and jobs != 1:
        raise ValueError("--jobs applies to the local launcher: on a TPU pod each run takes every worker")


def _print_commands(
    runs: Sequence[Run],
    root: Path,
    changed: Mapping[str, str],
    launcher: str,
    tpu: Sequence[str],
    out: Callable[[str], None],
) -> None:
    """The dry run: each run's command, marked ``# done`` and ``changed (why)`` where it is."""
    for r in runs:
        notes = ["done"] if status(root, r.name) == "done" else []
        notes += [f"changed ({changed[r.name]})"] if r.name in changed else []
        mark = "  # " + ", ".join(notes) if notes else ""
        out(shlex.join(full_command(r, root, launcher, tpu)) + mark)


def _set_aside(changed: Mapping[str, str], root: Path, log: Callable[[str], None]) -> None:
    """``--redo-changed``: each changed run's directory moved to ``<name>.changed-<time>``, never
    deleted, so that the run starts again."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for name, why in changed.items():
        aside = root / f"{name}.changed-{stamp}"
        (root / name).rename(aside)
        log(f"{name}: made with another command ({why}); moved to {aside} to run again")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass
class _Child:
    """A run the runner started and has not seen end."""

    run: Run
    head: str  # "[i/n] name (stage)": the run in the runner's log lines
    argv: list[str]
    proc: subprocess.Popen
    log_file: Any  # ROOT/<name>/log.txt, open for the child's output
    t0: float  # time.time() when it started
    started: str  # the same, as run.json records it


class _Scheduler:
    """Starts ``runs`` in the sweep's order as their dependencies are done (at most ``jobs`` at
    once; a timed run alone), polls them, and records each one's end in its run.json and the log."""

    def __init__(
        self,
        runs: Sequence[Run],
        root: Path,
        launcher: str,
        tpu: Sequence[str],
        jobs: int,
        log: Callable[[str], None],
    ):
        self.runs, self.root, self.jobs, self.log = runs, root, jobs, log
        self.launcher, self.tpu = launcher, tpu
        self.env = child_env(root, launcher)
        self.failed: dict[str, str] = {}  # run -> the failed run that stops it
        self.done = {r.name for r in runs if status(root, r.name) == "done"}
        self.stage_seconds: dict[str, list[float]] = {}  # the done runs' times (those done before too)
        for r in runs:
            took = recorded_seconds(root, r.name) if r.name in self.done else None
            if took is not None:
                self.stage_seconds.setdefault(r.stage, []).append(took)
        self.pending = list(enumerate(runs, 1))  # (its number in the sweep, run), in the sweep's order
        self.running: dict[str, _Child] = {}

    def run(self) -> None:
        """Until every run has ended, been skipped or been blocked by a failure."""
        while self.pending or self.running:
            self._start_what_may()
            if self.running:
                self._wait()

    def _head(self, i: int, r: Run) -> str:
        return f"[{i}/{len(self.runs)}] {r.name} ({r.stage})"

    def _start_what_may(self) -> None:
        """Start what may start, in the sweep's order: skip done runs, stop blocked branches."""
        for i, r in list(self.pending):
            if len(self.running) >= self.jobs or any(exclusive(c.run) for c in self.running.values()):
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
                if self.jobs == 1 or exclusive(r):
                    break  # keep the order: a time run waits for the runs before it
                continue
            self.pending.remove((i, r))
            self._start(i, r)

    def _start(self, i: int, r: Run) -> None:
        argv = full_command(r, self.root, self.launcher, self.tpu)
        (self.root / r.name).mkdir(parents=True, exist_ok=True)
        log_path = self.root / r.name / LOG_FILE
        started = _now()
        _write_status(self.root, r, argv, "running", started=started)
        self.log(f"{self._head(i, r)}: running ... (log {log_path})")
        f = open(log_path, "a")
        f.write(f"\n$ {shlex.join(argv)}\n")
        f.flush()
        proc = _popen(argv, f, self.env)
        self.running[r.name] = _Child(r, self._head(i, r), argv, proc, f, time.time(), started)

    def _wait(self) -> None:
        """Wait until a running run ends, and finish every run that has."""
        while True:
            codes = {name: child.proc.poll() for name, child in self.running.items()}
            ended = {name: rc for name, rc in codes.items() if rc is not None}
            if ended:
                for name, rc in ended.items():
                    self._finish(self.running.pop(name), rc)
                return
            time.sleep(0.1)

    def _finish(self, child: _Child, rc: int) -> None:
        child.log_file.close()
        took = time.time() - child.t0
        if rc == 0:
            self._record_done(child, took)
        else:
            self._record_failed(child, took, rc)

    def _record_done(self, child: _Child, took: float) -> None:
        r = child.run
        self.stage_seconds.setdefault(r.stage, []).append(took)
        self.done.add(r.name)
        _write_status(self.root, r, child.argv, "done", started=child.started, seconds=took, finished=_now())
        now = time.time()
        left = [(x, 0.0) for _, x in self.pending if x.name not in self.done]
        left += [(c.run, now - c.t0) for c in self.running.values()]
        progress = stage_progress(self.runs, self.done) + eta(self.stage_seconds, left, self.jobs)
        self.log(f"{child.head}: done in {took:.0f} s; {progress}")

    def _record_failed(self, child: _Child, took: float, rc: int) -> None:
        r = child.run
        self.failed[r.name] = r.name
        log_path = self.root / r.name / LOG_FILE
        _write_status(self.root, r, child.argv, "failed", started=child.started, seconds=took, returncode=rc,
                      log=str(log_path))  # fmt: skip
        self.log(f"{child.head}: FAILED (exit {rc}) after {took:.0f} s")
        self.log(f"  command: {shlex.join(child.argv)}\n  log: {log_path}")
