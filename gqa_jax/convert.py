"""MHA -> GQA / MQA checkpoint conversion (the paper's uptraining starting point) + provenance.

Letters: ``D`` d_model, ``N`` query heads, ``K`` source K/V heads, ``K'`` target K/V heads,
``G' = K // K'`` source K/V heads merged into one target head, ``H`` head dim.

For each converted ("grouped") attention, target K/V head ``j`` is built from the source K/V
heads ``j * G', ..., j * G' + G' - 1`` (contiguous, as in the paper; for an MHA source these
are also the query heads ``n`` with ``n // (N // K') == j``) by a method of the registry
``gqa_jax.conversion`` (``mean``, the paper's; ``first``, ``random``; and beyond the paper, methods
that choose the groups, rotate or fit the heads and rewrite the query and output projections to
match; some can be calibrated on the second moments of each layer's K/V input, which
``gqa_jax.calibration`` gathers from data). A method converts one attention kind at a time, all
its layers; everything it does not rewrite is copied unchanged (the very same arrays), each
method computing in its own dtype (float32 for the paper's three, float64 for the others) and its
results cast back to the stored dtype. Because the group of a source head is contiguous,
conversions chain: MHA -> GQA-4 -> MQA by ``mean`` is MHA -> MQA up to rounding.

Which attentions are grouped in the target config (``ModelConfig`` has ONE ``num_kv_heads``
for all grouped attentions) -- the rule :func:`target_config` implements:

- every converted attention becomes grouped with ``K'`` heads;
- an attention not converted keeps its source K/V heads: it stays grouped if the source
  grouped it with ``K'`` heads already, and it becomes (stays) ungrouped if it has ``N``
  heads (MHA); any other count cannot be expressed next to ``K'`` and is a ``ValueError``
  that tells you to convert that attention too.

Files: :func:`convert_checkpoint` reads any checkpoint ``checkpoints.load_any`` knows,
converts it and writes our checkpoint plus ``manifest.json`` (source path and content hash,
configs, method, seed, group map, package version, git commit, time) in one atomic rename;
:func:`check_conversion` re-derives a destination from its manifest and compares bit for bit.
A calibrated conversion also writes its statistics as ``calibration.npz`` beside the manifest
(which records how they were gathered and the file's sha256), so ``check_conversion`` re-derives
it from the stored statistics, without the data.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx
from flax.nnx import traversals
from jax.sharding import NamedSharding

from gqa_jax import __version__, calibration_stats, checkpoints, conversion, paths, sharding
from gqa_jax.calibration_stats import Statistics
from gqa_jax.config import ATTENTION_KINDS, ModelConfig
from gqa_jax.log import log
from gqa_jax.model import T5, FlatParams, Path_, build, check_params, dotted, flat_params

DEFAULT_ATTENTIONS = ("decoder_self", "cross")  # the paper's (section 3.1)
MANIFEST = "manifest.json"
MANIFEST_FORMAT = {"format": "gqa_jax.convert", "version": 1}
CALIBRATION_FILE = "calibration.npz"  # a calibrated conversion's statistics, beside the manifest


# Where each attention kind lives in the parameter tree: (stack, module under stack.layers[i]).
_LOCATIONS = {"encoder_self": ("encoder", "attn"), "decoder_self": ("decoder", "self_attn")}
_LOCATIONS["cross"] = ("decoder", "cross_attn")


# ------------------------------------------------------------------------------- the library
def to_grouped(
    model_or_params: T5 | nnx.State | dict,
    config: ModelConfig,
    num_kv_heads: int,
    method: str,
    *,
    attentions: tuple[str, ...] | list[str] = DEFAULT_ATTENTIONS,
    seed: int = 0,
    calibration: Statistics | None = None,
) -> tuple[dict, ModelConfig, dict[str, Any]]:
    """Convert the K/V projections of ``attentions`` to ``num_kv_heads`` heads.

    Args:
      model_or_params: a ``T5``, its ``nnx.state(model, nnx.Param)``, or that state as a pure
        nested dict (``nnx.to_pure_dict``); its shapes must match ``config``.
      config: the source config.
      num_kv_heads: ``K'``; it must divide the source K/V heads of every converted attention.
      method: a name in ``gqa_jax.conversion.names()``.
      attentions: attention kinds to convert (default: decoder self- and cross-attention).
      seed: the PRNG seed of a method that draws (``random``).
      calibration: for a method that ``calibrates`` only: second moments of every converted attention's
        K/V input (``Statistics``; ``gqa_jax.calibration.gather``); None: by weights alone.
    Returns:
      ``(params, config, manifest)``: the new parameters as a pure nested dict (load them with
      :func:`gqa_jax.model.build`), the new ``ModelConfig``, and a JSON-able record of the conversion
      (method, seed, configs, group map, content hashes of the source, the calibration statistics
      and the result).
    """
    conversion.get(method)  # a ValueError naming the known methods
    if calibration is not None:
        conversion.check_calibrates(method)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        # jax.random.key folds other integers onto these (key(-1) == key(2**32 - 1)).
        raise ValueError(f"to_grouped: seed={seed!r} must be an integer in [0, 2**32)")
    attentions = normalize_attentions(attentions)
    new_config = target_config(config, num_kv_heads, attentions)
    source = flat_params(model_or_params)
    check_params(source, config, "source")
    moments, calibrated = None, None  # the statistics as checked, and their record
    if calibration is not None:
        moments = calibration_stats.check_statistics(calibration, config, attentions)
        calibrated = {"statistics_sha256": calibration_stats.statistics_hash(calibration)}

    params, orders = _convert_stacks(source, config, num_kv_heads, conversion.get(method), attentions,
                                     moments, seed)  # fmt: skip
    params |= {path: jnp.asarray(value) for path, value in source.items() if path not in params}  # unchanged

    manifest = {
        "method": method,
        "seed": seed if conversion.get(method).seeded else None,
        "num_kv_heads": num_kv_heads,
        "attentions": list(attentions),
        "source_config": config.to_dict(),
        "target_config": new_config.to_dict(),
        "groups": group_map(config, num_kv_heads, attentions, orders),
        "source_params_sha256": _hash(source),
        "calibration": calibrated,
        "target_params_sha256": _hash(params),
    }
    return traversals.unflatten_mapping(params), new_config, manifest


def target_config(config: ModelConfig, num_kv_heads: int, attentions: tuple[str, ...]) -> ModelConfig:
    """The config after converting ``attentions`` to ``num_kv_heads`` (the rule in the module doc)."""
    N, K2 = config.num_heads, num_kv_heads
    if not isinstance(K2, int) or isinstance(K2, bool) or K2 < 1:
        raise ValueError(f"num_kv_heads={K2!r} must be an integer >= 1 (1 is MQA)")
    attentions = normalize_attentions(attentions)
    for kind in attentions:
        K = config.kv_heads(kind)
        if K2 > K:
            raise ValueError(
                f"num_kv_heads={K2} is larger than the {K} K/V heads of {kind!r} in the source; "
                "conversion only merges heads (choose from "
                f"{[d for d in range(1, K + 1) if K % d == 0]})"
            )
        if K % K2:
            raise ValueError(
                f"num_kv_heads={K2} does not divide the {K} K/V heads of {kind!r} in the source; "
                f"choose from {[d for d in range(1, K + 1) if K % d == 0]}"
            )
    grouped = []
    for kind in ATTENTION_KINDS:
        K = config.kv_heads(kind)
        if kind in attentions or (kind in config.grouped_attentions and K == K2):
            grouped.append(kind)  # K' heads
        elif K != N:
            raise ValueError(
                f"{kind!r} is grouped in the source with num_kv_heads={K} and is not converted, but "
                f"a ModelConfig has one num_kv_heads for all grouped attentions (target {K2}); "
                f"convert it too: attentions={[*attentions, kind]}"
            )
    return config.replace(num_kv_heads=K2, grouped_attentions=tuple(grouped))


def group_map(
    config: ModelConfig,
    num_kv_heads: int,
    attentions: tuple[str, ...],
    orders: dict[str, list[list[int]]] | None = None,
) -> dict[str, Any]:
    """Which source K/V heads went into which target head, per converted attention.

    ``{"cross": {"source_kv_heads": 4, "target_kv_heads": 2, "groups": [[0, 1], [2, 3]]}}``:
    target head ``j`` comes from ``groups[j]`` (the same in every layer). With ``orders`` (the
    ``grouped`` method's head order per layer), ``groups`` is per layer, ``[[[0, 2], [1, 3]], ...]``,
    and ``order`` holds the permutation of the K/V heads (with their query heads and output rows).
    """
    out = {}
    for kind in normalize_attentions(attentions):
        K = config.kv_heads(kind)
        G2 = K // num_kv_heads
        groups = [list(range(j * G2, (j + 1) * G2)) for j in range(num_kv_heads)]
        out[kind] = {"source_kv_heads": K, "target_kv_heads": num_kv_heads, "groups": groups}
        if orders is not None:
            out[kind]["order"] = orders[kind]
            out[kind]["groups"] = [[[order[m] for m in g] for g in groups] for order in orders[kind]]
    return out


def _convert_stacks(
    source: FlatParams,
    config: ModelConfig,
    num_kv_heads: int,
    method: conversion.Method,
    attentions: tuple[str, ...],
    moments: dict[str, np.ndarray] | None,
    seed: int,
) -> tuple[FlatParams, dict[str, list[list[int]]] | None]:
    """``method`` applied to every converted attention, one stack (all the layers of a kind) at a
    time: the parameters it rewrote (cast back to their stored dtype and placed like the source's),
    and the head orders per attention and layer of a method that reorders heads (else None). A
    permuted self-attention stack's relative position bias gets its columns in the new query order.
    ``moments``: the checked calibration statistics, or None."""
    out: FlatParams = {}
    orders: dict[str, list[list[int]]] = {}
    for kind in attentions:
        stack, module = _LOCATIONS[kind]
        count = config.num_encoder_layers if stack == "encoder" else config.num_decoder_layers
        paths = [{n: (stack, "layers", i, module, n) for n in method.reads} for i in range(count)]
        if moments is None:
            c = (None,) * count  # by weights alone
        elif kind == "cross":
            c = (moments[kind][0],) * count  # one encoder output is every layer's K/V input
        else:
            c = tuple(moments[kind])  # [D, D] per layer
        merged = method.merge(conversion.Stack(
            kind=kind,
            layers=tuple({n: np.asarray(source[p], method.dtype) for n, p in row.items()} for row in paths),
            num_kv_heads=num_kv_heads,
            second_moments=c,
            path_key=lambda i, name, at=(stack, module): _path_key(seed, (at[0], "layers", i, at[1], name)),
        ))  # fmt: skip
        for i, row in enumerate(merged.layers):
            for name, new in row.items():
                path = (stack, "layers", i, module, name)
                out[path] = _place_like(source[path], path, new.astype(np.asarray(source[path]).dtype))
        if merged.query_order is not None:  # the stack's bias columns follow its query heads
            bias = (stack, "relpos", "embedding")
            out[bias] = _place_like(source[bias], bias, np.asarray(source[bias])[:, merged.query_order])
        if merged.head_orders is not None:
            orders[kind] = merged.head_orders
    return out, (orders or None)


# ------------------------------------------------------------------------ calibration statistics
def stored_calibration(
    statistics: Statistics, calibrated: dict[str, Any], gathered: dict[str, Any]
) -> tuple[dict[str, Any], bytes]:
    """``(entry, data)``: the bytes of ``CALIBRATION_FILE`` holding ``statistics``, and the manifest's
    ``calibration`` entry: how they were gathered (``gathered``, from ``gqa_jax.calibration.gather``),
    their sha256 (``calibrated``, ``to_grouped``'s record), the file's name and sha256."""
    data = calibration_stats.statistics_bytes(statistics)
    file_hash = hashlib.sha256(data).hexdigest()
    return {**gathered, **calibrated, "file": CALIBRATION_FILE, "file_sha256": file_hash}, data


def content_hash(model_or_params: T5 | nnx.State | dict) -> str:
    """sha256 over every parameter's dotted path, dtype, shape and bytes, in sorted path order.

    Independent of where the parameters came from (file format, device): two models hash
    equal exactly when their parameters are bit-identical.
    """
    return _hash(flat_params(model_or_params))


def _hash(flat: FlatParams) -> str:
    digest = hashlib.sha256()
    for name, value in sorted(((dotted(p), v) for p, v in flat.items()), key=lambda item: item[0]):
        a = np.ascontiguousarray(np.asarray(value))
        digest.update(f"{name}\n{a.dtype.name}\n{list(a.shape)}\n".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------ files
def convert_checkpoint(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    num_kv_heads: int,
    method: str,
    *,
    attentions: tuple[str, ...] | list[str] = DEFAULT_ATTENTIONS,
    seed: int = 0,
    overwrite: bool = False,
    calibrate: Callable[[T5], tuple[Statistics, dict[str, Any]]] | None = None,
) -> tuple[epath.Path, dict[str, Any]]:
    """Convert the checkpoint ``src`` and save it with ``manifest.json`` at ``dst``.

    Never writes into ``src``; an existing ``dst`` is refused unless ``overwrite`` (and even
    then only a gqa_jax checkpoint is replaced). The destination appears complete or not at all;
    what a killed conversion to ``dst`` left beside it is tidied first (and said). ``calibrate``
    (``grouped`` and ``svd``) takes the loaded source model and returns ``(statistics, record)``
    (``gqa_jax.calibration.gather``); the statistics go to ``calibration.npz`` and the manifest's
    ``calibration`` holds the record and the file's sha256. Returns ``(dst, manifest)``.
    """
    if calibrate is not None:
        conversion.check_calibrates(method)  # before anything is loaded or gathered
    src_path, dst_path = paths.resolve(src, "source"), paths.resolve(dst, "destination")
    src_path, dst_path = (p if paths.is_remote(p) else p.resolve() for p in (src_path, dst_path))
    if src_path == dst_path or src_path in dst_path.parents or dst_path in src_path.parents:
        raise ValueError(
            f"destination {dst_path} and source {src_path} overlap; the source is never written "
            "into: choose a destination outside it"
        )
    for line in checkpoints.clean_leftovers(dst_path):  # a killed convert's, before dst is judged
        log(line)
    if dst_path.exists() and not overwrite and not (dst_path.is_dir() and not any(dst_path.iterdir())):
        raise FileExistsError(f"destination {dst_path} already exists; pass --overwrite to replace it")
    model, config, kind = checkpoints.load_any(src_path)
    statistics, extra_files = None, {}
    if calibrate is not None:
        statistics, gathered = calibrate(model)
    params, new_config, record = to_grouped(
        model, config, num_kv_heads, method, attentions=attentions, seed=seed, calibration=statistics
    )
    if statistics is not None:
        record["calibration"], data = stored_calibration(statistics, record["calibration"], gathered)
        extra_files[CALIBRATION_FILE] = data
    manifest = {
        **MANIFEST_FORMAT,
        "source": {"path": str(src_path), "kind": kind},
        **record,
        "gqa_jax_version": _version(),
        **_git_state(),
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    extra_files[MANIFEST] = json.dumps(manifest, indent=2) + "\n"
    path = checkpoints.save(build(new_config, params), dst_path, overwrite=overwrite, extra_files=extra_files)
    return path, manifest


def check_conversion(dst: str | os.PathLike) -> list[str]:
    """Re-derive ``dst`` from its manifest's source and compare; returns the problems (none = OK).

    Checks that the source still hashes as recorded, that a calibrated conversion's stored
    statistics (``calibration.npz``) are there and hash as recorded, that re-running the recorded
    conversion (from those statistics) gives the destination's config, group map and parameters
    bit for bit, and that the destination's parameters hash as recorded.
    """
    dst_path = paths.resolve(dst, "converted checkpoint")
    if not (dst_path / MANIFEST).is_file():
        raise ValueError(f"{dst_path} has no {MANIFEST}: it is not a checkpoint written by convert")
    try:
        manifest = json.loads((dst_path / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{dst_path / MANIFEST}: cannot read JSON: {e}") from e
    if {k: manifest.get(k) for k in MANIFEST_FORMAT} != MANIFEST_FORMAT:
        raise ValueError(f"{dst_path / MANIFEST}: unsupported manifest; this code reads {MANIFEST_FORMAT}")
    model, config = checkpoints.load(dst_path)
    source_model, source_config, kind = checkpoints.load_any(manifest["source"]["path"])
    problems = []
    if kind != manifest["source"]["kind"]:
        problems.append(f"source kind is now {kind!r}, manifest says {manifest['source']['kind']!r}")
    if content_hash(source_model) != manifest["source_params_sha256"]:
        return [*problems, f"source {manifest['source']['path']} changed since the conversion (content hash)"]
    statistics = None
    if manifest.get("calibration") is not None:
        file = dst_path / manifest["calibration"]["file"]
        if not file.is_file():
            return [*problems, f"{file} is missing: the conversion was calibrated with the statistics "
                    "stored there, and without them it cannot be re-derived"]  # fmt: skip
        data = file.read_bytes()
        if hashlib.sha256(data).hexdigest() != manifest["calibration"]["file_sha256"]:
            return [*problems, f"{file} differs from the one the conversion wrote (sha256 is not the "
                    "manifest's calibration.file_sha256): it was changed or replaced"]  # fmt: skip
        statistics = calibration_stats.read_statistics(data, str(file))
    seed = manifest["seed"] if manifest["seed"] is not None else 0
    params, new_config, record = to_grouped(
        source_model,
        source_config,
        manifest["num_kv_heads"],
        manifest["method"],
        attentions=tuple(manifest["attentions"]),
        seed=seed,
        calibration=statistics,
    )
    if statistics is not None:
        recorded = manifest["calibration"].get("statistics_sha256")
        if record["calibration"]["statistics_sha256"] != recorded:
            problems.append("manifest calibration.statistics_sha256 differs from the stored statistics")
    for key in ("source_config", "target_config", "groups", "target_params_sha256"):
        if record[key] != manifest[key]:
            problems.append(f"manifest {key} differs from the re-derived conversion")
    if new_config != config:
        problems.append(f"config.json differs from the re-derived config: {new_config.to_dict()}")
    want, got = flat_params(params), flat_params(model)
    for path in sorted(want.keys() | got.keys(), key=dotted):
        if path not in want or path not in got:
            problems.append(f"{dotted(path)}: present in only one of destination / re-derived")
            continue
        a, b = np.asarray(want[path]), np.asarray(got[path])
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            problems.append(f"{dotted(path)}: differs from the re-derived conversion")
    return problems


# ---------------------------------------------------------------------------------- helpers
def _place_like(source: Any, path: Path_, new: np.ndarray) -> jax.Array:
    """``new`` where a parameter at ``path`` belongs: sharded by the rule table when ``source``
    (the parameter it replaces) lives on a mesh of several devices, so that no device receives
    the whole of a sharded parameter; else on the default device."""
    placed = getattr(source, "sharding", None)
    if isinstance(placed, NamedSharding) and placed.mesh.devices.size > 1:
        spec = sharding.spec(sharding.logical_axes(path, new.ndim), new.shape, placed.mesh)
        return jax.device_put(new, NamedSharding(placed.mesh, spec))
    return jnp.asarray(new)


def normalize_attentions(attentions: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Attention kinds in ``ATTENTION_KINDS``'s order without repeats; a ValueError for an unknown
    name or none at all."""
    if isinstance(attentions, str):
        attentions = (attentions,)
    unknown = [a for a in attentions if a not in ATTENTION_KINDS]
    if unknown:
        raise ValueError(f"unknown attention name(s) {unknown}; known: {list(ATTENTION_KINDS)}")
    if not attentions:
        raise ValueError(f"attentions is empty: name at least one of {list(ATTENTION_KINDS)}")
    return tuple(k for k in ATTENTION_KINDS if k in attentions)  # canonical order, no repeats


def _path_key(seed: int, path: Path_) -> jax.Array:
    """A PRNG key from the seed and the parameter's path (stable across runs and machines)."""
    tag = int.from_bytes(hashlib.sha256(dotted(path).encode()).digest()[:4], "little") & 0x7FFFFFFF
    return jax.random.fold_in(jax.random.key(seed), tag)


def _version() -> str:
    return __version__


def _git_state() -> dict[str, Any]:
    """``{"git_commit": HEAD, "git_dirty": tracked files modified}`` of the checkout holding this
    package; both None when it is not a git checkout (e.g. an installed wheel)."""
    here = Path(__file__).parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        return {
            "git_commit": git("rev-parse", "HEAD"),
            "git_dirty": bool(git("status", "--porcelain", "-uno")),
        }
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}
