"""Run a sweep: every run's command in dependency order, locally (one after another, or ``jobs``
at a time) or through ``scripts/launch_tpu.sh`` on every worker of a TPU VM pod.

One runner per root: ``ROOT/lock.json`` (``locks.lock_root``) is taken before anything under the
root is read or written; a second runner is refused, naming the first. Each run runs as a
``python -m gqa_jax ...`` child (``scheduler.Scheduler``) writing ``ROOT/<name>/log.txt``; on exit 0
with its outputs there the runner writes ``ROOT/<name>/run.json`` with status ``done``. A rerun
skips done runs and starts the others again: an interrupted training run resumes from its
checkpoints (its own command does that), an interrupted convert / evaluate / time run is redone in
its own directory. Before it starts anything a rerun looks at what is there (``_plan``):

- a done run whose outputs are missing or unreadable (``outputs.broken``) is redone, the
  unreadable output moved aside first, and every run begun after it is moved aside and run again;
- a done run whose command the sweep now gives otherwise (``changed_runs``: a changed ``--set``,
  sweep file or data path; not another checkout, interpreter or place of the root), a run one of
  whose dependencies finished after it started, and every run begun after one of them, is an
  error unless ``redo_changed``: then they are moved aside and run again.

A failed run stops its branch: every run that depends on it (directly or not) is not started, and
the runner prints its last error line, its command and its log; the other branches go on. SIGINT
/ SIGTERM stop the runs cleanly (``scheduler.Interrupts``). With ``jobs > 1`` a run starts as soon as
its dependencies are done, in the sweep's order; a ``time`` run never shares the machine: nothing
else of this runner runs while it does, nor of another runner on this machine (``locks.TimeGate``).
Local runs share JAX's persistent compilation cache in ``ROOT/jax_cache`` (docs/experiments.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shlex
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gqa_jax import paths, unreadable
from gqa_jax.experiments import locks, outputs, scheduler
from gqa_jax.experiments.scheduler import status
from gqa_jax.experiments.sweep import Run, Sweep, command, order

LAUNCHERS = ("local", "tpu")


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


def _items(argv: Sequence[str]) -> list[str]:
    """An argv as its items: a flag with the value after it (``--examples 4``), or one word."""
    items: list[str] = []
    for a in argv:
        if (
            items
            and items[-1].startswith("--")
            and " " not in items[-1]
            and "=" not in items[-1]
            and (not a.startswith("--"))
        ):
            items[-1] += f" {a}"
        else:
            items.append(a)
    return items


def _difference(old: Sequence[str], new: Sequence[str]) -> str:
    """What changed between two argvs, in words (the flags and values only one of them has:
    ``now --examples 3, was --examples 4``)."""
    old, new = _items(old), _items(new)
    gone, added = [a for a in old if a not in new], [a for a in new if a not in old]
    short = lambda a: a if len(a) <= 80 else a[:77] + "..."  # noqa: E731
    show = lambda args: " ".join(map(short, args[:3])) + (" ..." if len(args) > 3 else "")  # noqa: E731
    words = ([f"now {show(added)}"] if added else []) + ([f"was {show(gone)}"] if gone else [])
    return ", ".join(words) or "its arguments in another order"


def changed_runs(runs: Sequence[Run], root: Path) -> dict[str, str]:
    """The done runs whose recorded command is not the one the sweep gives now (a changed
    ``--set``, sweep file or data path), each with what changed; the begun runs one of whose
    dependencies finished after they started (``outputs.newer_dependencies``: they ran on its
    older output); and the runs begun (done or not) that depend on one of them: their inputs
    changed, and skipping or resuming them would mix settings in one report."""
    changed: dict[str, str] = {}
    newer = outputs.newer_dependencies(runs, root)
    for r in runs:
        record = outputs.record(root, r.name)
        state = record.get("status")
        if state is None:  # not begun
            continue
        recorded, now = record.get("command"), _portable(command(r, root), str(root))
        if state == "done" and isinstance(recorded, list):
            before = _portable(recorded, record.get("root"))
            if before != now:
                changed[r.name] = _difference(before, now)
                continue
        if r.name in newer:
            changed[r.name] = newer[r.name]
        elif upstream := [d for d in r.deps if d in changed]:
            changed[r.name] = f"it depends on {upstream[0]}, which changed"
    return changed


@dataclasses.dataclass
class _Plan:
    """What a rerun finds under the root before it starts anything (each run with why)."""

    changed: dict[str, str]  # another command, or run on an older dependency: redone when asked
    broken: dict[str, str]  # done, its outputs missing or unreadable: redone in its directory
    redo: dict[str, str]  # begun after a broken run, on its output: moved aside and run again


def _plan(runs: Sequence[Run], root: Path, needed: Mapping[str, Sequence[str]]) -> _Plan:
    broken = outputs.broken(runs, root, needed)
    redo: dict[str, str] = {}
    for r in runs:
        if r.name not in broken and status(root, r.name) is not None:
            if upstream := [d for d in r.deps if d in broken or d in redo]:
                redo[r.name] = f"it depends on {upstream[0]}, which is redone"
    return _Plan(changed_runs(runs, root), broken, redo)


def listed(changed: Mapping[str, str]) -> str:
    """The first three changed runs with why, and how many more (``changed_runs``' result)."""
    first = "; ".join(f"{n}: {why}" for n, why in list(changed.items())[:3])
    return first + (f"; and {len(changed) - 3} more (--dry-run lists them)" if len(changed) > 3 else "")


def _refuse_changed(changed: Mapping[str, str], root: Path) -> None:
    raise ValueError(
        f"{len(changed)} run(s) under {root} were made by another command than the sweep gives now, or on "
        f"an older output of a dependency ({listed(changed)}): rerun with --redo-changed to run them again "
        "(their directories are moved aside to <name>.changed-<time>, nothing is deleted), or give "
        "another --root"
    )


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
    selected run is done, 1 when one failed or was blocked by a failure, 128 + the signal's
    number when SIGINT / SIGTERM stopped it.

    ``jobs``: how many runs at once (local launcher; a run starts when its dependencies are
    done, in the sweep's order). A ``time`` run always runs alone: nothing starts beside it, and
    it starts when nothing else runs, so its clock measures decoding only (a predicted one,
    ``time --predict``, runs nothing and is not held apart). A dry run takes no lock and writes
    nothing; it says when another runner holds the root."""
    _check_launch(launcher, jobs)
    where = paths.local(root, "sweep root", "a sweep keeps its runs' status and logs on this machine's disk")
    root = Path(os.fspath(where))
    if root.exists() and not root.is_dir():
        raise ValueError(f"--root {root} is a file, not a directory")
    runs = order(sweep, only)
    needed = outputs.needed(sweep.runs)
    if dry_run:
        if holder := locks.held_by(root):
            log(f"sweep root {root} is in use by another runner: {holder}; the runs as they are now:")
        _print_commands(runs, root, _plan(runs, root, needed), launcher, tpu, out)
        return 0
    lock = locks.lock_root(root, log)
    try:
        with scheduler.Interrupts() as stops:
            return _run(sweep, runs, root, needed, stops, launcher, tpu, jobs, redo_changed, log)
    finally:
        lock.release()


def _run(sweep: Sweep, runs: Sequence[Run], root: Path, needed: Mapping[str, Sequence[str]],
         stops: scheduler.Interrupts, launcher: str, tpu: Sequence[str], jobs: int, redo_changed: bool,
         log: Callable[[str], None]) -> int:  # fmt: skip
    """``run_sweep`` once the root is locked: check and set aside, run, say how it ended."""
    plan = _plan(runs, root, needed)
    refused = {n: why for n, why in plan.changed.items() if n not in plan.redo}
    if refused and not redo_changed:
        _refuse_changed(refused, root)
    _set_aside(plan, root, needed, redo_changed, log)
    done = {r.name for r in runs if status(root, r.name) == "done"}
    gate = _time_gate(log) if launcher == "local" else None
    try:
        setup = scheduler.Setup(launcher, tpu, jobs, done, needed, stops, gate, log)
        ran = scheduler.Scheduler(runs, root, setup)
        ran.run()
    finally:
        if gate:
            gate.close()
    if stops.signum:
        name, listed = signal.Signals(stops.signum).name, ", ".join(ran.stopped)
        stopped = f"{len(ran.stopped)} run(s) stopped before done" + (f" ({listed})" if listed else "")
        log(f"sweep {sweep.name}: stopped by {name}; {stopped}; what is done is kept: rerun the same "
            "command to go on")  # fmt: skip
        return 128 + stops.signum
    if ran.failed:
        roots = sorted(set(ran.failed.values()))
        log(f"sweep {sweep.name}: {len(ran.failed)} run(s) not done because of {', '.join(roots)}; "
            "fix and rerun")  # fmt: skip
        return 1
    log(f"sweep {sweep.name}: every selected run is done ({len(runs)})")
    return 0


def _time_gate(log: Callable[[str], None]) -> locks.TimeGate | None:
    """This machine's time lock; None (said once) where its directory cannot be written."""
    try:
        return locks.TimeGate()
    except OSError as e:
        log(f"no time lock shared with this machine's other runners ({e}): a time run is held apart from "
            "this runner's runs only")  # fmt: skip
        return None


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
    plan: _Plan,
    launcher: str,
    tpu: Sequence[str],
    out: Callable[[str], None],
) -> None:
    """The dry run: each run's command, marked ``# done``, ``redo (why)`` and ``changed (why)``."""
    for r in runs:
        notes = ["done"] if status(root, r.name) == "done" else []
        redo = plan.broken.get(r.name) or plan.redo.get(r.name)
        notes += [f"redo ({redo})"] if redo else []
        notes += [f"changed ({plan.changed[r.name]})"] if r.name in plan.changed else []
        mark = "  # " + ", ".join(notes) if notes else ""
        out(shlex.join(scheduler.full_command(r, root, launcher, tpu)) + mark)


def _set_aside(plan: _Plan, root: Path, needed: Mapping[str, Sequence[str]], redo_changed: bool,
               log: Callable[[str], None]) -> None:  # fmt: skip
    """Make the runs to redo start again, deleting nothing: a changed run's directory (with
    ``redo_changed``) moved to ``<name>.changed-<time>``, a run begun on a broken run's output to
    ``<name>.redo-<time>``; a broken run keeps its directory (a train run resumes from its
    checkpoints and exports again), its unreadable outputs moved to ``<output>.unreadable-<time>``."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    moved = set()
    for name, why in plan.changed.items() if redo_changed else ():
        aside = root / f"{name}.changed-{stamp}"
        (root / name).rename(aside)
        moved.add(name)
        log(f"{name}: changed ({why}); moved to {aside} to run again")
    for name, why in plan.redo.items():
        if name not in moved:
            aside = root / f"{name}.redo-{stamp}"
            (root / name).rename(aside)
            log(f"{name}: {why}; moved to {aside} to run again")
    for name, why in plan.broken.items():
        if name not in moved:
            _redo_in_place(root / name, needed.get(name, ()), why, stamp, log)


def _redo_in_place(directory: Path, needed: Sequence[str], why: str, stamp: str,
                   log: Callable[[str], None]) -> None:  # fmt: skip
    """A done run whose outputs are broken: those that exist moved aside, its run.json ``redo``."""
    kept = []
    for name in needed:
        if outputs.problem(directory, [name]) and (directory / name).exists():
            kept.append(str(unreadable.set_aside(directory / name, stamp)))
    record = outputs.record(directory.parent, directory.name) | {"status": "redo", "redo": why}
    paths.write_text_atomic(directory / outputs.RUN_FILE, json.dumps(record, indent=2, default=str) + "\n")
    moved = f" (kept as {', '.join(kept)})" if kept else ""
    log(f"{directory.name}: done before, but its {why}{moved}: running it again")
