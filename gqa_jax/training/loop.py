"""The one ``train()`` loop: pre-training, uptraining and fine-tuning, chosen by the config.

Every run lives in one workdir (``gqa_jax.training.workdir`` lists its files) and runs on a
mesh: ``config.mesh`` ("DATAxMODEL"), or a 1x1 mesh of one device by default, so one device and
a pod take the same code path. Each process reads its own slice of every batch, checkpoints hold
every process's data position, and only process 0 writes logs, configs, decodes and the final
model. A workdir with checkpoints resumes from the newest readable one (model, optimizer, data
position, PRNG) and continues exactly as if never stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from tqdm import tqdm

from gqa_jax import (
    calibration,
    checkpoints,
    convert,
    distributed,
    metric_writers,
    metrics,
    paths,
    profiling,
    sharding,
    unreadable,
)
from gqa_jax import model as model_lib
from gqa_jax.config import ModelConfig, preset
from gqa_jax.data import pipeline as pipeline_lib
from gqa_jax.data import stdlib_suite
from gqa_jax.data import tasks as tasks_lib
from gqa_jax.data import vocab as vocab_lib
from gqa_jax.log import log
from gqa_jax.training.evaluation import evaluate
from gqa_jax.training.journal import WorkdirJournal
from gqa_jax.training.state import OptimizerConfig, TrainState, create_state, make_optimizer, make_schedule
from gqa_jax.training.step import make_train_step
from gqa_jax.training.stops import Stopped, StopSignals
from gqa_jax.training.validate import check_config, checkpoint_overrides, starts_from
from gqa_jax.training.workdir import (
    check_layout,
    check_workdir,
    checkpoint_manager,
    clean_exports,
    config_dict,
    config_json,
    export_problem,
    refuse_or_set_aside,
    restore,
    restore_params,
    set_aside_unreadable,
    stop_on_nan,
    truncate_metrics,
    write_record,
)

DEFAULT_PRESET = "tiny"  # a model trained from random weights without config.model.preset


def num_steps(config: Any) -> int:
    """Steps of this run: ``round(alpha x original_steps)`` (at least 1) when uptraining, 0 at
    alpha 0 (the converted model is saved, and scored with ``eval_at_start``); else num_train_steps."""
    if config.recipe == "uptrain":
        if config.uptrain.alpha == 0:
            return 0
        return max(1, round(config.uptrain.alpha * config.uptrain.original_steps))
    return int(config.num_train_steps)


def load_vocab(path: str | None, task: Any, data_dir: str) -> Any:
    """The SentencePiece vocabulary at ``path`` (the suite's own of some size is trained where it is
    missing); without one, the stdlib suite's for its tasks."""
    size = stdlib_suite.suite_vocab_size(path, data_dir) if path else None
    if size is not None:
        return stdlib_suite.suite_vocab(data_dir, size)
    if path:
        return vocab_lib.load_vocab(path)
    if task.suite:
        return stdlib_suite.suite_vocab(data_dir)
    raise ValueError(f"task {task.name} needs config.vocab: the SentencePiece model of the checkpoint (T5's)")


def _model_config(config: Any, vocab: Any) -> Any:
    overrides = {k: v for k, v in config_dict(config.model).items() if k != "preset" and v is not None}
    overrides.setdefault("vocab_size", vocab.vocab_size)
    if "grouped_attentions" in overrides:
        overrides["grouped_attentions"] = tuple(overrides["grouped_attentions"])
    return preset(config.model.preset or DEFAULT_PRESET, **overrides)


def init_model(config: Any, vocab: Any, mesh: Any = None) -> tuple[Any, OptimizerConfig, dict[str, Any]]:
    """The starting model (a ``T5``, or its ``ModelConfig`` when it starts from random weights, so
    a sharded run can create them sharded), the optimizer settings and what was done (uptraining:
    ``info["conversion"]`` is the conversion manifest). On a ``mesh`` of several devices a starting
    checkpoint is loaded straight into its shardings. A calibrated conversion
    (``uptrain.calibration_batches``) also returns its statistics file's bytes as
    ``info["calibration_file"]``."""
    mesh = mesh if mesh is not None and mesh.devices.size > 1 else None
    info: dict[str, Any] = {"recipe": config.recipe}
    opt = config.optimizer
    if config.recipe == "pretrain":
        return _model_config(config, vocab), OptimizerConfig("rsqrt", warmup_steps=opt.warmup_steps), info
    if config.recipe == "uptrain":
        up = config.uptrain
        source, source_cfg, kind = checkpoints.load_any(up.source, mesh=mesh)
        attentions = tuple(up.attentions) if up.attentions else convert.DEFAULT_ATTENTIONS
        statistics = None
        if up.calibration_batches:
            statistics, gathered = calibration.gather(
                source, attentions=attentions, task=up.calibration_task or config.task,
                data_dir=config.data_dir or tasks_lib.default_data_dir(), vocab=vocab,
                batches=up.calibration_batches, batch_size=up.calibration_batch_size,
                input_length=config.input_length, seed=config.seed,
            )  # fmt: skip
        params, cfg, manifest = convert.to_grouped(
            source, source_cfg, up.num_kv_heads, up.method, attentions=attentions, seed=config.seed,
            calibration=statistics,
        )  # fmt: skip
        if statistics is not None:
            manifest["calibration"], info["calibration_file"] = convert.stored_calibration(
                statistics, manifest["calibration"], gathered
            )
        manifest["source_path"] = str(up.source)
        cfg = cfg.replace(**checkpoint_overrides(config, cfg, up.source))
        model = model_lib.build(cfg, params)
        offset = up.source_step if up.source_step is not None else up.original_steps
        info |= {"source": str(up.source), "source_kind": kind, "schedule_offset": int(offset),
                 "num_kv_heads": up.num_kv_heads, "method": up.method, "conversion": manifest}  # fmt: skip
        return model, OptimizerConfig("rsqrt", warmup_steps=opt.warmup_steps, offset=int(offset)), info
    # finetune
    if config.init_from:
        source, source_cfg, kind = checkpoints.load_any(config.init_from, mesh=mesh)
        cfg = source_cfg.replace(**checkpoint_overrides(config, source_cfg, config.init_from))
        model = model_lib.build(cfg, source)
        info |= {"init_from": str(config.init_from), "source_kind": kind}
    else:
        model = _model_config(config, vocab)
        info["init_from"] = None
    schedule = opt.schedule or "constant"  # "linear" decays to 0 at the run's last step
    return model, OptimizerConfig(schedule, opt.learning_rate, decay_steps=config.num_train_steps), info


def _scored_at(workdir: Any, step: int) -> bool:
    """Whether metrics.jsonl holds an evaluation at ``step`` (a resumed run does not repeat it)."""
    if not (workdir / metric_writers.METRICS_FILE).is_file():
        return False
    return any(m.get("step") == step and any(k.startswith("eval/") for k in m)
               for m in metric_writers.read_metrics(workdir))  # fmt: skip


def train(config: Any, workdir: Any) -> dict[str, Any]:
    """Run (or resume) the recipe ``config.recipe`` in ``workdir``; returns the summary dict.

    A workdir with checkpoints resumes from the newest readable one (model, optimizer, data
    position, PRNG) and continues exactly as if never stopped. The run holds the workdir's lock
    while it trains (a second run is refused), stops cleanly on SIGINT / SIGTERM (``Stopped``), and
    a start that fails before its first step leaves the workdir as it found it
    (``journal.WorkdirJournal``).
    """
    check_config(config)
    workdir = paths.resolve(workdir, "workdir")
    paths.check_reachable(workdir, "workdir")
    task = tasks_lib.get_task(config.task)
    if source := starts_from(config):  # a wrong path is named before the suite's vocabulary is built
        checkpoints.check_source(source)
    data_dir = config.data_dir or tasks_lib.default_data_dir()
    check_layout(workdir)  # a file where a folder belongs (or the reverse), before anything is written
    # creates the workdir and takes its lock before anything is written or built: an unreachable or
    # busy workdir is named before the suite's vocabulary is built
    journal = WorkdirJournal(workdir)
    try:
        vocab = load_vocab(config.vocab, task, data_dir)
        with StopSignals() as stops:
            return _train(config, workdir, task, data_dir, vocab, journal, stops)
    except Stopped:
        raise  # a clean stop keeps everything: resume with the same command
    except Exception:
        journal.rollback()  # only undoes a start that failed before its first step
        raise
    finally:
        journal.release()


@dataclasses.dataclass
class _Run:
    """What ``_setup`` builds for the step loop and the export (the train state travels apart)."""

    config: Any
    workdir: Any
    task: Any
    vocab: Any
    data_dir: str
    journal: WorkdirJournal
    stops: StopSignals
    is_main: bool  # only process 0 writes logs, configs and reports
    mesh: Any
    graphdef: Any
    schedule: Callable[[Any], Any]  # the learning rate at a step, jitted (one program, not one per op)
    step_fn: Callable[[TrainState, Any], tuple[TrainState, Any]]
    manager: Any  # the orbax CheckpointManager of workdir/checkpoints
    batches: Any  # this process's batch iterator
    slice_count: int  # how many slices the batch rows are read in (one per process, or fewer)
    writer: Any  # the MetricWriter (process 0), else None
    trace: profiling.StepTrace  # config.profile_steps' trace, into workdir/tensorboard
    total: int  # num_steps(config)
    start: int  # the restored step (0 on a fresh start)
    resumed: bool
    summary: dict[str, Any]


def _train(config: Any, workdir: Any, task: Any, data_dir: str, vocab: Any, journal: WorkdirJournal,
           stops: StopSignals) -> dict[str, Any]:  # fmt: skip
    """``train`` once the workdir is locked: set up, train the steps, export; closes what it opened."""
    run, state = _setup(config, workdir, task, data_dir, vocab, journal, stops)
    bar = tqdm(total=run.total, initial=run.start, disable=not (run.is_main and config.progress), unit="step",
               dynamic_ncols=True)  # fmt: skip
    try:
        state = _steps(run, state, bar)
        summary = _export(run, state)
        journal.committed = True
        return summary
    finally:
        bar.close()
        run.trace.close()
        run.manager.wait_until_finished()
        run.manager.close()
        if run.writer:
            run.writer.close()


def _setup(config: Any, workdir: Any, task: Any, data_dir: str, vocab: Any, journal: WorkdirJournal,
           stops: StopSignals) -> tuple[_Run, TrainState]:  # fmt: skip
    """Check the workdir, build the model, its train state and the step, restore (or start) and
    open the data and the metric writer: the ``_Run`` and the state to train from."""
    is_main = jax.process_index() == 0
    check_workdir(workdir, config)
    if is_main:
        clean_exports(workdir)
    total = num_steps(config)
    mesh = sharding.make_mesh(config.mesh or "1x1")  # one code path: one device is a 1x1 mesh
    model, opt_cfg, info = init_model(config, vocab, mesh)
    manifest = info.pop("conversion", None)
    calibration_file = info.pop("calibration_file", None)  # bytes
    model_cfg = model if isinstance(model, ModelConfig) else model.config
    if model_cfg.vocab_size < vocab.vocab_size:
        raise ValueError(
            f"the model's vocab_size {model_cfg.vocab_size} is smaller than the vocabulary's "
            f"{vocab.vocab_size}: use the vocabulary the checkpoint was trained with"
        )
    optimizer = make_optimizer(opt_cfg)
    rules = sharding.train_rules(config.fsdp, model_cfg.d_model, mesh)
    state, shardings, graphdef, replicated = create_state(model, optimizer, mesh, config.seed, rules)
    del model
    if config.mesh:
        log(f"mesh {dict(mesh.shape)} over {jax.process_count()} process(es): "
            + sharding.replication_report(replicated))  # fmt: skip
    pipe, slice_count = _train_pipeline(config, task, vocab, data_dir, mesh)
    manager = checkpoint_manager(workdir, config.keep_checkpoints, best=task.metric is not None)

    def resume(saved: Any) -> Any:  # a position the pipeline cannot take: set aside like a corrupt checkpoint
        return pipe.iterator(state=distributed.own_data_state(saved))

    state, batches = restore(manager, state, workdir, resume)
    resumed, start = batches is not None, int(state.step)
    _resume_or_start(config, workdir, journal, start, resumed, is_main)
    if is_main:  # after the decision to run: a refused start leaves these files as they were
        _write_run_files(workdir, journal, config, model_cfg, manifest, calibration_file)
    if total == 0:
        log(f"{workdir}: alpha 0, the converted model is saved without a training step")
    elif start >= total:
        log(f"{workdir} already at step {start} >= {total}: nothing to train")
    batches = batches if resumed else pipe.iterator()
    dropout = config.recipe == "finetune" and (config.model.dropout_rate or 0) > 0
    step_fn = make_train_step(
        graphdef, optimizer, mesh=mesh, state_shardings=shardings, num_microbatches=config.num_microbatches,
        z_loss=config.z_loss, dropout=dropout, rules=rules,
    )  # fmt: skip
    writer = metric_writers.MetricWriter(workdir) if is_main else None
    traced = profiling.parse_steps(config.profile_steps, "config.profile_steps")
    run = _Run(
        config=config, workdir=workdir, task=task, vocab=vocab, data_dir=data_dir, journal=journal,
        stops=stops, is_main=is_main, mesh=mesh, graphdef=graphdef, schedule=jax.jit(make_schedule(opt_cfg)),
        step_fn=step_fn, manager=manager, batches=batches, slice_count=slice_count, writer=writer,
        total=total, start=start, resumed=resumed, summary={"steps": total, **info},
        trace=profiling.StepTrace(workdir / metric_writers.TENSORBOARD_DIR, traced),
    )  # fmt: skip
    return run, state


def _resume_or_start(config: Any, workdir: Any, journal: WorkdirJournal, start: int, resumed: bool,
                     is_main: bool) -> None:  # fmt: skip
    """Say whether the run resumes; a resumed run drops metric lines after ``start``, a fresh one
    refuses (or sets aside) an earlier run's metrics."""
    if resumed:
        log(f"resuming {workdir} from step {start} (its checkpoint {start})")
        if config.get("restart_from_scratch"):
            log(f"restart_from_scratch is ignored: checkpoint {start} can be resumed")
        if is_main:
            truncate_metrics(workdir, start, journal)
    else:
        refuse_or_set_aside(workdir, config, journal)  # an earlier run's metrics: never duplicated
        log(f"{workdir}: starting at step 0")


def _write_run_files(workdir: Any, journal: WorkdirJournal, config: Any, model_cfg: ModelConfig,
                     manifest: dict[str, Any] | None, calibration_file: bytes | None) -> None:  # fmt: skip
    """config.json, model_config.json and, when uptraining, conversion.json and calibration.npz,
    each written whole, an unreadable one set aside first (``write_record``)."""
    write_record(workdir / "config.json", config_json(config), journal)
    write_record(workdir / "model_config.json", model_cfg.to_json() + "\n", journal)
    if manifest is not None:
        write_record(workdir / "conversion.json", json.dumps(manifest, indent=2, default=str) + "\n", journal)
    if calibration_file is not None:
        write_record(workdir / convert.CALIBRATION_FILE, calibration_file, journal, unreadable.npz_problem)


def _train_pipeline(config: Any, task: Any, vocab: Any, data_dir: str, mesh: Any) -> tuple[Any, int]:
    """This process's train pipeline, and how many slices the rows are read in: each process reads
    its own slice of every batch (processes holding the same rows of the mesh read the same slice)."""
    slice_index, slice_count = distributed.process_data_slice(mesh)
    train_pipe = pipeline_lib.make_pipeline(
        task, "train", vocab, batch_size=config.batch_size, seed=config.seed, data_dir=data_dir,
        pack=config.pack, input_length=config.input_length, target_length=config.target_length,
        process_index=slice_index, process_count=slice_count,
    )  # fmt: skip
    return train_pipe, slice_count


def _evaluate(run: _Run, state: TrainState, step: int) -> float | None:
    """Score ``state`` on the task's dev set (every process, on the mesh); process 0 writes the
    scores and the decodes. Returns the headline score (None for a task without a metric)."""
    model = (run.graphdef, state.params)
    config, task = run.config, run.task
    t0 = time.time()
    scores, decodes = evaluate(
        model, task, run.vocab, num_examples=config.eval_examples, batch_size=config.eval_batch_size,
        data_dir=run.data_dir, input_length=config.input_length, target_length=config.target_length,
        mesh=run.mesh,
    )  # fmt: skip
    if run.writer:
        run.writer.write(
            step, {f"eval/{k}": v for k, v in scores.items()} | {"eval/seconds": time.time() - t0}
        )
        if decodes:
            metric_writers.write_decodes(
                run.workdir / "decodes" / f"step_{step}.jsonl",
                [d["input"] for d in decodes], [d["prediction"] for d in decodes],
                [d["reference"] for d in decodes],
            )  # fmt: skip
    log(f"step {step}: eval " + ", ".join(f"{k} {v:.4g}" for k, v in scores.items()))
    if task.metric is None:
        return None
    return scores[metrics.PRIMARY[task.metric]]


def _save(run: _Run, state: TrainState, step: int, score: float | None) -> None:
    """Checkpoint ``state`` and every process's data position as step ``step`` (with its score)."""
    # The device buffers are donated to the next step: orbax copies every process's shards to
    # host before save() returns.
    run.manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(distributed.all_data_states(run.batches.get_state())),
        ),
        metrics=None if score is None else {"score": float(score)},
        force=True,
    )


def _stop_if_asked(run: _Run, state: TrainState, step: int, saved: bool) -> None:
    """On SIGINT / SIGTERM: checkpoint ``step`` (unless ``saved``) and raise ``Stopped``."""
    signum = run.stops.requested()
    if signum:
        if not saved:
            _save(run, state, step, None)
        run.manager.wait_until_finished()
        raise Stopped(step, signum)


@dataclasses.dataclass
class _Throughput:
    """Time, tokens and steps since the last logged step."""

    since: float
    tokens: float = 0.0
    steps: int = 0


def _train_row(run: _Run, m: dict[str, Any], step: int, meter: _Throughput) -> dict[str, float]:
    """The metrics.jsonl row of step ``step + 1``: the step's metrics, learning rate and throughput."""
    elapsed = max(time.time() - meter.since, 1e-9)
    row = {f"train/{k}": float(v) for k, v in m.items()}
    row |= {
        "train/learning_rate": float(run.schedule(step)),
        "train/seconds_per_step": elapsed / meter.steps,
        "train/tokens_per_second": meter.tokens / elapsed,
        "train/examples_seen": (step + 1) * run.config.batch_size,
    }
    return row


def _steps(run: _Run, state: TrainState, bar: Any) -> TrainState:
    """Train from ``run.start`` to ``run.total``: log, evaluate and checkpoint as the config says,
    stop on a NaN and on SIGINT / SIGTERM. Returns the last state."""
    config = run.config
    meter = _Throughput(time.time())
    if not run.resumed:  # a checkpoint before anything runs: a kill from here on loses little
        _save(run, state, 0, None)
    if config.eval_at_start and config.eval_every >= 0 and run.start == 0 and not _scored_at(run.workdir, 0):
        _evaluate(run, state, 0)  # the starting point's score: the baseline fine-tuning must beat
    _stop_if_asked(run, state, run.start, saved=True)
    for step in range(run.start, run.total):
        done = step + 1
        batch = next(run.batches)  # this process's rows
        run.trace.before(done)
        with jax.profiler.StepTraceAnnotation("train", step_num=done):
            state, m = run.step_fn(state, distributed.global_batch(batch, run.mesh))
        run.trace.after(done, m)
        m = jax.device_get(m)
        run.journal.committed = True  # the run has started: a later failure keeps what it wrote
        if not (math.isfinite(float(m["loss"])) and math.isfinite(float(m["grad_norm"]))):
            stop_on_nan(run.workdir, done, m, batch, run.manager.latest_step())
        input_tokens = float(np.sum(batch["encoder_input_tokens"] != 0)) * run.slice_count  # ~ all rows
        meter.tokens += input_tokens + float(m["tokens"])
        meter.steps += 1
        bar.update(1)
        if done % config.log_every == 0 or done == run.total:
            row = _train_row(run, m, step, meter)
            if run.writer:
                run.writer.write(done, row)
            bar.set_postfix(loss=f"{row['train/loss']:.3f}")
            meter = _Throughput(time.time())
        score = None
        every = config.eval_every
        if every >= 0 and ((every and done % every == 0) or done == run.total):
            score = _evaluate(run, state, done)
        saved = done % config.checkpoint_every == 0 or done == run.total or score is not None
        if saved:
            _save(run, state, done, score)  # evaluated steps are saved too: the best one is kept
        _stop_if_asked(run, state, done, saved)
    return state


def _export(run: _Run, state: TrainState) -> dict[str, Any]:
    """Write model/ (the final parameters), best_model/ (the best scored checkpoint's) and
    summary.json (process 0); returns the summary."""
    run.manager.wait_until_finished()
    summary = run.summary | {"final_step": int(state.step)}
    best = run.manager.best_step() if run.task.metric is not None else None
    if best is not None:
        summary |= {"best_step": int(best)}
    final_params = distributed.to_host(state.params)
    best_params = None  # the best dev checkpoint, exported for the evaluate stage
    if best is not None:
        same = int(best) == int(state.step)
        best_params = final_params if same else distributed.to_host(restore_params(run.manager, state, best))
    if run.is_main:
        exports = {"model": final_params} | ({"best_model": best_params} if best_params is not None else {})
        for name, params in exports.items():
            set_aside_unreadable(run.workdir / name, run.journal, export_problem)
            checkpoints.save(nnx.merge(run.graphdef, params), run.workdir / name, overwrite=True)
        write_record(
            run.workdir / "summary.json", json.dumps(summary, indent=2, default=str) + "\n", run.journal
        )
    return summary
