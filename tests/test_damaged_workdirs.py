"""A damaged run directory through ``python -m gqa_jax train`` (``main`` in this process, stderr
caught at the file descriptor, and the log records a library's thread would print): a wrong layout
is one line before any work, a damaged run file is set aside beside its replacement and named in
one line (docs/training.md#damaged-run-files), and no traceback reaches the terminal."""

import io
import json
import logging

import numpy as np
import pytest
import tensorflow_datasets as tfds
from test_run_dirs import PRETRAIN, flags, one_line_error, snapshot

from gqa_jax import __main__ as cli
from gqa_jax import unreadable
from gqa_jax.training.journal import WorkdirJournal
from gqa_jax.training.workdir import write_record


def train(capfd, workdir, vocab, data_dir, steps=2, **fields):
    """``python -m gqa_jax train`` in this process -> (exit code, stderr lines)."""
    with tfds.testing.mock_data(num_examples=16):
        code = cli.main(["train", "--config", PRETRAIN, "--workdir", str(workdir),
                         *flags(vocab, data_dir, steps, **fields)])  # fmt: skip
    return code, capfd.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "name", ["checkpoints", "checkpoints/0", "tensorboard", "model", "decodes", "config.json/", "lock.json/"]
)
def test_a_file_where_a_folder_belongs_is_one_line_before_any_work(
    capfd, caplog, small_vocab, tmp_path, name
):
    """(A trailing / makes a folder where the run writes a file.)"""
    wd = tmp_path / "run"
    wrong = wd / name.rstrip("/")
    wrong.parent.mkdir(parents=True)
    if name.endswith("/"):
        (wrong / "notes.txt").parent.mkdir()
        (wrong / "notes.txt").write_text("mine")
    else:
        wrong.write_text("mine")
    before = snapshot(wd)
    code, lines = train(capfd, wd, small_vocab.path, tmp_path / "data")
    kind = (
        "a folder where the run writes a file"
        if name.endswith("/")
        else "a file where the run writes a folder"
    )
    one_line_error(code, lines, f"workdir {wd}: {name.rstrip('/')} is {kind}: move it away")
    assert len(lines) == 1, lines
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert snapshot(wd) == before and sorted(p.name for p in wd.iterdir()) == [wrong.relative_to(wd).parts[0]]


def set_aside_lines(lines, name):
    """The stderr lines that say ``name`` was set aside."""
    return [line for line in lines if f"/{name} " in line and f"set it aside as {name}.unreadable-" in line]


def test_run_files_a_crash_left_damaged_are_set_aside_beside_their_replacements(capfd, small_vocab, tmp_path):
    """What a crash before the first checkpoint can leave: config.json and model_config.json cut
    short (the latter not even text), no checkpoint. The run starts at step 0, keeps each damaged
    file byte for byte as <name>.unreadable-<time> and says so in one line each."""
    wd = tmp_path / "run"
    (wd / "tensorboard").mkdir(parents=True)
    (wd / "metrics.jsonl").write_bytes(b"")
    damaged = {
        "config.json": b'{\n  "batch_size": 4,\n  "checkpoint_every',
        "model_config.json": b"\xff\xfe{",
    }
    for name, data in damaged.items():
        (wd / name).write_bytes(data)
    code, lines = train(capfd, wd, small_vocab.path, tmp_path / "data", steps=1)
    assert code == 0 and not any("Traceback" in line for line in lines), lines
    for name, data in damaged.items():
        [line] = set_aside_lines(lines, name)
        assert "is unreadable" in line and line.endswith("; the run writes a new one"), line
        [kept] = wd.glob(f"{name}.unreadable-*")
        assert kept.read_bytes() == data and kept.name in line
    assert json.loads((wd / "config.json").read_text())["num_train_steps"] == 1
    assert json.loads((wd / "model_config.json").read_text())["num_kv_heads"] >= 1


def test_a_set_aside_file_is_moved_back_when_the_start_fails(tmp_path, capfd):
    """``write_record`` sets an unreadable run file aside before writing it anew (here a cut-short
    calibration.npz); the rollback of a start that fails puts back exactly what was there."""
    wd = tmp_path / "run"
    wd.mkdir()
    archive = io.BytesIO()
    np.savez(archive, cross=np.ones((1, 2, 2)))
    (wd / "calibration.npz").write_bytes(archive.getvalue()[:20])
    (wd / "config.json").write_bytes(b"\x00{")
    before = snapshot(wd)
    journal = WorkdirJournal(wd)
    write_record(wd / "calibration.npz", archive.getvalue(), journal, unreadable.npz_problem)
    write_record(wd / "config.json", "{}\n", journal)
    err = capfd.readouterr().err
    assert "calibration.npz is unreadable (BadZipFile): set it aside as calibration.npz.unreadable-" in err
    assert unreadable.npz_problem(wd / "calibration.npz") is None
    assert len(list(wd.glob("*.unreadable-*"))) == 2
    journal.rollback()
    journal.release()
    assert snapshot(wd) == before
