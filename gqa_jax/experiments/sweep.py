"""Sweeps as data: a sweep is a list of runs, each a stage of the paper's pipeline with its
settings and the runs it depends on; ``commands`` turns a run into its exact command line.

A sweep file (``experiments/<name>.py`` at the repository root, shipped with the package too:
``sweep mini`` names it from any directory) defines ``PARAMS`` (a dict of
the sweep's settings and their defaults, e.g. the T5.1.1 checkpoint to start from) and
``get_sweep(params) -> Sweep``; ``--set key=value`` on the command line changes a ``PARAMS``
entry, or else the field of that name in every run that has it (``--set batch_size=8``); a key
that matches neither is an error.

Stages and their commands (``python -m gqa_jax ...``; ROOT/<name> is the run's directory):

- ``pretrain`` / ``uptrain`` / ``finetune``: ``train --config FILE --workdir ROOT/<name>
  --config.FIELD=VALUE ...`` (``args["config"]`` is the config file, the rest are fields);
- ``convert``: ``convert --dst ROOT/<name>/model --src ... --num-kv-heads K --method M``;
- ``evaluate``: ``evaluate --workdir ROOT/<name> --model ... --task T --split S``;
- ``time``: ``time --workdir ROOT/<name> --preset P --num-kv-heads K --input-len S --output-len T``.

A value may name another run's directory as ``"{run:NAME}"`` (``"{run:pretrain_mha}/model"``);
the run must list NAME in its ``deps``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import importlib.util
import re
import sys
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gqa_jax import paths, shipped

STAGES = ("pretrain", "convert", "uptrain", "finetune", "evaluate", "time")
TRAIN_STAGES = ("pretrain", "uptrain", "finetune")
RUN_REF = re.compile(r"\{run:([A-Za-z0-9_.-]+)\}")


@dataclasses.dataclass(frozen=True)
class Run:
    """One stage of the pipeline: its settings (``args``), the runs it needs, its report tags."""

    name: str
    stage: str
    args: Mapping[str, Any]
    deps: tuple[str, ...] = ()
    tags: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A named list of runs and the paper's numbers its report puts beside ours."""

    name: str
    runs: tuple[Run, ...]
    paper: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def check(sweep: Sweep) -> None:
    """Names unique and safe as directory names, known stages, dependencies that exist and come
    first, every ``{run:NAME}`` reference listed in ``deps``; one ValueError naming every problem."""
    problems, seen = [], set()
    for r in sweep.runs:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", r.name) or r.name in (".", ".."):
            problems.append(f"run name {r.name!r}: use letters, digits, '_', '-' and '.' only")
        if r.name in seen:
            problems.append(f"run name {r.name!r} appears twice")
        if r.stage not in STAGES:
            problems.append(f"run {r.name}: unknown stage {r.stage!r}; stages: {', '.join(STAGES)}")
        if r.stage in TRAIN_STAGES and "config" not in r.args:
            problems.append(f"run {r.name}: a {r.stage} run needs args['config'] (configs/<file>.py)")
        for d in r.deps:
            if d not in seen:
                problems.append(f"run {r.name}: dependency {d!r} is not a run listed before it")
        for value in r.args.values():
            for ref in RUN_REF.findall(str(value)):
                if ref not in r.deps:
                    problems.append(f"run {r.name}: refers to {{run:{ref}}} without listing {ref!r} in deps")
        seen.add(r.name)
    if problems:
        raise ValueError(f"sweep {sweep.name}: " + "; ".join(problems))


def load_module(file: Path) -> Any:
    """The sweep file at ``file`` as a module (it must define ``PARAMS`` and ``get_sweep``)."""
    if not file.is_file():
        raise FileNotFoundError(f"sweep file {file} does not exist (expected experiments/<name>.py)")
    spec = importlib.util.spec_from_file_location(f"gqa_jax_sweep_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses in the file resolve their module
    with _errors_in(file, "loading it"):
        spec.loader.exec_module(module)
    for name in ("PARAMS", "get_sweep"):
        if not hasattr(module, name):
            raise ValueError(f"sweep file {file} defines no {name}")
    return module


@contextlib.contextmanager
def _errors_in(file: Path, doing: str) -> Iterator[None]:
    """The sweep file's own errors (a syntax error, an exception in it) as one ValueError naming
    its file and line; ``doing`` says when it happened."""
    file = file.resolve()
    try:
        yield
    except SyntaxError as err:
        if Path(err.filename or "").resolve() != file:
            raise
        raise ValueError(f"sweep file {file}, line {err.lineno}: SyntaxError: {err.msg}") from None
    except Exception as err:  # noqa: BLE001 (the user's file: any error is one line)
        frames = traceback.extract_tb(err.__traceback__)
        lines = [f.lineno for f in frames if Path(f.filename).resolve() == file]
        if not lines:
            raise
        raise ValueError(
            f"sweep file {file}, line {lines[-1]} ({doing}): {type(err).__name__}: {err}"
        ) from None


def _set_value(key: str, text: str, params: Mapping[str, Any]) -> Any:
    """A ``--set`` value: parsed (:func:`parse_value`), checked against the type of the PARAMS
    default it replaces, and a path made absolute (:func:`resolve_path`)."""
    value = parse_value(text)
    default = params.get(key)
    if isinstance(default, bool) and not isinstance(value, bool):
        raise ValueError(f"--set {key}={text}: {key} is true or false (default {default})")
    if isinstance(default, int) and not isinstance(default, bool) and not _is_int(value):
        raise ValueError(f"--set {key}={text}: {key} is a whole number (default {default})")
    if isinstance(default, float) and not (_is_int(value) or isinstance(value, float)):
        raise ValueError(f"--set {key}={text}: {key} is a number (default {default})")
    return resolve_path(key, value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


PATH_KEYS = ("vocab", "init_from", "source", "src", "model", "root")


def resolve_path(key: str, value: Any) -> Any:
    """A ``--set`` value that names a local path, made absolute against this working directory
    with ``~`` expanded (a sweep's runs start elsewhere): the value of a path key (``*_dir``,
    ``t5_*``, ``vocab``, ``init_from``, ``source``, ``src``, ``model``, ``root``, a task file), or
    any value that starts with ``~``, ``./`` or ``../`` or names a file or folder here. URLs
    (``gs://``) and run references (``{run:NAME}``) stay as they are."""
    if not isinstance(value, str) or RUN_REF.search(value):
        return value
    path_key = key.endswith("_dir") or key.startswith("t5_") or key in PATH_KEYS or value.endswith(".py")
    return paths.absolute(value, is_path=path_key)


def load_sweep(path: str | Path, sets: Sequence[str] = ()) -> Sweep:
    """The sweep of the file at ``path``, with ``--set key=value`` items applied (see the module
    docstring). ``path``: a sweep file, or the name of a shipped one (``mini``: ``gqa_jax.shipped``).
    Unknown keys, a file without ``get_sweep`` / ``PARAMS`` and invalid sweeps are ValueErrors
    naming the problem."""
    file = shipped.resolve(str(path), "experiments", "sweep file")
    module = load_module(file)
    params = dict(module.PARAMS)
    field_sets: dict[str, Any] = {}
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r} must look like key=value")
        if key in params:
            params[key] = _set_value(key, text, params)
        else:
            field_sets[key] = resolve_path(key, parse_value(text))
    with _errors_in(file, "in get_sweep"):
        sweep = module.get_sweep(params)
    if not isinstance(sweep, Sweep):
        raise ValueError(f"{file}: get_sweep() must return a gqa_jax.experiments.sweep.Sweep")
    for key, value in field_sets.items():
        hits = [r.name for r in sweep.runs if key in r.args]
        if not hits:
            known = sorted({k for r in sweep.runs for k in r.args} | set(params))
            raise ValueError(
                f"--set {key}: no run of sweep {sweep.name} has a field {key!r}, and it is not one of "
                f"the sweep's PARAMS; known keys: {', '.join(known)}"
            )
        runs = tuple(_with_arg(r, key, value) for r in sweep.runs)
        sweep = dataclasses.replace(sweep, runs=runs)
    check(sweep)
    return sweep


def _with_arg(run: Run, key: str, value: Any) -> Run:
    """``run`` with ``args[key] = value`` when it has that field, else ``run``."""
    return dataclasses.replace(run, args={**run.args, key: value}) if key in run.args else run


def parse_value(text: str) -> Any:
    """``--set`` values: ints, floats, true / false and none as such, anything else a string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def resolve(value: Any, root: Path) -> Any:
    """``"{run:NAME}/x"`` -> ``"ROOT/NAME/x"`` (other values unchanged)."""
    if isinstance(value, str):
        return RUN_REF.sub(lambda m: str(root / m.group(1)), value)
    return value


def _flag(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return repr(tuple(value))
    return str(value)


def command(run: Run, root: Path) -> list[str]:
    """The run's argv after ``python -m gqa_jax`` (paths resolved against ``root``)."""
    workdir = root / run.name
    args = {k: resolve(v, root) for k, v in run.args.items()}
    if run.stage in TRAIN_STAGES:
        argv = ["train", "--config", str(args.pop("config")), "--workdir", str(workdir)]
        argv += [f"--config.{k}={_flag(v)}" for k, v in args.items() if v is not None]
        return argv
    # These stages write into the run's own directory: a rerun of an unfinished one redoes it.
    if run.stage == "convert":
        argv = ["convert", "--dst", str(workdir / "model"), "--overwrite"]
    else:  # evaluate, time
        argv = [run.stage, "--workdir", str(workdir), "--overwrite"]
    for k, v in args.items():
        if v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        argv += [flag] if v is True else [flag, _flag(v)]
    return argv


def order(sweep: Sweep, only: str | None = None) -> list[Run]:
    """Runs in dependency order (the file's order: dependencies come first), those whose name
    matches the ``only`` pattern (``fnmatch``) and everything they depend on."""
    if only is None:
        return list(sweep.runs)
    wanted = {r.name for r in sweep.runs if fnmatch.fnmatchcase(r.name, only)}
    if not wanted:
        raise ValueError(
            f"--only {only!r} matches no run of sweep {sweep.name}; runs: "
            + ", ".join(r.name for r in sweep.runs)
        )
    for r in reversed(sweep.runs):  # dependencies come before their dependents
        if r.name in wanted:
            wanted |= set(r.deps)
    return [r for r in sweep.runs if r.name in wanted]
