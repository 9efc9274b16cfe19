"""The sweep runner end to end (subprocesses): a tiny sweep with every stage kind runs, a SIGKILL
midway and a rerun run only the unfinished runs, a failed dependency stops only its branch."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TINY_SWEEP = """
from gqa_jax.experiments import paper
from gqa_jax.experiments import runs as R
from gqa_jax.experiments.sweep import Run, Sweep

PARAMS = {{"data_dir": {data!r}, "vocab": {vocab!r}}}


def get_sweep(params):
    common = {{"data_dir": params["data_dir"], "vocab": params["vocab"], "batch_size": 4, "progress": False,
              "log_every": 1, "input_length": 64}}
    short = dict(common, eval_every=-1, checkpoint_every=1)
    up = "source={{run:pretrain}}/model,kv=2,alpha=1.0,original_steps=2,task=stdlib_span"
    ft = "task=stdlib_docsum,init={{run:uptrain}}/model"
    runs = (
        Run("pretrain", "pretrain", dict(short, config=paper.config("pretrain"), num_train_steps=2)),
        R.convert("convert", "{{run:pretrain}}/model", 1, deps=("pretrain",)),
        Run("uptrain", "uptrain", dict(short, config=paper.config("uptrain", up)), ("pretrain",)),
        Run("finetune", "finetune", dict(common, config=paper.config("finetune", ft), num_train_steps=2,
            eval_every=1, eval_examples=4, eval_batch_size=4, target_length=8), ("uptrain",)),
        R.evaluate("evaluate", "{{run:finetune}}/best_model", "stdlib_docsum", params, deps=("finetune",),
                   examples=2, input_length=64, target_length=8),
        R.time("time", "tiny", 1, 16, 4, batch=2, runs=2),
    )
    return Sweep("tiny", runs)
"""

FAILING_SWEEP = """
from gqa_jax.experiments import runs as R
from gqa_jax.experiments.sweep import Sweep

PARAMS = {}


def get_sweep(params):
    return Sweep("failing", (
        R.time("bad", "no_such_preset", 1, 16, 4, batch=2, runs=1),
        R.time("after_bad", "tiny", 1, 16, 4, batch=2, runs=1, deps=("bad",)),
        R.time("ok", "tiny", 1, 16, 4, batch=2, runs=1),
    ))
"""


def sweep_command(file: Path, root: Path) -> list[str]:
    return [sys.executable, "-m", "gqa_jax", "sweep", str(file), "--root", str(root)]


def statuses(root: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text())["status"] for p in root.glob("*/run.json")}


def test_every_stage_runs_and_a_killed_sweep_reruns_only_the_unfinished_runs(
    suite_subset, small_vocab, tmp_path
):
    data, env = suite_subset
    file = tmp_path / "tiny.py"
    file.write_text(TINY_SWEEP.format(data=str(data), vocab=str(small_vocab.path)))
    root = tmp_path / "root"
    proc = subprocess.Popen(sweep_command(file, root), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.time() + 600
    while statuses(root).get("uptrain") != "running":  # pretrain and convert are done by then
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = statuses(root)
    assert first == {"pretrain": "done", "convert": "done", "uptrain": "running"}

    out = subprocess.run(sweep_command(file, root), cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    log = out.stderr
    assert (
        "pretrain (pretrain): done before, skipped" in log
        and "convert (convert): done before, skipped" in log
    )
    ran = [line.split("] ")[1].split(" ")[0] for line in log.splitlines() if line.endswith("running ...") or
           "running ... (log" in line]  # fmt: skip
    assert ran == ["uptrain", "finetune", "evaluate", "time"]  # only the unfinished runs ran again
    assert set(statuses(root).values()) == {"done"}
    # every stage left its outputs
    assert (root / "convert" / "model" / "manifest.json").is_file()
    assert json.loads((root / "uptrain" / "conversion.json").read_text())["method"] == "mean"
    assert (root / "finetune" / "best_model").is_dir()
    results = json.loads((root / "evaluate" / "results.json").read_text())
    assert results["task"] == "stdlib_docsum" and results["examples"] == 2 and "primary" in results
    timing = json.loads((root / "time" / "timing.json").read_text())
    assert timing["batch"] == 2 and timing["time_per_sample_s"] > 0

    again = subprocess.run(sweep_command(file, root), cwd=REPO, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stderr.count("done before, skipped") == 6


def test_a_failed_dependency_stops_only_its_branch(tmp_path):
    file = tmp_path / "failing.py"
    file.write_text(FAILING_SWEEP)
    root = tmp_path / "root"
    out = subprocess.run(sweep_command(file, root), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1
    log = out.stderr
    assert "bad (time): FAILED (exit 2)" in log
    assert (
        f"log: {root / 'bad' / 'log.txt'}" in log and "command: " in log and "--preset no_such_preset" in log
    )
    assert "invalid choice: 'no_such_preset'" in (root / "bad" / "log.txt").read_text()
    assert "after_bad (time): not run, its dependency bad failed" in log
    assert statuses(root) == {"bad": "failed", "ok": "done"}
