"""Our checkpoint format: a directory that alone rebuilds a ``T5`` model.

Layout::

    path/checkpoint.json   {"format": "gqa_jax", "version": 1}, written last
    path/config.json       the ModelConfig (ModelConfig.to_json)
    path/params/           the nnx.Param state as a pure nested dict, saved with orbax
    path/<extra files>     optional files (``save(..., extra_files=...)``), e.g. the
                           ``manifest.json`` and ``calibration.npz`` of a conversion

Parameters go through ``orbax.checkpoint.StandardCheckpointer`` (the checkpointer Flax's NNX
guide uses). ``save`` writes into a temporary sibling directory and renames it into place, so
a half-written checkpoint never sits at ``path``. ``path`` may be local or ``gs://``; on an object
store, where a rename is a copy per object, the files move one by one with ``checkpoint.json``
last, so a checkpoint is complete when its marker is there (and a crash leaves every file either
at ``path`` or in the sibling). ``load`` builds the model abstractly
(``nnx.eval_shape``: no random init is computed) and restores the parameters into it, after
checking every stored shape and dtype against the config.
"""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx
from jax.sharding import Mesh

from gqa_jax import model as model_lib
from gqa_jax import paths, sharding
from gqa_jax.config import ModelConfig
from gqa_jax.model import T5

FORMAT = {"format": "gqa_jax", "version": 1}
MARKER, CONFIG, PARAMS = "checkpoint.json", "config.json", "params"


def save(
    model: T5,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    extra_files: dict[str, str | bytes] | None = None,
) -> epath.Path:
    """Save ``model``'s parameters and config to the directory ``path``; returns its absolute path.

    An existing non-empty ``path`` is refused unless ``overwrite=True``, and even then only an
    existing gqa_jax checkpoint is replaced (never an arbitrary directory), after the new one
    is complete. ``extra_files`` maps plain file names to text (or bytes) written beside the
    parameters; they land in the same atomic rename as the checkpoint itself.
    """
    path = paths.resolve(path, "checkpoint destination")
    extra_files = dict(extra_files or {})
    for name in extra_files:
        if name in (MARKER, CONFIG, PARAMS) or os.path.basename(name) != name or name in ("", ".", ".."):
            raise ValueError(
                f"save: extra_files name {name!r} must be a plain file name other than "
                f"{MARKER}, {CONFIG} and {PARAMS}"
            )
    if path.exists() and not _is_empty_dir(path):
        if not overwrite:
            raise FileExistsError(
                f"checkpoint destination {path} already exists and is not empty; "
                "pass overwrite=True to replace it, or choose another path"
            )
        if not (path / MARKER).is_file():
            raise FileExistsError(
                f"refusing to overwrite {path}: it is not a gqa_jax checkpoint (no {MARKER}); "
                "remove it yourself or choose another path"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_sibling(path, "tmp")
    try:
        (tmp / CONFIG).write_text(model.config.to_json() + "\n")
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        # This process alone (no cross-process barriers): in a multi-host run one process writes it.
        me = jax.process_index()
        alone = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
        with ocp.StandardCheckpointer(multiprocessing_options=alone) as checkpointer:
            checkpointer.save(tmp / PARAMS, params)
            checkpointer.wait_until_finished()
        for name, content in extra_files.items():
            if isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                (tmp / name).write_text(content)
        (tmp / MARKER).write_text(json.dumps(FORMAT) + "\n")  # last: the checkpoint is complete
        _move_into_place(tmp, path)
    finally:
        _remove(tmp)  # only left over if something failed
    return path


def load(
    path: str | os.PathLike, *, mesh: Mesh | None = None, param_dtype: str | None = None
) -> tuple[T5, ModelConfig]:
    """Rebuild ``(model, config)`` from a directory written by :func:`save`; with ``mesh`` each
    parameter is restored straight into its rule-table sharding (orbax reads each device's slice).
    ``param_dtype`` (e.g. ``"bfloat16"`` for decoding) is the dtype orbax restores into (it casts
    as it restores); None keeps the stored dtype."""
    path = paths.resolve(path, "checkpoint")
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}: the path does not exist")
    missing = [name for name in (MARKER, CONFIG, PARAMS) if not (path / name).exists()]
    if missing:
        raise ValueError(
            f"{path} is not a gqa_jax checkpoint: missing {', '.join(missing)}; "
            "expected a directory written by gqa_jax.checkpoints.save"
        )
    marker = _read_json(path / MARKER)
    if marker != FORMAT:
        raise ValueError(f"{path / MARKER}: unsupported checkpoint format {marker}; this code reads {FORMAT}")
    fields = _read_json(path / CONFIG)
    try:
        if not isinstance(fields, dict):
            raise ValueError(f"expected a JSON object of ModelConfig fields, got {type(fields).__name__}")
        config = ModelConfig.from_dict(fields)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path / CONFIG}: invalid model config: {e}") from e

    target = nnx.to_pure_dict(nnx.state(model_lib.abstract(config), nnx.Param))  # ShapeDtypeStructs
    expected = dict(_flatten(target))  # the stored dtype
    if param_dtype:
        config = config.replace(param_dtype=param_dtype)
        target = nnx.to_pure_dict(nnx.state(model_lib.abstract(config), nnx.Param))  # orbax casts on restore
    if mesh is not None:
        shardings = sharding.param_shardings(target, mesh)[0]
        target = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), target, shardings
        )
    damaged = "the checkpoint is damaged (truncated or overwritten): copy it again or re-create it"
    with ocp.StandardCheckpointer() as checkpointer:
        try:
            stored = checkpointer.metadata(path / PARAMS).item_metadata.tree
        except Exception as e:
            raise ValueError(
                f"{path / PARAMS}: cannot read the parameter metadata ({_first_line(e)}); {damaged}"
            ) from e
        _check_matches(expected, dict(_flatten(stored)), path)
        try:
            params = checkpointer.restore(path / PARAMS, target)
        except Exception as e:  # TensorStore: a short or garbled file
            raise ValueError(
                f"{path / PARAMS}: cannot read the parameters ({_first_line(e)}); {damaged}"
            ) from e
    return model_lib.build(config, params), config


def _check_matches(expected: dict[str, Any], stored: dict[str, Any], path: epath.Path) -> None:
    """Raise a ValueError listing every parameter whose presence, shape or dtype differ."""
    problems = [f"{k}: missing from checkpoint" for k in sorted(expected.keys() - stored.keys())]
    problems += [f"{k}: in checkpoint but not in the model" for k in sorted(stored.keys() - expected.keys())]
    for k in sorted(expected.keys() & stored.keys()):
        want, got = expected[k], stored[k]
        if tuple(want.shape) != tuple(got.shape) or want.dtype != got.dtype:
            problems.append(
                f"{k}: config expects {tuple(want.shape)} {want.dtype}, "
                f"checkpoint has {tuple(got.shape)} {got.dtype}"
            )
    if problems:
        raise ValueError(
            f"{path}: parameters do not match {path / CONFIG} (was the config edited?):\n  "
            + "\n  ".join(problems)
        )


def _flatten(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """``{"a": {0: x}}`` -> ``[("a.0", x)]`` (orbax stores integer keys as strings)."""
    items = []
    for key, value in tree.items():
        name = f"{prefix}{key}"
        items += _flatten(value, f"{name}.") if isinstance(value, dict) else [(name, value)]
    return items


def clean_leftovers(path: str | os.PathLike) -> list[str]:
    """Tidy what a killed :func:`save` to ``path`` left beside it; returns one line per action.

    ``<name>.tmp-*`` (a checkpoint being written) is removed. ``<name>.old-*`` holds the previous
    checkpoint while the new one is renamed into place: it is removed when ``path`` is complete,
    and moved back to ``path`` when the kill came between the two renames (``path`` missing)."""
    path = paths.resolve(path, "checkpoint destination")
    if not path.parent.is_dir():
        return []
    done = []
    for old in sorted(path.parent.glob(f"{path.name}.old-*")):
        kept = old / path.name
        if not (path / MARKER).is_file() and (kept / MARKER).is_file() and not path.exists():
            paths.move(kept, path)
            done.append(f"moved the previous checkpoint back from {old} to {path} (a save was killed)")
        _remove(old)
        done.append(f"removed {old}, left by a killed save")
    for tmp in sorted(path.parent.glob(f"{path.name}.tmp-*")):
        if tmp.is_dir():
            _remove(tmp)
        else:
            tmp.unlink()
        done.append(f"removed {tmp}, left by a killed save")
    return done


def _move_into_place(new: epath.Path, path: epath.Path) -> None:
    """Rename the complete checkpoint ``new`` to ``path``; an old ``path`` is deleted only after."""
    if paths.is_remote(path):
        _move_files(new, path)
        return
    if not path.exists():
        os.replace(new, path)
        return
    old = _fresh_sibling(path, "old")
    os.replace(path, old / path.name)
    try:
        os.replace(new, path)
    except BaseException:
        os.replace(old / path.name, path)  # put the old checkpoint back
        raise
    finally:
        _remove(old)


def _move_files(new: epath.Path, path: epath.Path) -> None:
    """On an object store, where a directory's rename moves its objects one by one in no set
    order: retire the old checkpoint at ``path`` (its marker first, so it stops being one), move
    ``new`` there without its marker, then the marker. A crash leaves each file in one place."""
    if path.exists():
        (path / MARKER).unlink(missing_ok=True)
        path.rmtree()
    marker = new.with_name(f"{new.name}.{MARKER}")
    paths.move(new / MARKER, marker)
    paths.move(new, path)
    paths.move(marker, path / MARKER)


def _remove(path: epath.Path) -> None:
    if path.exists():
        path.rmtree()


def _fresh_sibling(path: epath.Path, tag: str) -> epath.Path:
    """Create an empty directory ``path.<tag>-<random>`` beside ``path`` (mode from the umask,
    unlike tempfile.mkdtemp's 0700)."""
    sibling = path.with_name(f"{path.name}.{tag}-{secrets.token_hex(4)}")
    sibling.mkdir()
    return sibling


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def _read_json(file: epath.Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: cannot read JSON: {e}") from e


def _is_empty_dir(path: epath.Path) -> bool:
    return path.is_dir() and not any(path.iterdir())
