"""Tests for T5 span corruption (numpy only, fast)."""

from __future__ import annotations

import numpy as np
import pytest

from gqa_jax.data.span_corruption import (
    random_spans_noise_mask,
    reconstruct,
    span_corrupt,
    span_corruption_lengths,
)

V = 32100  # T5 SentencePiece (32000) + 100 sentinels, unpadded.
LENGTHS = [1, 2, 3, 10, 37, 100, 568]


def _doc(length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(1000 + seed).integers(2, V - 100, size=length)


def _num_spans(mask: np.ndarray) -> int:
    return int(np.sum(mask & ~np.concatenate([[False], mask[:-1]])))


def test_lengths_match_t5():
    assert span_corruption_lengths(512, 0.15, 3.0) == (568, 114)
    assert span_corruption_lengths() == (568, 114)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("seed", range(5))
def test_roundtrip(length: int, seed: int):
    x = _doc(length, seed)
    inputs, targets = span_corrupt(x, vocab_size=V, seed=seed)
    np.testing.assert_array_equal(reconstruct(inputs, targets, vocab_size=V), x)
    assert inputs[-1] == 1 and targets[-1] == 1


@pytest.mark.parametrize("length", [2, 3, 10, 37, 100, 568, 1000])
@pytest.mark.parametrize("seed", range(5))
def test_mask_counts_and_shape(length: int, seed: int):
    mask = random_spans_noise_mask(length, 0.15, 3.0, np.random.default_rng(seed))
    num_noise = min(max(round(length * 0.15), 1), length - 1)
    assert mask.shape == (length,) and mask.dtype == bool
    assert mask.sum() == num_noise
    if 1 <= round(length * 0.15) <= length - 1:  # unclipped: within rounding of the density
        assert mask.sum() == round(length * 0.15)
        assert abs(mask.mean() - 0.15) <= 0.5 / length + 1e-12
    assert _num_spans(mask) == max(1, round(num_noise / 3.0))
    assert not mask[0] and mask[-1]  # starts with non-noise, ends with noise


def test_length_one_mask_is_all_nonnoise():
    assert not random_spans_noise_mask(1, 0.15, 3.0, np.random.default_rng(0)).any()


@pytest.mark.parametrize("seed", range(10))
def test_t5_default_shapes(seed: int):
    tokens_length, targets_length = span_corruption_lengths()
    inputs, targets = span_corrupt(_doc(tokens_length, seed), vocab_size=V, seed=seed)
    assert inputs.shape == (512,) and targets.shape == (targets_length,) == (114,)


def test_sentinels_descend_and_format():
    x = _doc(100, 0)
    inputs, targets = span_corrupt(x, vocab_size=V, seed=3)
    in_sent = inputs[inputs >= V - 100]
    tgt_sent = targets[targets >= V - 100]
    k = max(1, round(round(100 * 0.15) / 3.0))
    np.testing.assert_array_equal(in_sent, V - 1 - np.arange(k))
    np.testing.assert_array_equal(tgt_sent, V - 1 - np.arange(k))
    assert targets[0] == V - 1  # targets open with <extra_id_0>, no trailing sentinel before EOS
    assert targets[-2] < V - 100
    assert inputs.size == 100 - 15 + k + 1 and targets.size == 15 + k + 1


def test_deterministic_per_seed():
    x = _doc(200, 0)
    a = span_corrupt(x, vocab_size=V, seed=7)
    b = span_corrupt(x, vocab_size=V, seed=7)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    others = [span_corrupt(x, vocab_size=V, seed=s)[0] for s in range(8, 13)]
    assert any(not np.array_equal(a[0], o) for o in others)


def test_positions_vary():
    # Over many seeds every position except the first should sometimes be noise.
    hits = sum(random_spans_noise_mask(50, 0.15, 3.0, np.random.default_rng(s)) for s in range(400))
    assert hits[0] == 0 and np.all(hits[1:] > 0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(tokens=np.array([], dtype=np.int64)), "non-empty"),
        (dict(tokens=np.array([[5, 6]])), "1-D"),
        (dict(tokens=np.array([5.0, 6.0])), "integers"),
        (dict(noise_density=0.0), "noise_density"),
        (dict(noise_density=1.0), "noise_density"),
        (dict(mean_noise_span_length=0.5), "mean_noise_span_length"),
        (dict(tokens=np.array([5, V - 100])), "token ids"),
        (dict(tokens=np.array([5, -1])), "token ids"),
        (dict(tokens=np.array([5, 1, 6])), "eos_id"),
        (dict(tokens=np.full(3000, 5)), "num_noise_spans=150.*num_sentinels=100"),
        (dict(eos_id=V - 1), "eos_id"),
    ],
)
def test_span_corrupt_errors(kwargs: dict, match: str):
    args = dict(tokens=np.arange(2, 40), vocab_size=V, seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        span_corrupt(args.pop("tokens"), **args)


def test_mask_too_dense_raises():
    with pytest.raises(ValueError, match="num_noise_spans"):
        random_spans_noise_mask(10, 0.9, 3.0, np.random.default_rng(0))


def test_reconstruct_errors():
    inputs, targets = span_corrupt(_doc(50, 0), vocab_size=V, seed=0)
    with pytest.raises(ValueError, match="eos_id"):
        reconstruct(inputs[:-1], targets, vocab_size=V)
    with pytest.raises(ValueError, match="descend"):
        reconstruct(inputs, np.concatenate([[V - 2], targets[1:]]), vocab_size=V)
    with pytest.raises(ValueError, match="sentinels"):
        reconstruct(inputs, targets[targets != V - 2], vocab_size=V)
