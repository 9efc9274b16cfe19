"""The one ``train()`` loop: pre-training, uptraining and fine-tuning, chosen by the config.

Every run lives in one workdir (``gqa_jax.training.workdir`` lists its files) and runs on a
mesh: ``config.mesh`` ("DATAxMODEL"), or a 1x1 mesh of one device by default, so one device and
a pod take the same code path. Each process reads its own slice of every batch, checkpoints hold
every process's data position, and only process 0 writes logs, configs, decodes and the final
model. A workdir with checkpoints resumes from the newest readable one (model, optimizer, data
position, PRNG) and continues exactly as if never stopped.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from tqdm import tqdm

from gqa_jax import calibration, checkpoints, convert, distributed, metric_writers, metrics, paths, sharding
from gqa_jax import model as model_lib
from gqa_jax.config import ModelConfig, preset
from gqa_jax.data import pipeline as pipeline_lib
from gqa_jax.data import stdlib_suite
from gqa_jax.data import tasks as tasks_lib
from gqa_jax.data import vocab as vocab_lib
from gqa_jax.log import log
from gqa_jax.training.evaluation import evaluate
from gqa_jax.training.journal import WorkdirJournal
from gqa_jax.training.state import OptimizerConfig, create_state, make_optimizer, make_schedule
from gqa_jax.training.step import make_train_step
from gqa_jax.training.stops import Stopped, StopSignals
from gqa_jax.training.validate import check_config, checkpoint_overrides, starts_from
from gqa_jax.training.workdir import (
    check_workdir,
    checkpoint_manager,
    clean_exports,
    config_dict,
    refuse_or_set_aside,
    restore,
    restore_params,
    stop_on_nan,
    truncate_metrics,
    write_config,
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
    """The SentencePiece vocabulary at ``path``; without one, the stdlib suite's for its tasks."""
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
    a start that fails before its first step leaves the workdir as it found it (``journal.WorkdirJournal``).
    """
    check_config(config)
    workdir = paths.resolve(workdir, "workdir")
    task = tasks_lib.get_task(config.task)
    if source := starts_from(config):  # a wrong path is named before the suite's vocabulary is built
        checkpoints.check_source(source)
    data_dir = config.data_dir or tasks_lib.default_data_dir()
    vocab = load_vocab(config.vocab, task, data_dir)
    lock = WorkdirJournal(workdir)  # creates the workdir and takes its lock before anything is written
    try:
        with StopSignals() as stops:
            return _train(config, workdir, task, data_dir, vocab, lock, stops)
    except Stopped:
        raise  # a clean stop keeps everything: resume with the same command
    except Exception:
        lock.rollback()  # only undoes a start that failed before its first step
        raise
    finally:
        lock.release()


def _train(config: Any, workdir: Any, task: Any, data_dir: str, vocab: Any, lock: WorkdirJournal,
           stops: StopSignals) -> dict[str, Any]:  # fmt: skip
    is_main = jax.process_index() == 0  # only process 0 writes logs, configs and reports
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
    schedule = make_schedule(opt_cfg)
    rules = sharding.train_rules(config.fsdp, model_cfg.d_model, mesh)
    state, shardings, graphdef, replicated = create_state(model, optimizer, mesh, config.seed, rules)
    del model
    if config.mesh:
        log(f"mesh {dict(mesh.shape)} over {jax.process_count()} process(es): "
            + sharding.replication_report(replicated))  # fmt: skip

    manager = checkpoint_manager(workdir, config.keep_checkpoints, best=task.metric is not None)
    state, data_state = restore(manager, state, workdir)
    resumed, start = data_state is not None, int(state.step)
    if resumed:
        log(f"resuming {workdir} from step {start} (its checkpoint {start})")
        if config.get("restart_from_scratch"):
            log(f"restart_from_scratch is ignored: checkpoint {start} can be resumed")
        if is_main:
            truncate_metrics(workdir, start)
    else:
        refuse_or_set_aside(workdir, config, lock)  # an earlier run's metrics: never duplicated
        log(f"{workdir}: starting at step 0")
    if is_main:  # after the decision to run: a refused start leaves these files as they were
        write_config(workdir, config)
        (workdir / "model_config.json").write_text(model_cfg.to_json() + "\n")
        if manifest is not None:
            (workdir / "conversion.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        if calibration_file is not None:
            (workdir / convert.CALIBRATION_FILE).write_bytes(calibration_file)
    if total == 0:
        log(f"{workdir}: alpha 0, the converted model is saved without a training step")
    elif start >= total:
        log(f"{workdir} already at step {start} >= {total}: nothing to train")

    # Each process reads its own slice of every batch (processes holding the same rows of the
    # mesh read the same slice).
    slice_index, slice_count = distributed.process_data_slice(mesh)
    train_pipe = pipeline_lib.make_pipeline(
        task, "train", vocab, batch_size=config.batch_size, seed=config.seed, data_dir=data_dir,
        pack=config.pack, input_length=config.input_length, target_length=config.target_length,
        process_index=slice_index, process_count=slice_count,
    )  # fmt: skip
    batches = train_pipe.iterator(state=distributed.own_data_state(data_state))
    dropout = config.recipe == "finetune" and (config.model.dropout_rate or 0) > 0
    step_fn = make_train_step(
        graphdef, optimizer, mesh=mesh, state_shardings=shardings, num_microbatches=config.num_microbatches,
        z_loss=config.z_loss, dropout=dropout, rules=rules,
    )  # fmt: skip
    writer = metric_writers.MetricWriter(workdir) if is_main else None
    summary: dict[str, Any] = {"steps": total, **info}

    def run_eval(step: int) -> float | None:
        model = (graphdef, state.params)  # every process runs the same evaluation on the mesh
        t0 = time.time()
        scores, decodes = evaluate(
            model, task, vocab, num_examples=config.eval_examples, batch_size=config.eval_batch_size,
            data_dir=data_dir, input_length=config.input_length, target_length=config.target_length,
            mesh=mesh,
        )  # fmt: skip
        if writer:
            writer.write(
                step, {f"eval/{k}": v for k, v in scores.items()} | {"eval/seconds": time.time() - t0}
            )
            if decodes:
                metric_writers.write_decodes(
                    workdir / "decodes" / f"step_{step}.jsonl",
                    [d["input"] for d in decodes], [d["prediction"] for d in decodes],
                    [d["reference"] for d in decodes],
                )  # fmt: skip
        log(f"step {step}: eval " + ", ".join(f"{k} {v:.4g}" for k, v in scores.items()))
        if task.metric is None:
            return None
        return scores[metrics.PRIMARY[task.metric]]

    def save(step: int, score: float | None) -> None:
        # The device buffers are donated to the next step: orbax copies every process's shards to
        # host before save() returns.
        manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=ocp.args.JsonSave(distributed.all_data_states(batches.get_state())),
            ),
            metrics=None if score is None else {"score": float(score)},
            force=True,
        )

    bar = tqdm(total=total, initial=start, disable=not (is_main and config.progress), unit="step",
               dynamic_ncols=True)  # fmt: skip
    t_last, tokens_since, steps_since = time.time(), 0.0, 0

    def stop_if_asked(step: int, saved: bool) -> None:
        signum = stops.requested()
        if signum:
            if not saved:
                save(step, None)
            manager.wait_until_finished()
            raise Stopped(step, signum)

    try:
        if not resumed:  # a checkpoint before anything runs: a kill from here on loses little
            save(0, None)
        if config.eval_at_start and config.eval_every >= 0 and start == 0 and not _scored_at(workdir, 0):
            run_eval(0)  # the starting point's score: the baseline fine-tuning must beat
        stop_if_asked(start, saved=True)
        for step in range(start, total):
            batch = next(batches)  # this process's rows
            state, m = step_fn(state, distributed.global_batch(batch, mesh))
            m = jax.device_get(m)
            done = step + 1
            lock.committed = True  # the run has started: a later failure keeps what it wrote
            if not (math.isfinite(float(m["loss"])) and math.isfinite(float(m["grad_norm"]))):
                stop_on_nan(workdir, done, m, batch, manager.latest_step())
            input_tokens = float(np.sum(batch["encoder_input_tokens"] != 0)) * slice_count  # ~ all rows
            tokens_since += input_tokens + float(m["tokens"])
            steps_since += 1
            bar.update(1)
            if done % config.log_every == 0 or done == total:
                elapsed = max(time.time() - t_last, 1e-9)
                row = {f"train/{k}": float(v) for k, v in m.items()}
                row |= {
                    "train/learning_rate": float(schedule(jnp.asarray(step))),
                    "train/seconds_per_step": elapsed / steps_since,
                    "train/tokens_per_second": tokens_since / elapsed,
                    "train/examples_seen": done * config.batch_size,
                }
                if writer:
                    writer.write(done, row)
                bar.set_postfix(loss=f"{row['train/loss']:.3f}")
                t_last, tokens_since, steps_since = time.time(), 0.0, 0
            score = None
            every = config.eval_every
            if every >= 0 and ((every and done % every == 0) or done == total):
                score = run_eval(done)
            saved = done % config.checkpoint_every == 0 or done == total or score is not None
            if saved:
                save(done, score)  # evaluated steps are saved too: the best one is kept
            stop_if_asked(done, saved)
        manager.wait_until_finished()
        summary |= {"final_step": int(state.step)}
        best = manager.best_step() if task.metric is not None else None
        if best is not None:
            summary |= {"best_step": int(best)}
        final_params = distributed.to_host(state.params)
        best_params = None  # the best dev checkpoint, exported for the evaluate stage
        if best is not None:
            same = int(best) == int(state.step)
            best_params = final_params if same else distributed.to_host(restore_params(manager, state, best))
        if is_main:
            final = nnx.merge(graphdef, final_params)
            checkpoints.save(final, workdir / "model", overwrite=True)
            if best_params is not None:
                checkpoints.save(nnx.merge(graphdef, best_params), workdir / "best_model", overwrite=True)
            (workdir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        lock.committed = True
        return summary
    finally:
        bar.close()
        manager.wait_until_finished()
        manager.close()
        if writer:
            writer.close()
