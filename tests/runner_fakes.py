"""Fakes for the runner's tests: run directories as the runner and the stages leave them, and
children that leave a stage's outputs (or fail) without running JAX."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gqa_jax import unreadable
from gqa_jax.experiments import outputs, scheduler
from gqa_jax.experiments.sweep import Sweep


def write_outputs(directory: Path, names) -> None:
    """Readable outputs named ``names`` in ``directory``: a JSON object, or a complete checkpoint."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name.endswith(".json"):
            (directory / name).write_text(json.dumps({"fake": True}))
            continue
        (directory / name / "params").mkdir(parents=True, exist_ok=True)
        (directory / name / "config.json").write_text("{}")
        (directory / name / unreadable.CHECKPOINT_MARKER).write_text(json.dumps(unreadable.CHECKPOINT_FORMAT))


def mark_done(
    root: Path,
    sweep: Sweep,
    record_root: Path | None = None,
    python: str = sys.executable,
    running: tuple[str, ...] = (),
    times: dict[str, tuple[str, str]] | None = None,
) -> None:
    """Each run's run.json as the runner writes it for a done run (made under ``record_root``, with
    the interpreter ``python``) and its outputs; the runs in ``running`` were killed midway;
    ``times``: a run's (started, finished)."""
    needed = outputs.needed(sweep.runs)
    for r in sweep.runs:
        argv = [python, *scheduler.full_command(r, record_root or root)[1:]]
        (root / r.name).mkdir(parents=True)
        state = "running" if r.name in running else "done"
        record = {"status": state, "command": argv, "root": str(record_root or root)}
        if times and r.name in times:
            record["started"], record["finished"] = times[r.name]
        (root / r.name / scheduler.RUN_FILE).write_text(json.dumps(record))
        if state == "done":
            write_outputs(root / r.name, needed[r.name])


def output_dir(argv: list[str]) -> tuple[Path, str]:
    """Where a run's command writes (its ``--workdir``, or a convert's ``--dst``'s parent) and its stage."""
    stage = argv[argv.index("gqa_jax") + 1]
    if "--dst" in argv:
        return Path(argv[argv.index("--dst") + 1]).parent, stage
    return Path(argv[argv.index("--workdir") + 1]), stage


def popen_leaving_outputs(started: list[list[str]], sweep: Sweep, fail: dict[str, str] | None = None):
    """A ``scheduler._popen`` whose child leaves the run's outputs and exits 0 (a run in ``fail``
    prints that text and exits 2, leaving nothing); each start's argv after ``gqa_jax`` is
    appended to ``started``."""
    needed = outputs.needed(sweep.runs)
    fail = fail or {}

    def popen(argv, log_file, env, server):
        started.append(argv[argv.index("gqa_jax") + 1 :])
        directory, _ = output_dir(argv)
        if directory.name in fail:
            code = f"import sys; print({fail[directory.name]!r}); sys.exit(2)"
            return subprocess.Popen([sys.executable, "-c", code], stdout=log_file, stderr=subprocess.STDOUT)
        write_outputs(directory, needed[directory.name])
        return subprocess.Popen([sys.executable, "-c", "pass"])

    return popen


def statuses(root: Path) -> dict[str, str]:
    """Each run's status (not of the directories set aside: ``<name>.redo-<time>`` ...)."""
    found = {p.parent.name: json.loads(p.read_text())["status"] for p in root.glob("*/run.json")}
    return {name: state for name, state in found.items() if "." not in name}


def chain() -> Sweep:
    """c (convert) -> t (time, c's model) -> e (evaluate, c's model, after t); u (time) on its own."""
    from gqa_jax.experiments import runs as R

    return Sweep("chain", (
        R.convert("c", "/src/model", 1),
        R.time("t", "tiny", None, 16, 4, batch=2, model="{run:c}/model", deps=("c",)),
        R.evaluate("e", "{run:c}/model", "stdlib_calls", {}, deps=("c", "t")),
        R.time("u", "tiny", 1, 16, 4, batch=2),
    ), {})  # fmt: skip
