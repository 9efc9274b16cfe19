"""Data files for the task-file tests, written in the real formats by Python's own writers (csv,
json, gzip / bz2 / lzma) and pyarrow for Parquet, task files that read them, and the one line
``train`` refuses a bad one with."""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import lzma
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from gqa_jax.__main__ import main

REPO = Path(__file__).resolve().parents[1]
WORDS = "the quick brown fox jumps over lazy dog summarize question context answer def return".split()
OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def rows(n: int, seed: int) -> list[dict[str, str]]:
    out = []
    for i in range(n):
        text = " ".join(WORDS[(seed + i * 7 + j * 3) % len(WORDS)] for j in range(16))
        out.append({"article": text, "summary": " ".join(text.split()[:3])})
    return out


def write(path: Path, items: list[dict], encoding: str = "utf-8", array: bool = True) -> Path:
    """``items`` written as ``path``'s name says (``train.csv.bz2``: CSV, then bz2): CSV / TSV with
    a header row, JSON Lines, a ``.json`` array (``array=False``: one object a line), Parquet."""
    suffixes = path.suffixes
    opener = OPENERS.get(suffixes[-1], open)
    kind = suffixes[-2] if suffixes[-1] in OPENERS else suffixes[-1]
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == ".parquet":
        pq.write_table(pa.Table.from_pylist(items), path, row_group_size=2)
        return path
    with opener(path, "wt", encoding=encoding, newline="") as f:
        if kind in (".csv", ".tsv"):
            writer = csv.DictWriter(f, fieldnames=list(items[0]), delimiter="\t" if kind == ".tsv" else ",")
            writer.writeheader()
            writer.writerows(items)
        elif kind == ".json" and array:
            json.dump(items, f, indent=2, ensure_ascii=False)
        else:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in items))
    return path


def write_jsonl(path: Path, items: list[dict]) -> Path:
    return write(path, items)


def task_file(folder: Path, body: str) -> Path:
    file = folder / "my_task.py"
    file.write_text("from gqa_jax.data import user_tasks\n\n" + body)
    return file


def refused_by_train(file: Path, vocab: Path, capsys) -> str:
    """The one stderr line ``train`` on task file ``file`` exits 2 with, having written nothing in
    the task file's folder (its data directory: ``data/`` there)."""
    folder = file.parent
    before = sorted(p.name for p in folder.iterdir())
    code = main(["train", "--config", f"{REPO}/configs/finetune.py:task={file}", "--workdir",
                 str(folder / "run"), f"--config.vocab={vocab}",
                 f"--config.data_dir={folder / 'data'}"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(file) in err[0], err
    assert sorted(p.name for p in folder.iterdir() if p.name != "__pycache__") == before
    return err[0]
