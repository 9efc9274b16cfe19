"""A run directory: its files, the check that a restart computes the same thing, checkpoints
(orbax, the last k and the best by the dev metric), restore, and the NaN report.

Layout:
  config.json          the resolved run config (a restart must match it, see check_workdir)
  model_config.json    the model's ModelConfig
  conversion.json      uptraining: the MHA -> GQA/MQA conversion manifest
  calibration.npz      uptraining with uptrain.calibration_batches: the conversion's statistics
  metrics.jsonl        one line per logged step (train/...) and per evaluation (eval/...)
  tensorboard/         the same scalars as TensorBoard events
  checkpoints/<step>/  orbax: the TrainState ("state") and the input position ("data")
  decodes/step_<n>.jsonl  evaluation decodes with their references
  model/               the final parameters as a gqa_jax checkpoint (for convert / decode / fine-tune)
  best_model/          fine-tuning: the checkpoint with the best dev score, as a gqa_jax checkpoint
  summary.json         final step, best evaluation step and score
  nan_step_<n>.json    written when a loss goes NaN/inf: the batch's statistics
  lock.json            held while a run trains (gqa_jax.training.lock)
  corrupt_checkpoints/<step>-<time>/  checkpoints that could not be restored, moved aside
  previous/<time>/     an earlier run's metrics, decodes and exports, moved aside by
                       ``restart_from_scratch`` (see ``refuse_or_set_aside``)
  <name>.unreadable-<time>  a run file that could not be read, set aside before its replacement
                       was written (``write_record``; docs/training.md, "Damaged run files")

``check_layout`` checks, before anything is built or written, that each of these folders is a
folder and each file a file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm

from gqa_jax import checkpoints, paths, run_config, unreadable
from gqa_jax.convert import CALIBRATION_FILE
from gqa_jax.errors import RunError
from gqa_jax.file_lock import LOCK_FILE
from gqa_jax.log import log
from gqa_jax.metric_writers import METRICS_FILE, TENSORBOARD_DIR
from gqa_jax.training.state import TrainState
from gqa_jax.training.step import Batch

# What is wrong with a file (None: it is readable), as gqa_jax.unreadable's checks say.
Problem = Callable[[Any], str | None]

# Config fields a restart may change (they do not change what is computed, or only extend it).
RESTART_MAY_CHANGE = frozenset(
    {
        "num_train_steps",
        "log_every",
        "checkpoint_every",
        "eval_every",
        "eval_at_start",
        "keep_checkpoints",
        "progress",
        "profile_steps",  # a trace of some steps: the same computation
        "mesh",  # orbax restores into whatever shardings the new mesh gives
        "model.remat",  # memory against recomputation: the same computation
        "model.scan_layers",  # the same computation, compiled once per stack
        "fsdp",  # where the parameters live, like mesh
        "restart_from_scratch",  # only read when nothing can be resumed
    }
)


def config_dict(config: Any) -> dict[str, Any]:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


# The workdir's top-level entries a run writes: folders, and files (``check_layout``).
FOLDERS = ("checkpoints", TENSORBOARD_DIR, "decodes", "model", "best_model", "previous",
           "corrupt_checkpoints")  # fmt: skip
FILES = ("config.json", "model_config.json", "conversion.json", CALIBRATION_FILE, METRICS_FILE,
         "metrics.discarded.jsonl", "summary.json", LOCK_FILE)  # fmt: skip


def check_layout(workdir: Any) -> None:
    """Every folder a run writes in ``workdir`` is a folder or absent, every file a file or absent:
    a RunError naming the wrong ones, before anything is built or written (orbax, tensorboardX and
    the exports would fail on them later, some from a thread of their own)."""
    if not workdir.is_dir():
        return  # absent (the journal makes it) or a file (the journal names it)
    is_dir = {p.name: p.is_dir() for p in workdir.iterdir() if p.name in FOLDERS + FILES}
    if is_dir.get("checkpoints"):  # orbax's step folders: it would replace a file of that name
        steps = (workdir / "checkpoints").iterdir()
        is_dir |= {f"checkpoints/{p.name}": p.is_dir() for p in steps if p.name.isdigit()}
    wrong = [
        f"{n} is a file where the run writes a folder" for n, d in is_dir.items() if not d and n not in FILES
    ]
    wrong += [f"{n} is a folder where the run writes a file" for n in FILES if is_dir.get(n)]
    if wrong:
        them = "it" if len(wrong) == 1 else "them"
        raise RunError(f"workdir {workdir}: {', '.join(wrong)}: move {them} away, or use another --workdir")


# What a run leaves that a fresh start would duplicate or overwrite.
EARLIER_WORK = ("metrics.jsonl", "metrics.discarded.jsonl", "tensorboard", "decodes", "summary.json",
                "model", "best_model")  # fmt: skip


def earlier_work(workdir: Any) -> list[Any]:
    """The files and directories of a run that trained or evaluated in ``workdir`` (metrics,
    decodes, exports, NaN reports), whatever its checkpoints; [] when it holds none (an empty
    metrics.jsonl and tensorboard/ are what a start writes before its first step)."""
    found = [workdir / n for n in EARLIER_WORK if (workdir / n).exists()]
    found += sorted(workdir.glob("nan_step_*.json"))
    metrics = workdir / "metrics.jsonl"
    if metrics in found and metrics.is_file() and not metrics.read_bytes().strip():
        found.remove(metrics)
    if [p.name for p in found] == ["tensorboard"]:
        return []
    return found


def _read_config(file: Any) -> dict[str, Any]:
    try:
        stored = json.loads(file.read_text())
        if not isinstance(stored, dict):
            raise ValueError(f"a JSON {type(stored).__name__}, not an object")
        return stored
    except (ValueError, UnicodeDecodeError) as e:
        raise RunError(
            f"{file} cannot be read ({e}), so this restart cannot be checked against the run's config: if "
            "the run used this same config, move that file away and run again (it is written anew); "
            "otherwise use another --workdir"
        ) from None


def check_workdir(workdir: Any, config: Any) -> None:
    """A workdir belongs to one run: refuse a restart with a config that computes something else.

    A workdir with no checkpoint and no metrics holds no work, and its config.json (from a start
    that was stopped before its first step) is simply replaced."""
    stored_file = workdir / "config.json"
    if not stored_file.is_file():
        return
    ckpts = workdir / "checkpoints"
    holds_work = earlier_work(workdir) or (ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.iterdir()))
    if not holds_work:
        return
    raw = _read_config(stored_file)
    stored = _flat(raw) | run_config.path_values(raw)  # a path stored as typed reads as it is now
    new = _flat(json.loads(json.dumps(config_dict(config), default=str)))
    diff = sorted(
        k for k in set(stored) | set(new) if stored.get(k) != new.get(k) and k not in RESTART_MAY_CHANGE
    )
    if diff:
        details = "; ".join(f"{k}: {stored.get(k)!r} -> {new.get(k)!r}" for k in diff[:8])
        raise RunError(
            f"workdir {workdir} holds a run with a different config ({details}); resume it with the "
            "same config, or start a new --workdir"
        )


def refuse_or_set_aside(workdir: Any, config: Any, journal: Any) -> None:
    """A start from step 0 in a workdir that holds an earlier run's metrics or exports (killed
    before its first checkpoint, or with every checkpoint unreadable): refused unless
    ``config.restart_from_scratch``, which moves them to ``previous/<time>/`` (never duplicated
    in the new metrics.jsonl, never deleted; ``journal`` moves them back if this start fails)."""
    found = earlier_work(workdir)
    if not found:
        return
    names = ", ".join(p.name for p in found)
    if not config.get("restart_from_scratch"):
        aside = workdir / "corrupt_checkpoints"
        why = f" (its unreadable checkpoints are in {aside})" if aside.is_dir() else ""
        raise RunError(
            f"workdir {workdir} holds an earlier run's {names} but no checkpoint to resume from{why}; "
            "to train again from step 0 here pass --config.restart_from_scratch=True (the earlier "
            "files are moved to previous/), or use another --workdir"
        )
    dest = unreadable.fresh(workdir / "previous" / unreadable.stamp())  # two restarts within a second
    for path in found:
        journal.move_aside(path, dest / path.name)
    log(f"restart_from_scratch: moved the earlier run's {names} to {dest}; starting at step 0")


def clean_exports(workdir: Any) -> None:
    """Tidy what a run killed while exporting model/ or best_model/ left (and say so)."""
    for name in ("model", "best_model"):
        for line in checkpoints.clean_leftovers(workdir / name):
            log(line)


def config_json(config: Any) -> str:
    """config.json's text: the resolved run config."""
    return json.dumps(config_dict(config), indent=2, sort_keys=True, default=str) + "\n"


def set_aside_unreadable(path: Any, journal: Any, problem: Problem = unreadable.json_problem) -> None:
    """Before a run writes ``path`` anew: one that cannot be read (``problem`` says why) is moved
    to ``<name>.unreadable-<time>`` beside it (moved back if this start fails, ``journal``) and
    named in one line; never replaced unseen."""
    if not path.exists() or not (why := problem(path)):
        return
    aside = unreadable.aside_path(path)
    journal.move_aside(path, aside)
    log(f"{path} {why}: set it aside as {aside.name}; the run writes a new one")


def write_record(
    file: Any, data: str | bytes, journal: Any, problem: Problem = unreadable.json_problem
) -> None:
    """Write the run file ``file`` whole (a kill leaves the old one or the new), an unreadable one
    set aside first (``set_aside_unreadable``)."""
    set_aside_unreadable(file, journal, problem)
    if isinstance(data, str):
        data = data.encode("utf-8")
    paths.write_bytes_atomic(file, data)


def export_problem(path: Any) -> str | None:
    """What is wrong with the export ``path`` (model/, best_model/) that ``checkpoints.save`` would
    refuse to replace; None for a complete checkpoint or an empty folder."""
    return unreadable.checkpoint_problem(path) if not path.is_dir() or any(path.iterdir()) else None


def _score(metrics: Mapping[str, Any]) -> float:
    """A checkpoint's dev score, as ``save`` records it (higher is better)."""
    return metrics["score"]


def checkpoint_manager(workdir: Any, keep: int, best: bool) -> Any:
    policies = [cm.LatestN(n=keep)]
    if best:  # also keep the best checkpoint by the task's headline metric (only scored ones)
        policies.append(
            cm.BestN(get_metric_fn=_score, reverse=False, n=1, keep_checkpoints_without_metrics=False)
        )
    # best_fn makes the manager write each checkpoint's score to disk and best_step() the highest
    # scored step (the later on a tie); without it best_step() is the latest step.
    best_fn = {"best_fn": _score, "best_mode": "max"} if best else {}
    options = ocp.CheckpointManagerOptions(
        preservation_policy=cm.AnyPreservationPolicy(policies),
        **best_fn,
        enable_async_checkpointing=True,
        create=True,
        cleanup_tmp_directories=True,  # a save killed midway leaves a temporary directory
    )
    return ocp.CheckpointManager(workdir / "checkpoints", options=options, item_names=("state", "data"))


def restore(
    manager: Any, state: TrainState, workdir: Any, resume: Callable[[Any], Any]
) -> tuple[TrainState, Any]:
    """The newest checkpoint that restores -> ``(state, resume(its data position))``, the batches
    from there on; ``(state, None)`` when there is none.

    A checkpoint that fails to restore (corrupt, half-written), or whose data position ``resume``
    cannot take, is moved aside to ``workdir/corrupt_checkpoints/`` with one line (never deleted),
    and the previous one is tried. A RunError from ``resume`` (a position written by another
    number of processes) is not damage: it stops the run.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            restored = manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()
                ),
            )
            return restored["state"], resume(restored["data"])
        except RunError:
            raise
        except Exception as err:  # any failure to read it back means: do not trust it
            aside = unreadable.fresh(workdir / "corrupt_checkpoints" / f"{step}-{unreadable.stamp()}")
            aside.parent.mkdir(parents=True, exist_ok=True)
            why = " ".join(str(err).split())[:200]
            log(
                f"checkpoint {step} in {workdir / 'checkpoints'} cannot be restored ({type(err).__name__}: "
                f"{why}); moved it to {aside} and trying the previous one"
            )
            paths.move(workdir / "checkpoints" / str(step), aside)
            manager.reload()
    return state, None


def restore_params(manager: Any, state: TrainState, step: int) -> Any:
    """The parameters of checkpoint ``step`` (restored into ``state``'s shardings)."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    restored = manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore())
    )
    return restored["state"].params


def truncate_metrics(workdir: Any, step: int, journal: Any) -> None:
    """On resume, move the lines of metrics.jsonl logged after the restored step, or unreadable (a
    killed run's half-written line), to metrics.discarded.jsonl, in one line; a metrics.jsonl that
    is not text is set aside whole (``set_aside_unreadable``)."""
    file = workdir / METRICS_FILE
    set_aside_unreadable(file, journal, unreadable.text_problem)
    if not file.is_file():
        return
    keep, drop, later = [], [], 0
    for line in file.read_text().splitlines():
        try:
            after = int(json.loads(line).get("step", 0)) > step
        except (ValueError, TypeError, AttributeError):  # a half-written line from the killed run
            drop.append(line)
            continue
        (drop if after else keep).append(line)
        later += after
    if drop:
        paths.append_text(workdir / "metrics.discarded.jsonl", "\n".join(drop) + "\n")
        paths.write_text_atomic(file, "".join(line + "\n" for line in keep))
        why = f"{later} logged after step {step}, {len(drop) - later} unreadable"
        log(f"{file}: moved {len(drop)} line(s) to metrics.discarded.jsonl ({why})")


def _batch_stats(batch: Mapping[str, Any]) -> dict[str, Any]:
    """What a NaN post-mortem wants to know about the batch (no token ids are needed to reproduce:
    the data position is in the checkpoint)."""
    out: dict[str, Any] = {}
    for key, value in batch.items():
        v = np.asarray(value)
        out[key] = {
            "shape": list(v.shape),
            "min": float(v.min()),
            "max": float(v.max()),
            "sum": float(v.sum()),
        }
    enc, tgt = np.asarray(batch["encoder_input_tokens"]), np.asarray(batch["decoder_target_tokens"])
    out["input_tokens_per_row"] = (enc != 0).sum(axis=1).tolist()
    out["target_tokens_per_row"] = (tgt != 0).sum(axis=1).tolist()
    return out


def stop_on_nan(workdir: Any, step: int, m: Mapping[str, Any], batch: Batch, last: int | None) -> None:
    """Write ``nan_step_<step>.json`` (metrics + batch statistics) and raise FloatingPointError."""
    file = workdir / f"nan_step_{step}.json"
    report = {
        "step": step,
        "metrics": {k: float(v) for k, v in m.items()},
        "batch": _batch_stats(batch),
        "last_checkpoint": last,
    }
    if jax.process_index() == 0:
        file.write_text(json.dumps(report, indent=2) + "\n")
    raise FloatingPointError(
        f"loss {float(m['loss'])} / grad norm {float(m['grad_norm'])} at step {step}: stopped; the batch's "
        f"statistics are in {file}; the last good checkpoint (step {last}) is untouched"
    )
