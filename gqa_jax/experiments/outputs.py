"""What a done run must have left, and what a failed run's log says.

A run is done when its ``run.json`` says so and its outputs are there and readable: each stage's
own (``STAGE_OUTPUTS``) and every ``{run:NAME}/PATH`` another run of the sweep reads from it (a
fine-tuning run's ``best_model/``, which its evaluate run scores), readable as
``gqa_jax.unreadable`` says (a checkpoint directory complete, a JSON file an object). Nothing here
imports JAX: the runner checks files only.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax.experiments.sweep import RUN_REF, Run
from gqa_jax.unreadable import checkpoint_problem, json_problem

RUN_FILE = "run.json"
LOG_FILE = "log.txt"
# evaluate_stage.RESULTS and tools.t_infer.TIMING_FILE (the same test checks them)
STAGE_OUTPUTS = {
    "pretrain": ("model",),
    "uptrain": ("model",),
    "finetune": ("model",),
    "convert": ("model",),
    "evaluate": ("results.json",),
    "time": ("timing.json",),
}


def record(root: Path, name: str) -> dict[str, Any]:
    """``ROOT/<name>/run.json`` as a dict ({} when missing or unreadable)."""
    try:
        found = json.loads((root / name / RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


# "{run:NAME}/PART" anywhere in a value (a config variant too: "source={run:NAME}/model,kv=1")
_RUN_PATH = re.compile(RUN_REF.pattern + r"/([A-Za-z0-9_.-]+)")


def needed(runs: Iterable[Run]) -> dict[str, tuple[str, ...]]:
    """Each run's outputs: its stage's, and the paths other runs read from it (``{run:NAME}/x``:
    ``x``'s first part)."""
    runs = list(runs)
    out = {r.name: list(STAGE_OUTPUTS.get(r.stage, ())) for r in runs}
    for r in runs:
        for value in r.args.values():
            for m in _RUN_PATH.finditer(str(value)):
                if m.group(1) in out and m.group(2) not in out[m.group(1)]:
                    out[m.group(1)].append(m.group(2))
    return {name: tuple(parts) for name, parts in out.items()}


def problem(directory: Path, outputs: Sequence[str]) -> str | None:
    """What is wrong with the outputs of the run in ``directory`` (``"results.json is missing"``),
    None when every one is there and readable."""
    for name in outputs:
        path = directory / name
        if name.endswith(".json"):
            why = json_problem(path)
        elif not path.exists():
            why = "is missing"
        else:
            why = checkpoint_problem(path)
        if why:
            return f"{name}{'/' if not name.endswith('.json') else ''} {why}"
    return None


def _when(text: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(str(text))
    except ValueError:
        return None


def newer_dependencies(runs: Sequence[Run], root: Path) -> dict[str, str]:
    """The begun runs one of whose done dependencies finished after the run started (it ran on
    an older output of that dependency, e.g. a fine-tuning run redone after its evaluate run had
    scored it), each with why."""
    records = {r.name: record(root, r.name) for r in runs}
    found = {}
    for r in runs:
        began = _when(records[r.name].get("started") or records[r.name].get("finished"))
        if began is None:
            continue
        for d in r.deps:
            dep = records.get(d, {})
            finished = _when(dep.get("finished")) if dep.get("status") == "done" else None
            if finished is not None and finished > began:
                found[r.name] = f"its dependency {d} finished after it started"
                break
    return found


def broken(runs: Sequence[Run], root: Path, outputs: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """The runs recorded done whose outputs are missing or unreadable, each with what is wrong."""
    found = {}
    for r in runs:
        if record(root, r.name).get("status") == "done":
            why = problem(root / r.name, outputs.get(r.name, ()))
            if why:
                found[r.name] = why
    return found


_CLI_ERROR = re.compile(r": error: ")
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def error_line(text: str, limit: int = 300) -> str:
    """The line of a failed run's output that says why: the last command-line error
    (``python -m gqa_jax train: error: ...``), else the last raised exception's line, else the
    last line; '' when there is none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for pattern in (_CLI_ERROR, _RAISED):
        hits = [line for line in lines if pattern.search(line)]
        if hits:
            return _short(hits[-1], limit)
    return _short(lines[-1], limit) if lines else ""


def _short(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."
