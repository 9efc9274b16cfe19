"""Tests for the SentencePiece vocabulary (tiny models trained in tmp_path, fast)."""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from gqa_jax.data import vocab as vocab_lib
from gqa_jax.data.span_corruption import span_corrupt
from gqa_jax.data.vocab import EOS_ID, NUM_EXTRA_IDS, PAD_ID, UNK_ID, Vocabulary, load_vocab, train_vocab

SIZE = 300
WORDS = "alpha beta gamma delta value index count total name items result data self other".split()
CODE = (
    "class Parser(Base):\n"
    '    """Parse the thing."""\n'
    "\n"
    "    def parse(self, text, *, strict=False):  # trailing spaces   \n"
    "        for i, line in enumerate(text.splitlines()):\n"
    "\t\tif not line:\n"
    "            continue\n"
    "        return {'ok': True, \"n\": 0x1F}\r\n"
)
TEXTS = [
    CODE,
    "",
    " leading space",
    "  two leading, two trailing  ",
    "\n\nnewlines first\n",
    "unicode: été, naïve, 日本語, emoji 🙂, ﬁ ligature, Ω",
    "<extra_id_0> is plain text to encode",
]


def _corpus(num_docs: int = 40, seed: int = 0) -> list[str]:
    """Python-like documents (functions with 4- and 8-space indentation) over a small alphabet."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(num_docs):
        lines = []
        for _ in range(8):
            a, b = rng.choice(WORDS, 2)
            lines.append(f"def {a}_{b}({', '.join(rng.choice(WORDS, rng.integers(1, 4)))}):")
            for _ in range(rng.integers(1, 5)):
                a, b = rng.choice(WORDS, 2)
                lines.append(f"    {a} = {b} + {rng.integers(100)}")
            lines += [f"    if {a}:", f"        return {a}.{b}()", ""]
        docs.append("\n".join(lines))
    return docs


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Vocabulary:
    return train_vocab(_corpus(), size=SIZE, out=tmp_path_factory.mktemp("vocab") / "spm.model")


# --------------------------------------------------------------------------------- ids and sizes
def test_special_ids(vocab: Vocabulary):
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (PAD_ID, EOS_ID, UNK_ID) == (0, 1, 2)
    sp = spm.SentencePieceProcessor(model_file=vocab.path)
    assert [sp.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    assert sp.bos_id() == -1


def test_sizes(vocab: Vocabulary):
    assert vocab.sp_size == SIZE and vocab.extra_ids == NUM_EXTRA_IDS == 100
    assert vocab.unpadded_size == SIZE + 100
    assert vocab.vocab_size % 128 == 0
    assert SIZE + 100 <= vocab.vocab_size < SIZE + 100 + 128
    assert vocab_lib._round_up(32000 + 100, 128) == 32128  # the public T5 vocabulary
    assert Vocabulary(vocab.path, extra_ids=0).vocab_size == 384
    with pytest.raises(ValueError, match="extra_ids must be an int >= 0, got -1"):
        Vocabulary(vocab.path, extra_ids=-1)


def test_sentinels_descend_from_the_top(vocab: Vocabulary):
    ids = [vocab.sentinel_id(i) for i in range(100)]
    assert ids[0] == vocab.sp_size + 99 == vocab.unpadded_size - 1
    assert ids[-1] == vocab.sp_size
    assert ids == list(range(vocab.sp_size + 99, vocab.sp_size - 1, -1))
    for i in (-1, 100):
        with pytest.raises(ValueError, match=f"sentinel index {i} out of range.*extra_ids=100"):
            vocab.sentinel_id(i)


def test_sentinels_match_span_corruption(vocab: Vocabulary):
    tokens = np.asarray(vocab.encode(_corpus(1, seed=5)[0]))
    inputs, targets = span_corrupt(tokens, vocab_size=vocab.unpadded_size, seed=0)
    assert inputs.max() == targets[0] == vocab.sentinel_id(0)
    assert vocab.decode(targets).startswith("<extra_id_0>")
    assert "<extra_id_1>" in vocab.decode(inputs)


def test_repr_and_hash(vocab: Vocabulary):
    text = repr(vocab)
    assert vocab.path in text and f"sp_size={SIZE}" in text and f"vocab_size={vocab.vocab_size}" in text
    assert len(vocab.content_hash()) == 16
    assert load_vocab(vocab.path).content_hash() == vocab.content_hash()


# --------------------------------------------------------------------------------- encode / decode
@pytest.mark.parametrize("text", TEXTS)
def test_roundtrip(vocab: Vocabulary, text: str):
    ids = vocab.encode(text)
    assert all(isinstance(i, int) and 0 <= i < vocab.sp_size for i in ids)
    assert EOS_ID not in ids and PAD_ID not in ids
    assert vocab.decode(ids) == text


def test_roundtrip_training_documents(vocab: Vocabulary):
    docs = _corpus(5, seed=1)
    assert vocab.decode_batch(vocab.encode_batch(docs)) == docs


def test_indentation_is_not_one_piece_per_space(vocab: Vocabulary):
    # allow_whitespace_only_pieces: runs of spaces are pieces ("▁▁▁▁"), not one "▁" per space
    sp = spm.SentencePieceProcessor(model_file=vocab.path)
    assert sp.piece_to_id("▁▁▁▁") != UNK_ID
    assert len(vocab.encode("x\n        y")) <= len(vocab.encode("x\ny")) + 2


def test_decode_stops_at_eos_drops_pad_renders_sentinels(vocab: Vocabulary):
    enc = vocab.encode
    ids = (
        [PAD_ID]
        + enc("def alpha")
        + [vocab.sentinel_id(0)]
        + enc("beta")
        + [vocab.sentinel_id(7), PAD_ID, EOS_ID]
        + enc("never shown")
        + [EOS_ID]
    )
    # After a sentinel, a word keeps its leading space (as if the sentinel were a piece).
    assert vocab.decode(ids) == "def alpha<extra_id_0> beta<extra_id_7>"
    assert vocab.decode(np.asarray(ids, np.int32)) == vocab.decode(ids)
    assert vocab.decode([vocab.sentinel_id(99), EOS_ID]) == "<extra_id_99>"
    assert vocab.decode([EOS_ID] + enc("alpha")) == ""
    assert vocab.decode([]) == "" and vocab.decode([PAD_ID] * 4) == ""


def test_decode_padding_ids_as_unk(vocab: Vocabulary):
    padding_id = vocab.unpadded_size  # first id past the sentinels: pads the vocabulary only
    assert padding_id < vocab.vocab_size
    unk = vocab.decode([UNK_ID])
    assert unk.strip() == "⁇"
    assert vocab.decode([padding_id]) == unk
    assert vocab.decode(vocab.encode("alpha") + [vocab.vocab_size - 1]) == "alpha" + unk


def test_decode_rejects_ids_outside_the_vocab(vocab: Vocabulary):
    for bad_id in (-1, vocab.vocab_size):
        with pytest.raises(ValueError, match=f"id {bad_id} at position 1, outside \\[0, vocab_size"):
            vocab.decode([5, bad_id])
    with pytest.raises(ValueError, match="integer ids"):
        vocab.decode(np.array([1.5]))


def test_batch_equals_per_item(vocab: Vocabulary):
    texts = TEXTS + _corpus(3, seed=2)
    batch = vocab.encode_batch(texts)
    assert batch == [vocab.encode(t) for t in texts]
    assert vocab.encode_batch(texts, num_threads=1) == batch
    assert vocab.encode_batch([]) == [] and vocab.decode_batch([]) == []
    # ragged lists, with sentinels and EOS mixed in
    rows = [ids + [vocab.sentinel_id(i % 3), EOS_ID, 7] + ids[:2] for i, ids in enumerate(batch)]
    assert vocab.decode_batch(rows) == [vocab.decode(r) for r in rows]
    # a padded [B, L] array
    length = max(map(len, rows))
    array = np.full([len(rows), length], PAD_ID, np.int32)
    for i, r in enumerate(rows):
        array[i, : len(r)] = r
    assert vocab.decode_batch(array) == [vocab.decode(r) for r in rows]


def test_batch_input_errors(vocab: Vocabulary):
    with pytest.raises(ValueError, match="got one str"):
        vocab.encode_batch("alpha")
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        vocab.encode_batch(["alpha", 3])
    with pytest.raises(ValueError, match=r"\[B, L\] array, got shape \(3,\)"):
        vocab.decode_batch(np.array([3, 4, 5]))
    with pytest.raises(ValueError, match=r"decode takes 1-D ids, got shape \(1, 2\)"):
        vocab.decode([[3, 4]])
    with pytest.raises(ValueError, match="row 1 must be a 1-D"):
        vocab.decode_batch([[3], [[4]]])


def test_pickle(vocab: Vocabulary):
    copy = pickle.loads(pickle.dumps(vocab))
    assert repr(copy) == repr(vocab) and copy.content_hash() == vocab.content_hash()
    assert copy.encode(CODE) == vocab.encode(CODE)


# ------------------------------------------------------------------------------------- training
def test_deterministic(vocab: Vocabulary, tmp_path):
    again = train_vocab(_corpus(), size=SIZE, out=tmp_path / "again.model")
    assert open(again.path, "rb").read() == open(vocab.path, "rb").read()
    assert again.content_hash() == vocab.content_hash()


def test_sampling_is_seeded(tmp_path):
    def train(name: str, seed: int) -> Vocabulary:
        return train_vocab(_corpus(), size=SIZE, out=tmp_path / name, max_sentences=600, seed=seed)

    a, b, c = train("a.model", 0), train("b.model", 0), train("c.model", 1)
    assert a.content_hash() == b.content_hash() != c.content_hash()
    info = json.loads((tmp_path / "a.model.json").read_text())
    assert info["corpus_lines"] > 600 and info["corpus_lines_used"] == 600 and info["seed"] == 0


def test_deterministic_across_processes(tmp_path):
    # SentencePiece's own sampling differs per process whatever its seed; ours must not.
    corpus = tmp_path / "corpus.py"
    corpus.write_text("\n".join(_corpus()))
    kwargs = dict(corpus_files=[str(corpus)], size=SIZE, max_sentences=600, seed=3)
    here = train_vocab(out=tmp_path / "here.model", **kwargs)
    code = (
        "import sys; from gqa_jax.data.vocab import train_vocab; "
        f"print(train_vocab(out=sys.argv[1], **{kwargs!r}).content_hash())"
    )
    repo = Path(vocab_lib.__file__).resolve().parents[2]
    argv = [sys.executable, "-c", code, str(tmp_path / "there.model")]
    there = subprocess.run(argv, cwd=repo, capture_output=True, text=True, check=True, timeout=120)
    assert there.stdout.strip() == here.content_hash()


def test_files_and_texts_sidecar_and_no_temp_files(tmp_path):
    docs = _corpus(20)
    (tmp_path / "a.py").write_text("\n".join(docs[:10]))
    (tmp_path / "b.py").write_text("\n".join(docs[10:]))
    out = tmp_path / "out" / "spm.model"
    v = train_vocab(
        ["extra document\n", "second"],
        corpus_files=[tmp_path / "a.py", tmp_path / "b.py"],
        size=SIZE,
        out=out,
    )
    assert v.sp_size == SIZE
    assert sorted(p.name for p in out.parent.iterdir()) == ["spm.model", "spm.model.json"]
    info = json.loads((out.parent / "spm.model.json").read_text())
    lines = sum(1 for d in ["extra document\n", "second", *docs] for line in d.splitlines() if line.strip())
    assert info["corpus_lines"] == lines
    assert info["trainer_options"]["vocab_size"] == SIZE and info["trainer_options"]["pad_id"] == 0
    assert info["corpus_files"] == [str(tmp_path / "a.py"), str(tmp_path / "b.py")]
    assert info["model_sha256"].startswith(v.content_hash())


def test_overwrite(vocab: Vocabulary, tmp_path):
    out = tmp_path / "spm.model"
    out.write_bytes(b"keep me")
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        train_vocab(_corpus(), size=SIZE, out=out)
    assert out.read_bytes() == b"keep me"
    assert train_vocab(_corpus(), size=SIZE, out=out, overwrite=True).content_hash() == vocab.content_hash()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.model", "spm.model.json"]


@pytest.mark.parametrize("texts", [[], ["", "  \n\t\n"]])
def test_empty_corpus(tmp_path, texts):
    with pytest.raises(ValueError, match="corpus is empty"):
        train_vocab(texts, size=SIZE, out=tmp_path / "spm.model")
    assert not any(tmp_path.iterdir())


def test_size_errors(tmp_path):
    with pytest.raises(ValueError, match=r"size=5000 is too large .* smaller --size \(<= \d+\)"):
        train_vocab(_corpus(2), size=5000, out=tmp_path / "spm.model")
    with pytest.raises(ValueError, match=r"size=100 is too small .* --size >= \d+"):
        train_vocab(_corpus(2), size=100, out=tmp_path / "spm.model")
    with pytest.raises(ValueError, match="size must be a positive int"):
        train_vocab(_corpus(2), size=0, out=tmp_path / "spm.model")
    assert not any(tmp_path.iterdir())


def test_bad_training_input(tmp_path):
    out = tmp_path / "spm.model"
    with pytest.raises(ValueError, match="needs texts or corpus_files"):
        train_vocab(size=SIZE, out=out)
    with pytest.raises(ValueError, match="got one str"):
        train_vocab("one document", size=SIZE, out=out)
    with pytest.raises(FileNotFoundError, match="corpus file .*missing.txt' does not exist"):
        train_vocab(corpus_files=[tmp_path / "missing.txt"], size=SIZE, out=out)
    (tmp_path / "latin1.txt").write_bytes("def f(): pass\ncaf\xe9 = 1\n".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt' is not UTF-8 text"):
        train_vocab(corpus_files=[tmp_path / "latin1.txt"], size=SIZE, out=out)
    with pytest.raises(TypeError, match="texts item 1 is bytes"):
        train_vocab(["fine", b"bytes"], size=SIZE, out=out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latin1.txt"]


# ------------------------------------------------------------------------------------ loading
def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.model' does not exist.*train-vocab"):
        load_vocab(tmp_path / "nope.model")
    with pytest.raises(ValueError, match="is not a file"):
        load_vocab(tmp_path)


@pytest.mark.parametrize("content", [b"", bytes(np.random.default_rng(0).integers(0, 256, 1000, np.uint8))])
def test_malformed_file(tmp_path, content: bytes):
    path = tmp_path / "junk.model"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="junk.model' .* is not a SentencePiece model"):
        load_vocab(path)


def test_wrong_special_ids(tmp_path):
    prefix = tmp_path / "default"  # SentencePiece's defaults: unk 0, bos 1, eos 2, no pad
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter("\n".join(_corpus(5)).splitlines()),
        model_prefix=str(prefix),
        vocab_size=50,
        minloglevel=2,
    )
    with pytest.raises(ValueError, match=r"pad_id=-1 \(need 0\), eos_id=2 \(need 1\), unk_id=0 \(need 2\)"):
        load_vocab(f"{prefix}.model")


# ---------------------------------------------------------------------------------------- CLI
def test_cli(tmp_path, capsys):
    for i, doc in enumerate(_corpus(20)):
        (tmp_path / f"m{i}.py").write_text(doc)
    parser = argparse.ArgumentParser()
    vocab_lib.add_train_vocab_args(parser)
    out = tmp_path / "v" / "spm.model"
    args = parser.parse_args(["--corpus", str(tmp_path / "*.py"), "--size", str(SIZE), "--out", str(out)])
    assert vocab_lib.run_train_vocab(args) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line
    assert f"{SIZE} pieces, vocab size 512" in line and "20 files" in line and line.endswith(" s")
    # train_vocab's FileExistsError reaches the CLI as a ValueError (one line, exit code 2)
    with pytest.raises(ValueError, match="already exists; pass overwrite=True"):
        vocab_lib.run_train_vocab(args)
    args.overwrite = True
    assert vocab_lib.run_train_vocab(args) == 0
    args.corpus = [str(tmp_path / "*.txt")]
    with pytest.raises(ValueError, match=r"--corpus '.*\*\.txt' matches no files"):
        vocab_lib.run_train_vocab(args)


def test_expand_corpus(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("pkg/b.py", "pkg/a.py", "pkg/sub/c.py", "pkg/notes.txt"):
        (tmp_path / name).write_text("x = 1\n")
    files = vocab_lib.expand_corpus(
        [f"{tmp_path}/pkg/**/*.py", f"{tmp_path}/pkg/a.py", f"{tmp_path}/pkg/notes.txt"]
    )
    assert [p.relative_to(tmp_path).as_posix() for p in files] == [
        "pkg/a.py",
        "pkg/b.py",
        "pkg/sub/c.py",
        "pkg/notes.txt",
    ]
