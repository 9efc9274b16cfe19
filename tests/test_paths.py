"""User-given paths: a URL (gs://...) or an empty string is refused before anything is written,
never turned into a local directory such as ./gs:/bucket/run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gqa_jax import checkpoints, convert, paths, run_config, training
from gqa_jax.config import preset
from gqa_jax.experiments import runner
from gqa_jax.model import build

URL = "gs://my-bucket/runs/gqa8"
REPO = Path(__file__).resolve().parents[1]


def test_local_paths_and_refusals(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.local("~/runs/a", "workdir") == tmp_path / "runs" / "a"
    monkeypatch.chdir(tmp_path)
    assert paths.local("rel", "workdir") == tmp_path / "rel"
    with pytest.raises(ValueError, match="workdir 'gs://my-bucket/runs/gqa8' is a URL.*mount the bucket"):
        paths.local(URL, "workdir")
    with pytest.raises(ValueError, match="workdir is an empty path"):
        paths.local("", "workdir")


def test_no_entry_point_turns_a_url_into_a_local_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = run_config.load(str(REPO / "configs" / "pretrain.py"), [])
    model = build(preset("tiny"))
    saved = checkpoints.save(model, tmp_path / "ckpt")
    calls = {
        "train --workdir": lambda: training.train(config, URL),
        "checkpoints.save": lambda: checkpoints.save(model, URL),
        "checkpoints.load": lambda: checkpoints.load(URL),
        "load_any (convert --src, source=, init=)": lambda: checkpoints.load_any(URL),
        "convert --dst": lambda: convert.convert_checkpoint(saved, URL, 2, "mean"),
        "sweep root": lambda: runner.run_sweep(None, URL),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="is a URL: remote paths are not supported yet"):
            call()
        assert sorted(os.listdir(tmp_path)) == ["ckpt"], name  # nothing like ./gs: was created
