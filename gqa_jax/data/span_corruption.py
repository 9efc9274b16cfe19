"""T5 span corruption (the pre-training objective of Raffel et al., 2020), in numpy.

A document of ``tokens_length`` ids (no EOS) is split into alternating non-noise / noise spans,
starting with non-noise and ending with noise. With ``k`` noise spans and sentinel ``i`` the id
``vocab_size - 1 - i`` (``<extra_id_0>`` is the highest id, as in T5's 32100-id vocabulary):

    inputs  = nonnoise_0 s_0 nonnoise_1 s_1 ... nonnoise_{k-1} s_{k-1} EOS
    targets = s_0 noise_0 s_1 noise_1 ... s_{k-1} noise_{k-1} EOS

i.e. the inputs are the tokens with each noise span replaced by a sentinel, and the targets are
the tokens with each non-noise span replaced by a sentinel (T5's ``noise_span_to_unique_sentinel``
and ``nonnoise_span_to_unique_sentinel``). Since the mask ends with a noise span, the targets
carry no trailing sentinel. Counts are deterministic given the length; only the positions are
random (``np.random.Generator``, so they do not match T5's TensorFlow stateless RNG bit for bit).
"""

from __future__ import annotations

import numpy as np

NUM_SENTINELS = 100  # T5's SentencePiece vocabulary has 100 <extra_id_*> tokens.


def _check_noise_args(noise_density: float, mean_noise_span_length: float) -> None:
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density}")
    if mean_noise_span_length < 1.0:
        raise ValueError(f"mean_noise_span_length must be >= 1, got {mean_noise_span_length}")


def span_corruption_lengths(
    inputs_length: int = 512, noise_density: float = 0.15, mean_noise_span_length: float = 3.0
) -> tuple[int, int]:
    """Raw token length whose corrupted inputs fill ``inputs_length``, and the targets length.

    Follows T5's ``random_spans_helper``: the largest ``tokens_length`` whose inputs (non-noise
    tokens + one sentinel per noise span + EOS) fit in ``inputs_length``. For 512 / 0.15 / 3.0
    this is (568, 114). Returns ``(tokens_length, targets_length)``.
    """
    _check_noise_args(noise_density, mean_noise_span_length)
    if inputs_length < 2:
        raise ValueError(f"inputs_length must be >= 2, got {inputs_length}")

    def lengths(tokens_length: int) -> tuple[int, int]:
        num_noise = round(tokens_length * noise_density)
        num_spans = round(num_noise / mean_noise_span_length)
        return tokens_length - num_noise + num_spans + 1, num_noise + num_spans + 1

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = lengths(tokens_length)
    # T5's tweak: at density 0.5 keep targets no longer than inputs (likely a round number).
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def _noise_counts(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """``(num_noise_tokens, num_noise_spans)`` for a mask of ``length >= 2``, as T5 computes them."""
    num_noise = min(max(round(length * noise_density), 1), length - 1)
    num_spans = max(1, round(num_noise / mean_noise_span_length))
    return num_noise, num_spans


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """Split ``num_items`` into ``num_segments`` positive lengths, uniformly over segmentations."""
    cuts = np.sort(rng.choice(num_items - 1, size=num_segments - 1, replace=False) + 1)
    return np.diff(np.concatenate([[0], cuts, [num_items]]))  # [num_segments]


def random_spans_noise_mask(
    length: int, noise_density: float, mean_noise_span_length: float, rng: np.random.Generator
) -> np.ndarray:
    """Boolean ``[length]`` mask, True on noise: alternating spans, first non-noise, last noise.

    ``num_noise = clip(round(length * noise_density), 1, length - 1)`` and
    ``num_spans = max(1, round(num_noise / mean_noise_span_length))``. As in T5, a length-1
    sequence is treated as length 2 and trimmed, so it comes back all non-noise.
    """
    _check_noise_args(noise_density, mean_noise_span_length)
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    full = max(length, 2)
    num_noise, num_spans = _noise_counts(full, noise_density, mean_noise_span_length)
    num_nonnoise = full - num_noise
    if num_spans > num_nonnoise:
        raise ValueError(
            f"num_noise_spans={num_spans} exceeds num_nonnoise_tokens={num_nonnoise} "
            f"(length={length}, noise_density={noise_density}); lower the density"
        )
    noise_lengths = _random_segmentation(num_noise, num_spans, rng)  # [num_spans]
    nonnoise_lengths = _random_segmentation(num_nonnoise, num_spans, rng)  # [num_spans]
    span_lengths = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)  # [2 * num_spans]
    is_noise_span = np.tile([False, True], num_spans)
    mask = np.repeat(is_noise_span, span_lengths)  # [full]
    return mask[:length]


def _replace_spans_with_sentinels(tokens: np.ndarray, span_mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """Replace each maximal run of True in ``span_mask`` by one sentinel, numbered from 0."""
    prev = np.concatenate([[False], span_mask[:-1]])
    first = span_mask & ~prev
    sentinels = vocab_size - np.cumsum(first)  # span i (cumsum i + 1) -> vocab_size - 1 - i
    out = np.where(first, sentinels, tokens)
    return out[~(span_mask & prev)]


def span_corrupt(
    tokens: np.ndarray,
    *,
    vocab_size: int,
    seed: int,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    eos_id: int = 1,
    num_sentinels: int = NUM_SENTINELS,
) -> tuple[np.ndarray, np.ndarray]:
    """T5 span corruption of one document; deterministic given ``seed``.

    Args:
        tokens: ``[L]`` int ids, no EOS; every id must lie below the sentinel range
            ``[vocab_size - num_sentinels, vocab_size)`` so the result can be decoded unambiguously.
        vocab_size: unpadded vocabulary size including sentinels (32100 for T5); sentinel ``i`` is
            ``vocab_size - 1 - i``.
        seed: seeds ``np.random.default_rng``.
    Returns:
        ``(inputs, targets)``, int32 ``[L - num_noise + num_spans + 1]`` and
        ``[num_noise + num_spans + 1]``, both ending in ``eos_id``.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array, got shape {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be integers, got dtype {tokens.dtype}")
    _check_noise_args(noise_density, mean_noise_span_length)
    if not 0 < num_sentinels < vocab_size:
        raise ValueError(f"need 0 < num_sentinels={num_sentinels} < vocab_size={vocab_size}")
    first_sentinel_free = vocab_size - num_sentinels
    if not 0 <= eos_id < first_sentinel_free:
        raise ValueError(f"eos_id={eos_id} must be in [0, vocab_size - num_sentinels={first_sentinel_free})")
    length = tokens.size
    _, num_spans = _noise_counts(max(length, 2), noise_density, mean_noise_span_length)
    if num_spans > num_sentinels:
        raise ValueError(
            f"length={length} at noise_density={noise_density}, mean_noise_span_length="
            f"{mean_noise_span_length} needs num_noise_spans={num_spans} sentinels, "
            f"but the vocabulary has num_sentinels={num_sentinels}"
        )
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= first_sentinel_free:
        raise ValueError(
            f"token ids must be in [0, vocab_size - num_sentinels={first_sentinel_free}) "
            f"(vocab_size={vocab_size}), got min {low}, max {high}"
        )
    if np.any(tokens == eos_id):
        raise ValueError(
            f"tokens must not contain eos_id={eos_id} (found at {np.flatnonzero(tokens == eos_id)})"
        )

    mask = random_spans_noise_mask(length, noise_density, mean_noise_span_length, np.random.default_rng(seed))
    eos = np.array([eos_id])
    inputs = np.concatenate([_replace_spans_with_sentinels(tokens, mask, vocab_size), eos])
    targets = np.concatenate([_replace_spans_with_sentinels(tokens, ~mask, vocab_size), eos])
    return inputs.astype(np.int32), targets.astype(np.int32)


def _split_on_sentinels(seq: np.ndarray, name: str, vocab_size: int, num_sentinels: int) -> list[np.ndarray]:
    """Pieces of ``seq`` around its sentinels, checking they run ``vocab_size - 1`` downward."""
    is_sentinel = seq >= vocab_size - num_sentinels
    positions = np.flatnonzero(is_sentinel)
    expected = vocab_size - 1 - np.arange(positions.size)
    if not np.array_equal(seq[positions], expected):
        raise ValueError(f"{name} sentinels {seq[positions].tolist()} do not descend from {vocab_size - 1}")
    return np.split(seq, positions)  # pieces[0] precedes sentinel 0; pieces[i + 1] starts with it


def reconstruct(
    inputs: np.ndarray,
    targets: np.ndarray,
    *,
    vocab_size: int,
    eos_id: int = 1,
    num_sentinels: int = NUM_SENTINELS,
) -> np.ndarray:
    """Invert :func:`span_corrupt`: put each target noise span back at its sentinel in the inputs.

    Returns the original ``[L]`` tokens (int32, no EOS).
    """
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    for name, seq in (("inputs", inputs), ("targets", targets)):
        if seq.ndim != 1 or seq.size == 0 or seq[-1] != eos_id:
            raise ValueError(f"{name} must be 1-D and end with eos_id={eos_id}, got shape {seq.shape}")
    input_pieces = _split_on_sentinels(inputs[:-1], "inputs", vocab_size, num_sentinels)
    target_pieces = _split_on_sentinels(targets[:-1], "targets", vocab_size, num_sentinels)
    if target_pieces[0].size:
        raise ValueError(f"targets must start with sentinel {vocab_size - 1}, got {targets[:1].tolist()}")
    num_in, num_tgt = len(input_pieces) - 1, len(target_pieces) - 1
    # A length-1 document has no noise: inputs carry no sentinel, targets one with nothing after it.
    extra = target_pieces[num_in + 1 :]
    if num_tgt < num_in or any(piece.size > 1 for piece in extra):
        raise ValueError(f"inputs have {num_in} sentinels but targets have {num_tgt}")
    out = [input_pieces[0]]
    for i in range(num_in):
        out.append(target_pieces[i + 1][1:])  # noise span i
        out.append(input_pieces[i + 1][1:])  # non-noise span i + 1
    return np.concatenate(out).astype(np.int32)
