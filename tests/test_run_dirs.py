"""Run directories a researcher can trust, through the command line (``gqa_jax.__main__.main``
in this process, and real ``train`` processes for the lock and the signals): every bad value or
bad file is one line on stderr with exit code 2 and no traceback, and the workdir keeps exactly
what it held (nothing lost, nothing duplicated, nothing left by a start that failed)."""

import errno
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorflow_datasets as tfds
from flax import nnx

from gqa_jax import __main__ as cli
from gqa_jax import checkpoints, file_lock, metric_writers
from gqa_jax.config import preset
from gqa_jax.data import stdlib_extract
from gqa_jax.model import T5
from gqa_jax.training.workdir import FILES, FOLDERS

REPO = Path(__file__).resolve().parents[1]
PRETRAIN = str(REPO / "configs" / "pretrain.py")


# The model of the tests that train: one encoder and one decoder layer (half the tiny preset's
# programs to compile); what they check (the workdir, the lock, the signals) holds at any depth.
ONE_LAYER = {"model.num_encoder_layers": 1, "model.num_decoder_layers": 1}


def flags(vocab, data_dir, steps=3, **fields):
    out = [
        f"--config.vocab={vocab}", f"--config.data_dir={data_dir}", "--config.task=c4_span",
        "--config.batch_size=4", "--config.input_length=64", "--config.log_every=1",
        "--config.progress=False", "--config.eval_every=-1", f"--config.num_train_steps={steps}",
        "--config.checkpoint_every=2",
    ]  # fmt: skip
    return out + [f"--config.{k}={v}" for k, v in fields.items()]


def train(capsys, workdir, vocab, data_dir, *extra, config=PRETRAIN, steps=3, **fields):
    """``python -m gqa_jax train`` in this process -> (exit code, stderr lines)."""
    with tfds.testing.mock_data(num_examples=16):
        code = cli.main(["train", "--config", config, "--workdir", str(workdir),
                         *flags(vocab, data_dir, steps, **fields), *extra])  # fmt: skip
    return code, capsys.readouterr().err.strip().splitlines()


def one_line_error(code, lines, *needles):
    """Exit code 2 and a last stderr line ``... error: <message>`` holding every needle; no traceback."""
    assert code == 2, lines
    assert not any("Traceback" in line for line in lines), lines
    assert "error: " in lines[-1], lines
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])


def snapshot(directory):
    """Every file under ``directory`` with its bytes (what 'nothing lost or changed' compares)."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


def steps_of(workdir):
    return [m["step"] for m in metric_writers.read_metrics(workdir)]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("keep_checkpoints", 0, "config.keep_checkpoints must be an integer >= 1, got 0"),
        ("keep_checkpoints", -1, "config.keep_checkpoints must be an integer >= 1, got -1"),
        ("target_length", 0, "config.target_length must be an integer >= 2"),
        ("input_length", 0, "config.input_length must be an integer >= 2"),
        ("eval_batch_size", 0, "config.eval_batch_size must be an integer >= 1"),
        ("eval_examples", 0, "config.eval_examples must be an integer >= 1"),
        ("eval_every", -2, "config.eval_every must be an integer"),
        ("optimizer.learning_rate", 0.0, "config.optimizer.learning_rate must be a finite number > 0"),
        ("optimizer.warmup_steps", 0, "config.optimizer.warmup_steps must be an integer >= 1"),
        ("optimizer.schedule", "linear", "config.optimizer.schedule must be None (pretrain uses T5's rsqrt"),
        ("model.dropout_rate", 1.5, "config.model.dropout_rate must be a number in [0, 1)"),
        ("model.num_kv_heads", 0, "config.model.num_kv_heads must be an integer >= 1"),
        ("model.remat", "most", "config.model.remat must be one of none, full"),
        ("input_length", "long", "config.input_length takes a value of type int"),  # a None default
        ("init_from", "runs/x", "runs/x' does not apply to pre-training"),  # made absolute
    ],
)
def test_bad_config_values_are_one_line_and_write_nothing(
    capsys, small_vocab, tmp_path, field, value, message
):
    workdir = tmp_path / "run"
    code, lines = train(capsys, workdir, small_vocab.path, tmp_path / "data", **{field: value})
    one_line_error(code, lines, message)
    assert not workdir.exists()


def test_a_config_file_with_a_wrong_type_is_one_line(capsys, small_vocab, tmp_path):
    config = tmp_path / "mine.py"
    config.write_text(
        "from gqa_jax import run_config\n"
        f"base = run_config.load_module({str(REPO / 'configs' / 'base.py')!r})\n"
        "def get_config():\n    c = base.get_config()\n    c.input_length = '128'\n    return c\n"
    )
    code, lines = train(capsys, tmp_path / "run", small_vocab.path, tmp_path / "data", config=str(config))
    one_line_error(code, lines, f"config file {config}: Could not override field 'input_length'")
    assert not (tmp_path / "run").exists()


def test_empty_file_and_unwritable_workdirs_are_one_line(capsys, small_vocab, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_error(*train(capsys, "", small_vocab.path, tmp_path / "data"), "workdir is an empty path")
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory
    code, lines = train(capsys, "", small_vocab.path, tmp_path / "data", "--debug")
    assert code == 2 and "Traceback (most recent call last):" in lines  # --debug shows where
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    one_line_error(*train(capsys, afile, small_vocab.path, tmp_path / "data"), "is a file, not a directory")
    one_line_error(*train(capsys, afile / "run", small_vocab.path, tmp_path / "data"), "Not a directory")
    assert afile.read_text() == "mine"

    def denied(file, record):  # a read-only workdir (the tests may run as root, who may write anywhere)
        raise PermissionError(errno.EACCES, "Permission denied", str(file))

    monkeypatch.setattr(file_lock, "_create", denied)
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "keep.txt").write_text("x")
    code, lines = train(capsys, ro, small_vocab.path, tmp_path / "data")
    one_line_error(code, lines, "Permission denied", str(ro / "lock.json"), "check the path's permissions")
    assert snapshot(ro) == {"keep.txt": b"x"}


def test_model_overrides_that_cannot_apply_to_a_loaded_checkpoint_are_errors(capsys, small_vocab, tmp_path):
    source = checkpoints.save(T5(preset("tiny", vocab_size=small_vocab.vocab_size), rngs=nnx.Rngs(0)),
                              tmp_path / "mha")  # fmt: skip
    finetune = str(REPO / "configs" / "finetune.py") + f":task=stdlib_docsum,init={source}"
    uptrain = str(REPO / "configs" / "uptrain.py") + f":source={source}"
    workdir = tmp_path / "ft"
    for config, field, value, message in [
        (finetune, "model.num_kv_heads", 1, "config.model.num_kv_heads=1 does not apply to the checkpoint"),
        (finetune, "model.preset", "small", "config.model.preset='small' sets a model shape"),
        (finetune, "model.param_dtype", "bfloat16", "config.model.param_dtype='bfloat16' does not apply"),
        (uptrain, "model.num_kv_heads", 2, "config.model.num_kv_heads does not apply to uptraining"),
    ]:
        task = "stdlib_docsum" if config == finetune else "c4_span"
        code, lines = train(capsys, workdir, small_vocab.path, tmp_path / "data", config=config,
                            **{"task": task, field: value})  # fmt: skip
        one_line_error(code, lines, message)
        assert not workdir.exists()


def test_damaged_checkpoint_files_are_one_line(capsys, small_vocab, tmp_path):
    import torch  # noqa: F401  (the HF writer)
    from hf_models import tiny_hf_t5
    from t5x_files import t5x_from_ours, write_legacy

    model = T5(preset("tiny", vocab_size=small_vocab.vocab_size), rngs=nnx.Rngs(0))
    ours = checkpoints.save(model, tmp_path / "ours")
    t5x = write_legacy(tmp_path / "t5x", t5x_from_ours(model))
    chunk = t5x / "target.decoder.layers_1.mlp.wo.kernel" / "0.0"
    chunk.write_bytes(chunk.read_bytes()[:10])  # a truncated zarr chunk
    for f in Path(ours, "params").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[:10])  # truncated array chunks
    hf = tmp_path / "hf"
    tiny_hf_t5(ffn="gated-gelu", tie=False, separate_head=True, buckets=32, max_distance=128, seed=0,
               vocab=small_vocab.vocab_size).save_pretrained(hf)  # fmt: skip
    weights = (hf / "model.safetensors").read_bytes()
    finetune = str(REPO / "configs" / "finetune.py")
    workdir = tmp_path / "ft"
    cases = [
        (ours, lambda: None, "ours/params: cannot read the param", "the checkpoint is damaged"),
        (t5x, lambda: None, f"T5X checkpoint {t5x}: cannot read decoder.layers_1.mlp.wo.kernel"),
        (hf, lambda: (hf / "model.safetensors").write_bytes(weights[: len(weights) // 2]),
         "model.safetensors cannot be read", "download it again"),
        (hf, lambda: ((hf / "model.safetensors").write_bytes(weights),
                      (hf / "config.json").write_text((hf / "config.json").read_text()[:40])),
         "its config.json is not a T5 config", "download"),
    ]  # fmt: skip
    for source, damage, *needles in cases:
        damage()
        code, lines = train(capsys, workdir, small_vocab.path, tmp_path / "data",
                            config=f"{finetune}:init={source}", task="stdlib_docsum")  # fmt: skip
        one_line_error(code, lines, *needles)
        assert not workdir.exists()


@pytest.mark.parametrize("command", ["train finetune", "train uptrain", "evaluate", "bench cache"])
def test_a_missing_model_is_named_before_any_vocabulary_is_built(tmp_path, capsys, command):
    """Without a vocabulary a stdlib task builds the suite's corpus and trains its vocabulary
    (minutes) into the data dir: a wrong starting checkpoint or --model is the error first, and
    the data dir and the workdir are left as they were."""
    data, missing, workdir = tmp_path / "data", tmp_path / "no_such_model", tmp_path / "run"
    data.mkdir()
    configs, task = REPO / "configs", ["--task", "stdlib_calls", "--data-dir", str(data)]
    argv = {
        "train finetune": ["train", "--config", f"{configs}/finetune.py:task=stdlib_calls,init={missing}"],
        "train uptrain": ["train", "--config", f"{configs}/uptrain.py:source={missing},kv=1"],
        "evaluate": ["evaluate", "--model", str(missing), *task],
        "bench cache": ["bench", "cache", "--model", str(missing), *task],
    }[command]
    if command.startswith("train"):
        corpus = "stdlib_span" if command == "train uptrain" else "stdlib_calls"
        argv += ["--workdir", str(workdir), f"--config.data_dir={data}", f"--config.task={corpus}"]
    elif command == "evaluate":
        argv += ["--workdir", str(workdir)]
    code = cli.main(argv)
    one_line_error(code, capsys.readouterr().err.strip().splitlines(), f"source {missing} does not exist")
    assert not list(data.iterdir()) and not workdir.exists()


def test_data_prepare_without_network_fails_fast(capsys, tmp_path, monkeypatch):
    def unreachable(address, timeout=None):
        raise OSError(errno.ENETUNREACH, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    t0 = time.time()
    code = cli.main(["data", "prepare", "cnn_dailymail", "--data-dir", str(tmp_path / "tfds")])
    lines = capsys.readouterr().err.strip().splitlines()
    one_line_error(code, lines, "reaches none of", "on a machine with network access")
    assert time.time() - t0 < 30


def test_restart_refusals_moves_aside_rollback_and_leftovers(capsys, small_vocab, tmp_path, monkeypatch):
    """The lifecycle of one workdir: a finished run; a restart whose checkpoints are gone is
    refused, then allowed with restart_from_scratch (the old metrics moved aside, not duplicated);
    a failing restart leaves every byte as it was; a truncated config.json is named; what a
    killed export left is removed; a full disk mid-run is one line and the run resumes."""
    wd, data = tmp_path / "run", tmp_path / "data"
    run = functools.partial(train, capsys, wd, small_vocab.path, data, **ONE_LAYER)
    code, lines = run()
    assert code == 0, lines
    assert steps_of(wd) == [1, 2, 3] and not (wd / "lock.json").exists()

    # every checkpoint unreadable: each is moved aside, and a silent restart at step 0 is refused
    for ckpt in (wd / "checkpoints").iterdir():
        for f in (ckpt / "state").rglob("*"):
            if f.is_file():
                f.write_bytes(b"garbage")
    code, lines = run()
    one_line_error(
        code,
        lines,
        "holds an earlier run's metrics.jsonl",
        "restart_from_scratch=True",
        "corrupt_checkpoints",
    )
    assert len(list((wd / "corrupt_checkpoints").iterdir())) == 3 and steps_of(wd) == [1, 2, 3]
    before = snapshot(wd)
    code, lines = run(restart_from_scratch=True)
    assert code == 0, lines
    assert steps_of(wd) == [1, 2, 3]  # the new run's steps, once
    [previous] = (wd / "previous").iterdir()
    assert (previous / "metrics.jsonl").read_bytes() == before["metrics.jsonl"]  # moved, not lost
    assert (previous / "model" / "checkpoint.json").is_file()

    # a restart that fails before its first step (here: its data) leaves every byte as it was
    before = snapshot(wd)

    def broken_pipeline(*args, **kwargs):
        raise ValueError("the data is gone")

    from gqa_jax.data import pipeline as pipeline_lib

    with monkeypatch.context() as m:
        m.setattr(pipeline_lib, "make_pipeline", broken_pipeline)
        code, lines = run(steps=5)  # config.json would say 5
    one_line_error(code, lines, "the data is gone")
    assert snapshot(wd) == before

    # a killed export's leftovers are removed by the next run that owns the workdir
    (wd / "model.tmp-0123abcd").mkdir()
    (wd / "model.tmp-0123abcd" / "config.json").write_text("{}")
    code, lines = run()
    assert code == 0 and any("removed" in line and "model.tmp-0123abcd" in line for line in lines), lines
    assert not (wd / "model.tmp-0123abcd").exists() and steps_of(wd) == [1, 2, 3]

    assert {p.name for p in wd.iterdir()} <= set(FOLDERS + FILES)  # the layout check knows them all

    # a truncated config.json is named, and nothing changes
    (wd / "config.json").write_text((wd / "config.json").read_text()[:50])
    before = snapshot(wd)
    one_line_error(*run(steps=5), f"{wd / 'config.json'} cannot be read")
    assert snapshot(wd) == before


def test_full_disk_sigterm_and_ctrl_c_during_a_save_stop_cleanly(capsys, small_vocab, tmp_path, monkeypatch):
    wd, data = tmp_path / "run", tmp_path / "data"
    run = functools.partial(train, capsys, wd, small_vocab.path, data, **ONE_LAYER)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    write = metric_writers.MetricWriter.write

    def full_at_step_2(self, step, row):
        if step == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(wd / "metrics.jsonl"))
        return write(self, step, row)

    with monkeypatch.context() as m:
        m.setattr(metric_writers.MetricWriter, "write", full_at_step_2)
        code, lines = run(steps=6)
    one_line_error(code, lines, "No space left on device", "metrics.jsonl", "free some space")
    assert steps_of(wd) == [1] and (wd / "checkpoints" / "0").is_dir() and not (wd / "lock.json").exists()

    def term_at_step_3(self, step, row):  # a scheduler's SIGTERM arrives during step 3's logging
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return write(self, step, row)

    with monkeypatch.context() as m:
        m.setattr(metric_writers.MetricWriter, "write", term_at_step_3)
        code, lines = run(steps=6)
    assert code == 128 + signal.SIGTERM and not any("Traceback" in line for line in lines), lines
    assert lines[-1].endswith(
        "stopped at step 3 on SIGTERM (checkpoint 3 is saved); resume with the same command"
    )
    assert steps_of(wd) == [1, 2, 3] and (wd / "checkpoints" / "3").is_dir()

    save = ocp.CheckpointManager.save

    def ctrl_c_during_save(self, step, *args, **kwargs):
        if step == 4:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while checkpoint 4 is written
        return save(self, step, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(ocp.CheckpointManager, "save", ctrl_c_during_save)
        code, lines = run(steps=6)
    assert code == 128 + signal.SIGINT and not any("Traceback" in line for line in lines), lines
    assert "stopped at step 4 on SIGINT (checkpoint 4 is saved)" in lines[-1]
    code, lines = run(steps=6)
    assert code == 0 and any("from step 4" in line for line in lines), lines
    assert steps_of(wd) == [1, 2, 3, 4, 5, 6]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # put back


def test_leftovers_of_a_killed_save_are_tidied(tmp_path):
    model = T5(preset("tiny", vocab_size=512), rngs=nnx.Rngs(0))
    dst = checkpoints.save(model, tmp_path / "ckpt")
    (tmp_path / "ckpt.tmp-00000000").mkdir()
    assert checkpoints.clean_leftovers(dst) == [
        f"removed {tmp_path / 'ckpt.tmp-00000000'}, left by a killed save"
    ]
    # killed between the two renames of an overwrite: the previous checkpoint is moved back
    old = tmp_path / "ckpt.old-11111111"
    old.mkdir()
    dst.rename(old / "ckpt")
    lines = checkpoints.clean_leftovers(dst)
    assert "moved the previous checkpoint back" in lines[0] and (dst / "checkpoint.json").is_file()
    assert not old.exists()
    checkpoints.load(dst)


def test_a_second_run_is_refused_and_sigint_stops_the_first(capsys, suite_subset, small_vocab, tmp_path,
                                                             monkeypatch):  # fmt: skip
    """A ``python -m gqa_jax train`` process holds the lock: the same command in this process is
    refused, SIGINT stops the process at a saved checkpoint, and the command resumes from it."""
    data, env = suite_subset
    monkeypatch.setenv(stdlib_extract.MAX_FILES_ENV, "16")  # the subset, for the runs in this process
    wd = tmp_path / "run"

    def argv(steps):
        return [
            "train", "--config", PRETRAIN, "--workdir", str(wd),
            f"--config.data_dir={data}", f"--config.vocab={small_vocab.path}", "--config.batch_size=4",
            "--config.input_length=64", f"--config.num_train_steps={steps}",
            "--config.checkpoint_every=1000",
            "--config.log_every=1", "--config.eval_every=-1", "--config.progress=False",
            *(f"--config.{k}={v}" for k, v in ONE_LAYER.items()),
        ]  # fmt: skip

    first = subprocess.Popen(
        [sys.executable, "-m", "gqa_jax", *argv(10_000)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.time() + 300
        while len(steps_of(wd) if (wd / "metrics.jsonl").is_file() else []) < 2:
            assert first.poll() is None, first.stderr.read().decode()[-3000:]
            assert time.time() < deadline
            time.sleep(0.05)
        code = cli.main(argv(10_000))  # the second run
        lines = capsys.readouterr().err.strip().splitlines()
        one_line_error(code, lines, f"workdir {wd} is in use by pid {first.pid}", "lock.json")
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=300)
    finally:
        first.kill()
    lines = err.decode().strip().splitlines()
    assert first.returncode == 128 + signal.SIGINT and not any("Traceback" in line for line in lines), lines
    stopped = int(lines[-1].split("stopped at step ")[1].split()[0])
    assert lines[-1].endswith(f"(checkpoint {stopped} is saved); resume with the same command")
    assert steps_of(wd) == list(range(1, stopped + 1))  # the refused run wrote nothing
    assert sorted(p.name for p in (wd / "checkpoints").iterdir()) == ["0", str(stopped)]
    assert json.loads((wd / "config.json").read_text())["num_train_steps"] == 10_000

    code = cli.main(argv(stopped + 2))  # resumed
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert f"from step {stopped}" in err
    assert steps_of(wd) == list(range(1, stopped + 3))


def test_fine_tuning_keeps_the_last_checkpoints_and_the_best_scored_one(capsys, suite_subset, small_vocab,
                                                                        tmp_path, monkeypatch):  # fmt: skip
    """keep_checkpoints=2 with evaluations at steps 3 and 6: the unscored checkpoints (0, 1, 2, 4)
    go, the last two and the best scored one stay."""
    from gqa_jax.data import stdlib_extract

    data, _ = suite_subset
    monkeypatch.setenv(stdlib_extract.MAX_FILES_ENV, "16")
    wd = tmp_path / "ft"
    code = cli.main(["train", "--config", str(REPO / "configs" / "finetune.py") + ":task=stdlib_docsum",
                     "--workdir", str(wd), f"--config.data_dir={data}", f"--config.vocab={small_vocab.path}",
                     "--config.batch_size=4", "--config.input_length=64", "--config.target_length=16",
                     "--config.num_train_steps=6", "--config.checkpoint_every=1", "--config.eval_every=3",
                     "--config.eval_examples=4", "--config.eval_batch_size=4", "--config.keep_checkpoints=2",
                     "--config.progress=False", "--noconfig.eval_at_start",
                     *(f"--config.{k}={v}" for k, v in ONE_LAYER.items())])  # fmt: skip
    assert code == 0, capsys.readouterr().err[-3000:]
    best = json.loads((wd / "summary.json").read_text())["best_step"]
    scores = {r["step"]: r["eval/rouge1"] for r in metric_writers.read_metrics(wd / "metrics.jsonl")
              if "eval/rouge1" in r}  # fmt: skip
    assert set(scores) == {3, 6} and best == max(scores, key=lambda k: (scores[k], k))
    kept = {int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit()}
    assert kept == {5, 6, best}
    assert {p.name for p in wd.iterdir()} <= set(FOLDERS + FILES)


def test_the_best_step_is_the_highest_scored_checkpoint_not_the_latest(tmp_path):
    """The run's manager: best_step() is the highest saved score (the later step on a tie), never an
    unscored checkpoint, and it holds for a manager reopened on the same directory (a resume)."""
    from gqa_jax.training.workdir import checkpoint_manager

    manager = checkpoint_manager(tmp_path, keep=2, best=True)
    scores = {1: 5.0, 2: 9.0, 3: None, 4: 4.0, 5: None}
    for step, score in scores.items():
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"x": np.zeros(2)}),
                                                   data=ocp.args.JsonSave({"step": step})),
                     metrics=None if score is None else {"score": score}, force=True)  # fmt: skip
    manager.wait_until_finished()
    assert set(manager.all_steps()) == {2, 4, 5}  # the last two and the best scored one
    assert manager.best_step() == 2 and manager.latest_step() == 5
    manager.save(6, args=ocp.args.Composite(state=ocp.args.StandardSave({"x": np.zeros(2)}),
                                            data=ocp.args.JsonSave({"step": 6})),
                 metrics={"score": 9.0}, force=True)  # fmt: skip
    manager.wait_until_finished()
    assert manager.best_step() == 6  # a tie: the later step
    manager.close()
    reopened = checkpoint_manager(tmp_path, keep=2, best=True)
    assert reopened.best_step() == 6
    reopened.close()


def test_a_restart_reads_a_path_stored_as_typed_as_it_is_now(tmp_path, monkeypatch):
    from gqa_jax import run_config
    from gqa_jax.errors import RunError
    from gqa_jax.training import workdir as workdir_lib

    monkeypatch.chdir(tmp_path)
    finetune = REPO / "configs" / "finetune.py"
    config = run_config.load(finetune, ["--config.vocab=spm.model"])
    run = tmp_path / "run"
    run.mkdir()
    stored = json.loads(json.dumps(config.to_dict(), default=str)) | {"vocab": "spm.model"}  # as typed
    (run / "config.json").write_text(json.dumps(stored))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    workdir_lib.check_workdir(run, config)  # the same command from the same directory: no change
    with pytest.raises(RunError, match="different config"):
        workdir_lib.check_workdir(run, run_config.load(finetune, ["--config.vocab=b.model"]))
