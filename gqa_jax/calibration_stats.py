"""Calibration statistics: what they are, their checks, content hash and file (numpy, no data).

Letters: ``D`` d_model, ``L`` layers.

``Statistics`` maps an attention kind (``config.ATTENTION_KINDS``) to the float64 second moments
``C = X^T X / n`` of its K/V projection's input ``X`` over ``n`` calibration tokens:
``[L, D, D]``, one per layer, for ``encoder_self`` and ``decoder_self``; ``[1, D, D]`` for
``cross``, whose K/V input is the encoder's output, the same in every decoder layer (stored
once). ``gqa_jax.calibration`` gathers them from data; ``gqa_jax.convert`` consumes them and
stores them beside a converted checkpoint; this module is what both share.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Mapping

import numpy as np

from gqa_jax.config import ModelConfig

Statistics = Mapping[str, np.ndarray]


def expected_shape(config: ModelConfig, kind: str) -> tuple[int, int, int]:
    """``(layers, D, D)`` of ``kind``'s statistics for a model of ``config``."""
    layers = config.num_encoder_layers if kind == "encoder_self" else config.num_decoder_layers
    return (1 if kind == "cross" else layers, config.d_model, config.d_model)


def check_statistics(
    calibration: Statistics, config: ModelConfig, attentions: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """The statistics of ``attentions`` (other kinds are ignored); a ValueError naming a missing
    kind, or one of another shape or dtype, not finite or of zero trace."""
    if not isinstance(calibration, Mapping):
        raise ValueError(f"calibration must map attention kinds to arrays, got {type(calibration).__name__}")
    out = {}
    for kind in attentions:
        if kind not in calibration:
            raise ValueError(
                f"calibration has no statistics for {kind!r} (it has {sorted(calibration)}): gather them "
                f"for attentions={list(attentions)}"
            )
        c, want = np.asarray(calibration[kind]), expected_shape(config, kind)
        if c.shape != want or c.dtype != np.float64:
            raise ValueError(
                f"calibration[{kind!r}] is {c.dtype} {c.shape}; this model needs float64 {want} "
                "(layers, d_model, d_model)"
            )
        if not np.isfinite(c).all() or not (np.trace(c, axis1=1, axis2=2) > 0).all():
            raise ValueError(
                f"calibration[{kind!r}] must be finite second moments with a positive trace "
                "(gathered over at least one token)"
            )
        out[kind] = c
    return out


def statistics_hash(calibration: Statistics) -> str:
    """sha256 over every kind's name, dtype, shape and bytes, in sorted order of the kinds."""
    digest = hashlib.sha256()
    for kind in sorted(calibration):
        a = np.ascontiguousarray(calibration[kind])
        digest.update(f"{kind}\n{a.dtype.name}\n{list(a.shape)}\n".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def statistics_bytes(calibration: Statistics) -> bytes:
    """The statistics as an ``.npz`` file (``np.load`` reads it), byte for byte the same for the
    same statistics (``np.savez`` would store the time of writing)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for kind in sorted(calibration):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(calibration[kind]), allow_pickle=False)
            entry = zipfile.ZipInfo(f"{kind}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            archive.writestr(entry, member.getvalue())
    return buffer.getvalue()


def read_statistics(data: bytes, where: str) -> dict[str, np.ndarray]:
    """The statistics :func:`statistics_bytes` wrote; a ValueError naming ``where`` if unreadable."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as stored:
            return {kind: stored[kind] for kind in stored.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise ValueError(f"{where}: cannot read the calibration statistics ({e})") from e
