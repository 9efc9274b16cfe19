"""profiling: the step spec, and a trace of exactly the asked steps of a loop."""

import jax
import jax.numpy as jnp
import pytest
import tensorflow_datasets as tfds
from jax.profiler import ProfileData

from gqa_jax import profiling, run_config, training


def test_parse_steps():
    assert profiling.parse_steps("3:5", "--x") == (3, 5)
    assert profiling.parse_steps("4", "--x") == (4, 4)
    assert profiling.parse_steps(None, "--x") is None and profiling.parse_steps("", "--x") is None
    for bad in ("a:b", "5:3", "-1:2"):
        with pytest.raises(ValueError, match=r"^--x="):
            profiling.parse_steps(bad, "--x")


def test_step_trace_records_the_asked_steps_only(tmp_path):
    @jax.jit
    def step(x):
        return jnp.tanh(x @ x) + 1.0

    x = jnp.ones((64, 64))
    trace = profiling.StepTrace(tmp_path, (2, 3))
    for i in range(6):
        trace.before(i)
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            x = step(x)
        trace.after(i, x)
    trace.close()
    (file,) = profiling.trace_files(tmp_path)
    events = [e for p in ProfileData.from_file(str(file)).planes for line in p.lines for e in line.events]
    steps = sorted(dict(e.stats)["step_num"] for e in events if e.name == "train")
    assert steps == [2, 3]
    assert profiling.trace_files(tmp_path / "none") == []


def test_a_train_run_traces_its_profile_steps_beside_its_tensorboard_events(small_vocab, tmp_path):
    over = [
        f"--config.vocab={small_vocab.path}",
        f"--config.data_dir={tmp_path / 'data'}",
        "--config.task=c4_span",
        "--config.batch_size=2",
        "--config.input_length=32",
        "--config.progress=False",
        "--config.eval_every=-1",
        "--config.num_train_steps=4",
    ]
    with tfds.testing.mock_data(num_examples=8):
        training.train(
            run_config.load("configs/pretrain.py", [*over, "--config.profile_steps=2:3"]), tmp_path / "r"
        )
    (file,) = profiling.trace_files(tmp_path / "r" / "tensorboard")
    events = [e for p in ProfileData.from_file(str(file)).planes for line in p.lines for e in line.events]
    assert sorted(dict(e.stats)["step_num"] for e in events if e.name == "train") == [2, 3]
    with pytest.raises(ValueError, match=r"config.profile_steps='3:1'"):
        training.train(
            run_config.load("configs/pretrain.py", [*over, "--config.profile_steps=3:1"]), tmp_path / "x"
        )
    assert not (tmp_path / "x").exists()
