"""A task file's prepared copy (``data prepare my_task.py``): its splits written as array_record and
read by index, in the same order and with the same resumable position as from memory; a copy made
from files that changed since refused; a bad row leaves nothing behind; and memory flat in the
split's size (the resident set's peak measured with the split at 1x and 4x)."""

import ctypes
import functools
import gc
import json
import os
from pathlib import Path

import numpy as np
from data_files import refused_by_train, rows, task_file, write

from gqa_jax.__main__ import main
from gqa_jax.data import pipeline as pl
from gqa_jax.data import task_records, tasks, user_tasks

TASK = (
    'TASK = user_tasks.from_files("mine", train="train-*.jsonl", validation="dev.csv", inputs="article", '
    'targets="summary", input_length=32, target_length=8, metric="rouge")\n'
)


def batches(file: Path, vocab, data_dir: Path, state=None, n: int = 3) -> list[dict]:
    it = pl.make_pipeline(str(file), "train", vocab, batch_size=4, seed=3, data_dir=data_dir, pack=True,
                          process_index=0, process_count=1).iterator(state=state)  # fmt: skip
    return [next(it) for _ in range(n)]


def test_a_prepared_task_reads_records_in_the_same_order_and_resumes(
    small_vocab, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(task_records, "SHARD", 7)  # 40 training examples in 6 files
    write(tmp_path / "train-0.jsonl", rows(20, 0))
    write(tmp_path / "train-1.jsonl", rows(20, 1))
    write(tmp_path / "dev.csv", rows(6, 2))
    file = task_file(tmp_path, TASK)
    data = tmp_path / "data"
    in_memory = list(tasks.open_split(str(file), "train", data))
    before = batches(file, small_vocab, data)
    assert main(["data", "prepare", str(file), "--data-dir", str(data)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "train: 40, validation: 6" and f"prepared in {data}/task_files/mine/" in err
    source = tasks.open_split(str(file), "train", data)
    assert isinstance(source, task_records.Records) and list(source) == in_memory
    assert len(list(source.path.glob("train-*.array_record"))) == 6
    after = batches(file, small_vocab, data)
    for one, other in zip(before, after, strict=True):
        assert all(np.array_equal(one[k], other[k]) for k in one)
    it = pl.make_pipeline(str(file), "train", small_vocab, batch_size=4, seed=3, data_dir=data, pack=True,
                          process_index=0, process_count=1).iterator()  # fmt: skip
    next(it)
    resumed = batches(file, small_vocab, data, state=it.get_state(), n=2)
    assert all(np.array_equal(resumed[i][k], after[i + 1][k]) for i in range(2) for k in after[0])
    assert main(["data", "prepare", str(file), "--data-dir", str(data)]) == 0  # once: found, not rewritten
    assert "task mine: found prepared in" in capsys.readouterr().err
    assert len(list((data / "task_files" / "mine").iterdir())) == 1

    write(tmp_path / "train-1.jsonl", rows(21, 1))  # the files changed since: prepare again
    err = refused_by_train(file, small_vocab.path, capsys)
    assert f"{tmp_path}/train-1.jsonl as it was before it changed: prepare it again" in err


def test_a_bad_row_found_by_data_prepare_leaves_nothing_behind(tmp_path, capsys):
    write(tmp_path / "train-0.jsonl", rows(20, 0))
    (tmp_path / "train-1.jsonl").write_text('{"article": "a", "summary": "b"}\n{"article": "c"}\n')
    write(tmp_path / "dev.csv", rows(6, 2))
    file = task_file(tmp_path, TASK)
    assert main(["data", "prepare", str(file), "--data-dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train-1.jsonl, line 2: no field 'summary'" in err[0], err
    assert not (tmp_path / "data").exists()


def _status(key: str) -> int:
    """A ``/proc/self/status`` size in bytes (``VmRSS``: resident now, ``VmHWM``: its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def peak_growth(work) -> int:
    """How far this process's resident set grew above where it was while ``work()`` ran, at its
    peak: freed memory is given back to the system first (so reusing it counts) and the kernel's
    peak is reset to the present (Linux: ``/proc/self/clear_refs``)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    work()
    return _status("VmHWM") - before


def test_a_prepared_split_is_read_in_memory_flat_in_its_size(tmp_path):
    sizes = {}
    for scale in (0, 1, 4):  # 0: a small split, to start what starts once (array_record's threads)
        with (tmp_path / f"train{scale}.jsonl").open("w") as f:
            for i in range(max(1000 * scale, 10)):  # 16 kB of text a row: 16 MB at 1x
                f.write(json.dumps({"article": os.urandom(8000).hex(), "summary": str(i)}) + "\n")
        sizes[scale] = (tmp_path / f"train{scale}.jsonl").stat().st_size

    def task(scale: int) -> tasks.Task:
        return user_tasks.from_files(f"big{scale}", train=f"train{scale}.jsonl", inputs="article",
                                     targets="summary", input_length=8, target_length=8, metric="rouge",
                                     base=tmp_path)  # fmt: skip

    def prepare(scale: int) -> None:
        assert tasks.prepare(task(scale), tmp_path / "data") == {"train": max(1000 * scale, 10)}

    def read(scale: int) -> None:  # every record, by index, as training and evaluation read them
        source = tasks.open_split(task(scale), "train", tmp_path / "data")
        assert isinstance(source, task_records.Records)
        for i in range(len(source)):
            source[i]

    def in_memory(scale: int) -> None:  # not prepared: the split is held whole
        assert len(tasks.open_split(task(scale), "train", tmp_path / "none")) == max(1000 * scale, 10)

    prepare(0), read(0)
    grown = {(how.__name__, scale): peak_growth(functools.partial(how, scale))
             for how in (prepare, read, in_memory) for scale in (1, 4)}  # fmt: skip
    mib = {k: round(v / 2**20, 1) for k, v in {**grown, "split 1x": sizes[1], "split 4x": sizes[4]}.items()}
    print(f"peak growth of the resident set, MiB: {mib}")
    more = sizes[4] - sizes[1]  # 48 MB more data
    assert grown["in_memory", 4] - grown["in_memory", 1] > 0.8 * more, mib  # the measure sees a split held
    assert grown["read", 4] - grown["read", 1] < more / 16, mib
    assert grown["prepare", 4] - grown["prepare", 1] < more / 4, mib  # the writer's buffers, bounded
    assert max(grown["prepare", 4], grown["read", 4]) < sizes[4] / 3, mib
