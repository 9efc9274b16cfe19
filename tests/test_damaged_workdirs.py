"""A damaged run directory through ``python -m gqa_jax train`` (``main`` in this process, stderr
caught at the file descriptor, and the log records a library's thread would print): a wrong layout
is one line before any work, a damaged run file is set aside beside its replacement and named in
one line (docs/training.md#damaged-run-files), and no traceback reaches the terminal."""

import logging

import pytest
import tensorflow_datasets as tfds
from test_run_dirs import PRETRAIN, flags, one_line_error, snapshot

from gqa_jax import __main__ as cli


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
