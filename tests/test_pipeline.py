"""Input pipelines: fixed shapes, determinism, exact resume, packing, per-process slices, eval passes."""

import grain
import numpy as np
import pytest

from gqa_jax.data import epoch_shuffle
from gqa_jax.data import pipeline as pl
from gqa_jax.data.span_corruption import span_corruption_lengths
from gqa_jax.data.tasks import Task

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()


def make_docs(n, seed=0, max_words=60):
    rng = np.random.default_rng(seed)
    return [
        {
            "src": " ".join(rng.choice(WORDS, rng.integers(1, max_words))),
            "tgt": " ".join(rng.choice(WORDS, 3)),
        }
        for _ in range(n)
    ]


SEQ = Task(name="toy", source="toy", inputs="src", targets="tgt", prefix="summarize: ", input_length=32,
           target_length=16, metric="rouge")  # fmt: skip
SPAN = Task(name="toy_span", source="toy", inputs="src", targets=None, span_corruption=True, input_length=32,
            target_length=span_corruption_lengths(32)[1], metric=None)  # fmt: skip


def take(it, n):
    return [next(it) for _ in range(n)]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def make(vocab, task=SEQ, docs=None, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("process_index", 0)
    kw.setdefault("process_count", 1)
    docs = make_docs(40) if docs is None else docs
    return pl.make_pipeline(task, kw.pop("split", "train"), vocab, source=docs, **kw)


def test_the_epoch_shuffle_keeps_grains_order():
    # the permutation: grain's index_shuffle (its 16-bit block) at sizes of one word up to the block
    for n, seed in ((2, 0), (3, 2**32 - 1), (16, 5), (40, 123456789), (1001, 7), (epoch_shuffle.BLOCK, 1)):
        perm = epoch_shuffle.permutation(n, seed)
        js = range(n) if n < 2000 else range(0, n, 997)
        assert [int(perm[j]) for j in js] == [grain.experimental.index_shuffle(j, n - 1, seed, 4) for j in js]
        assert sorted(perm.tolist()) == list(range(n))
    # the dataset: grain's shuffle element for element, over three epochs, repeated and sliced as the
    # pipeline does; one element; over the block, grain's own transformation
    for n in (1, 13, 40):
        ours = epoch_shuffle.shuffled(grain.MapDataset.range(n), 9).repeat(None)[1::2]
        theirs = grain.MapDataset.range(n).shuffle(seed=9).repeat(None)[1::2]
        assert [ours[i] for i in range(3 * n)] == [theirs[i] for i in range(3 * n)]
    big = epoch_shuffle.shuffled(grain.MapDataset.range(epoch_shuffle.BLOCK + 1), 9)
    assert (
        not isinstance(big, epoch_shuffle.EpochShuffle)
        and big[5] == grain.MapDataset.range(epoch_shuffle.BLOCK + 1).shuffle(seed=9)[5]
    )


@pytest.mark.parametrize("pack", [False, True])
def test_fixed_shapes_and_determinism(small_vocab, pack):
    p = make(small_vocab, pack=pack, seed=3)
    batches = take(p.iterator(), 12)  # 48 rows > 40 docs: crosses an epoch boundary
    for b in batches:
        assert {k: v.shape for k, v in b.items()} == p.shapes()
        assert b["encoder_input_tokens"].dtype == np.int32
    assert_same(batches, take(make(small_vocab, pack=pack, seed=3).iterator(), 12))
    other = take(make(small_vocab, pack=pack, seed=4).iterator(), 12)
    pairs = zip(batches, other, strict=True)
    assert any((x["encoder_input_tokens"] != y["encoder_input_tokens"]).any() for x, y in pairs)


def test_padded_rows_hold_prefix_text_and_eos(small_vocab):
    docs = make_docs(8)
    p = make(small_vocab, docs=docs, split="validation", batch_size=8)
    b = next(p.iterator())
    for row, idx in zip(b["encoder_input_tokens"], b["example_index"], strict=True):
        text = small_vocab.decode(row)
        assert text.startswith("summarize: ") and docs[idx]["src"].startswith(text[len("summarize: ") :])
        n = int((row != 0).sum())
        assert row[n - 1] == small_vocab.eos_id and (row[n:] == 0).all()
    t = b["decoder_target_tokens"]
    np.testing.assert_array_equal(b["decoder_input_tokens"][:, 1:], t[:, :-1])
    assert (b["decoder_input_tokens"][:, 0] == 0).all()
    np.testing.assert_array_equal(b["decoder_loss_weights"], (t != 0).astype(np.float32))
    assert small_vocab.decode(t[0]) == docs[b["example_index"][0]]["tgt"]


@pytest.mark.parametrize("task,pack", [(SEQ, False), (SEQ, True), (SPAN, True), (SPAN, False)])
def test_resume_from_state_and_from_step(small_vocab, task, pack):
    n, m = 5, 6
    full = take(make(small_vocab, task=task, pack=pack).iterator(), n + m)
    it = make(small_vocab, task=task, pack=pack).iterator()
    take(it, n)
    state = it.get_state()
    assert state["step"] == n
    resumed = make(small_vocab, task=task, pack=pack).iterator(state=state)
    assert_same(full[n:], take(resumed, m))
    assert_same(full[n:], take(make(small_vocab, task=task, pack=pack).iterator(start_step=n), m))


def test_packing_segments_and_restarting_decoder_inputs(small_vocab):
    docs = [{"src": " ".join(WORDS[i % 5 : i % 5 + 2]), "tgt": WORDS[i % 7]} for i in range(40)]  # short
    b = next(make(small_vocab, docs=docs, pack=True, batch_size=2, input_length=96).iterator())
    seg, dseg = b["encoder_segment_ids"], b["decoder_segment_ids"]
    assert seg.max() >= 2, "short examples should share rows"
    for r in range(seg.shape[0]):
        assert set(np.unique(seg[r])) - {0} == set(np.unique(dseg[r])) - {0}
        starts = np.flatnonzero(np.diff(np.concatenate([[0], dseg[r]])) != 0)
        for s in starts:
            if dseg[r, s]:
                assert b["decoder_input_tokens"][r, s] == 0 and b["decoder_positions"][r, s] == 0
        # each segment of the targets ends with EOS
        for sid in set(np.unique(dseg[r])) - {0}:
            assert b["decoder_target_tokens"][r][dseg[r] == sid][-1] == small_vocab.eos_id
    np.testing.assert_array_equal(b["decoder_loss_weights"], (dseg > 0).astype(np.float32))


def test_processes_read_disjoint_slices_of_one_stream(small_vocab):
    docs = [{"src": f"doc {i}", "tgt": "x"} for i in range(24)]
    seen = []
    for p in range(2):
        pipe = pl.make_pipeline(SEQ, "validation", small_vocab, batch_size=4, source=docs, process_index=p,
                                process_count=2)  # fmt: skip
        assert pipe.local_batch_size == 2
        for b in pipe.iterator():
            seen += [int(i) for i in b["example_index"] if i >= 0]
    assert sorted(seen) == list(range(24))


def test_eval_pass_reads_each_example_once_and_pads_the_last_batch(small_vocab):
    docs = make_docs(10)
    batches = list(make(small_vocab, docs=docs, split="validation", batch_size=4).iterator())
    assert len(batches) == 3
    idx = np.concatenate([b["example_index"] for b in batches])
    np.testing.assert_array_equal(idx, list(range(10)) + [-1, -1])
    assert (batches[-1]["encoder_input_tokens"][2:] == 0).all()


def test_span_corruption_rows_reconstruct_the_chunks(small_vocab):
    docs = make_docs(6, max_words=200)
    p = make(small_vocab, task=SPAN, docs=docs, split="train", shuffle=False, batch_size=2)
    raw = span_corruption_lengths(32)[0]
    expected = []
    for d in docs:
        ids = small_vocab.encode(d["src"])
        expected += [ids[i : i + raw] for i in range(0, len(ids), raw) if len(ids[i : i + raw]) >= 2]
    top = small_vocab.sp_size + small_vocab.extra_ids
    got = []
    for b in take(p.iterator(), 3):
        for inp, tgt in zip(b["encoder_input_tokens"], b["decoder_target_tokens"], strict=True):
            inp, tgt = inp[inp != 0][:-1], tgt[tgt != 0][:-1]  # drop padding and EOS
            spans = {}
            cur = None
            for t in tgt:
                if t >= top - 100:
                    cur = int(t)
                    spans[cur] = []
                else:
                    spans[cur].append(int(t))
            out = []
            for t in inp:
                out += spans[int(t)] if t >= top - 100 else [int(t)]
            got.append(out)
    assert got == expected[: len(got)]


def test_bad_arguments(small_vocab):
    with pytest.raises(ValueError, match="multiple of process_count"):
        make(small_vocab, batch_size=3, process_count=2)
    with pytest.raises(ValueError, match="pack=True"):
        make(small_vocab, split="validation", pack=True)
    with pytest.raises(ValueError, match="T5's derivation"):
        make(small_vocab, task=SPAN, target_length=20)
    with pytest.raises(ValueError, match="no examples"):
        make(small_vocab, docs=[])
    with pytest.raises(ValueError, match="Vocabulary"):
        make(object())
    with pytest.raises(ValueError, match="not a pipeline state"):
        make(small_vocab).iterator(state={"oops": 1})
