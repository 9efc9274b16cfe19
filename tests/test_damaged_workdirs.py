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
from test_run_dirs import ONE_LAYER, PRETRAIN, flags, one_line_error, snapshot, steps_of

from gqa_jax import __main__ as cli
from gqa_jax import unreadable
from gqa_jax.training.journal import WorkdirJournal
from gqa_jax.training.workdir import truncate_metrics, write_record


def train(capfd, workdir, vocab, data_dir, steps=2, **fields):
    """``python -m gqa_jax train`` (one encoder and one decoder layer) in this process -> (exit code,
    stderr lines)."""
    with tfds.testing.mock_data(num_examples=16):
        code = cli.main(["train", "--config", PRETRAIN, "--workdir", str(workdir),
                         *flags(vocab, data_dir, steps, **ONE_LAYER, **fields)])  # fmt: skip
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
        wrong.mkdir()
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


def test_files_a_restart_reads_back_damaged_are_set_aside_and_it_resumes(capfd, small_vocab, tmp_path):
    """A finished run (checkpoints 0 and 2), then each file a restart reads back damaged: the lock,
    checkpoint 2's data position (JSON the pipeline cannot take), a half-written line inside
    metrics.jsonl, summary.json cut short, model/ without its marker. The restart resumes from
    checkpoint 0 and names each in one line; each is kept byte for byte."""
    wd, data = tmp_path / "run", tmp_path / "data"
    code, lines = train(capfd, wd, small_vocab.path, data)
    assert code == 0, lines
    position = b'{"step": 2, "grain": {"parent": 7}}'
    (wd / "checkpoints" / "2" / "data" / "metadata").write_bytes(position)
    metrics = (wd / "metrics.jsonl").read_text().splitlines()
    (wd / "metrics.jsonl").write_text("\n".join([metrics[0], '{"step": 2, "train/lo', *metrics[1:]]) + "\n")
    (wd / "lock.json").write_bytes(b"garbage")
    (wd / "summary.json").write_bytes(b'{"steps": 2')
    (wd / "model" / "checkpoint.json").unlink()
    model_before = snapshot(wd / "model")
    code, lines = train(capfd, wd, small_vocab.path, data)
    assert code == 0 and not any("Traceback" in line for line in lines), lines

    def one(*needles):
        [line] = [x for x in lines if all(n in x for n in needles)]
        return line

    one(
        f"taking over the stale lock {wd / 'lock.json'}",
        "(the lock file is unreadable): set it aside as lock.json.",
    )
    assert [p.read_bytes() for p in wd.glob("lock.json.unreadable-*")] == [b"garbage"]
    one("checkpoint 2 in", "cannot be restored (TypeError", "moved it to")
    [aside] = (wd / "corrupt_checkpoints").iterdir()
    assert (aside / "data" / "metadata").read_bytes() == position
    one(
        f"{wd / 'metrics.jsonl'}: moved 3 line(s) to metrics.discarded.jsonl",
        "(2 logged after step 0, 1 unreadable)",
    )
    assert '{"step": 2, "train/lo' in (wd / "metrics.discarded.jsonl").read_text().splitlines()
    assert steps_of(wd) == [1, 2]  # each step once: resumed from checkpoint 0
    one("summary.json is unreadable (JSONDecodeError): set it aside as summary.json.unreadable-")
    assert [p.read_bytes() for p in wd.glob("summary.json.unreadable-*")] == [b'{"steps": 2']
    one("model is not a complete checkpoint (no checkpoint.json): set it aside as model.unreadable-")
    [kept] = wd.glob("model.unreadable-*")
    assert snapshot(kept) == model_before and unreadable.checkpoint_problem(wd / "model") is None


def test_a_metrics_file_that_is_not_text_is_set_aside_whole_on_resume(tmp_path, capfd):
    wd = tmp_path / "run"
    wd.mkdir()
    (wd / "metrics.jsonl").write_bytes(b'{"step": 1}\n\xff\xfe\n')
    journal = WorkdirJournal(wd)
    truncate_metrics(wd, 1, journal)
    journal.release()
    [kept] = wd.glob("metrics.jsonl.unreadable-*")
    assert kept.read_bytes() == b'{"step": 1}\n\xff\xfe\n' and not (wd / "metrics.jsonl").exists()
    assert "metrics.jsonl is unreadable (UnicodeDecodeError): set it aside as" in capfd.readouterr().err
