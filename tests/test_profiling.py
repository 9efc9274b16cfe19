"""profiling: the step spec, and a trace of exactly the asked steps of a loop."""

import jax
import jax.numpy as jnp
import pytest
from jax.profiler import ProfileData

from gqa_jax import profiling


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
