"""Run configs: python files with ``get_config(variant)``, overridden by ``--config.a.b=value``.

``load("configs/finetune.py:task=stdlib_docsum,model=tiny", ["--config.batch_size=8"])`` (or
``load("finetune:task=...")``, the shipped configs/finetune.py from any directory) imports the file,
calls ``get_config("task=stdlib_docsum,model=tiny")`` (``get_config()`` without a
variant) and applies the overrides with ``ml_collections.config_flags`` on a fresh absl
``FlagValues``, as ``python -m gqa_jax train`` does: ``--config.a.b=value`` or
``--config.a.b value``, a bool also ``--config.flag`` / ``--noconfig.flag``, a tuple by
repeating the flag or as one literal ``--config.t="('a', 'b')"``. Each value is parsed by the
field's type (a ``placeholder(int)`` field that defaults to None takes only ints), so an unknown
field or a value of the wrong type is a ``ValueError`` of one line that names the field (and
lists the known ones). The returned ``ConfigDict`` is locked: code cannot add fields to it.

The file is imported here rather than through ``config_flags.DEFINE_config_file`` so that an
error in ``get_config`` (such as an unknown variant key) stays its own one-line message.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_collections
from absl import flags
from ml_collections import config_flags
from ml_collections.config_flags import config_path

from gqa_jax import paths, shipped

_OVERRIDE = re.compile(r"^--?(?:no)?config\.([^=]+)")


def load_module(file: str | os.PathLike) -> Any:
    """Import a python file by its path (config files are not a package): configs/x.py loads
    configs/base.py with ``load_module(Path(__file__).with_name("base.py"))``."""
    file = Path(file)
    module_spec = importlib.util.spec_from_file_location(f"gqa_jax_config_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


_SHIPPED_NAME = re.compile(r"\w+")  # a shipped config's name: no folder, no .py


def load_file(spec: str | os.PathLike) -> ml_collections.ConfigDict:
    """``path.py[:variant]`` (a file) or ``name[:variant]`` (a shipped config, ``finetune:task=x``:
    ``gqa_jax.shipped``; its variant may name a task file, ``finetune:task=my_task.py``) -> the
    file's ``get_config(variant)``."""
    spec = str(spec)
    if ".py" in spec and not _SHIPPED_NAME.fullmatch(spec.partition(":")[0]):
        path, _, variant = spec.partition(".py:")
        file = Path(path + ".py" if _ else path).expanduser()
        if not file.is_file():
            raise FileNotFoundError(
                f"config file {file} does not exist (expected configs/<name>.py[:variant], or the name of a "
                f"shipped config: {', '.join(shipped.names('configs'))})"
            )
    else:
        name, _, variant = spec.partition(":")
        file = shipped.resolve(name, "configs", "config")
    module = load_module(file)
    if not hasattr(module, "get_config"):
        raise ValueError(f"config file {file} has no get_config() function")
    try:
        config = module.get_config(variant) if variant else module.get_config()
    except TypeError as e:  # ml_collections: a value of the wrong type for a typed field
        raise ValueError(f"config file {file}: {' '.join(str(e).split())}") from e
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(f"{file}: get_config() must return an ml_collections.ConfigDict")
    return config


def override(config: ml_collections.ConfigDict, argv: Sequence[str]) -> ml_collections.ConfigDict:
    """Apply ``--config.a.b=value`` / ``--config.a.b value`` arguments to ``config`` in place
    (through ``config_flags.DEFINE_config_dict``); returns ``config``, locked."""
    argv = [str(a) for a in argv]
    values = flags.FlagValues()
    full = ["gqa_jax", *argv]
    try:
        # Defining the flag resolves every override's field (an unknown one fails here);
        # parsing then converts each value with its field's type.
        config_flags.DEFINE_config_dict("config", config, flag_values=values, sys_argv=full)
        rest = values(full)
    except (AttributeError, KeyError) as e:
        raise ValueError(_unknown_field(config, argv) or f"bad config override: {e}") from None
    except flags.IllegalFlagValueError as e:
        raise ValueError(_bad_value(config, str(e))) from None
    except flags.UnrecognizedFlagError as e:
        given = e.flagvalue or f"--{e.flagname}"
        raise ValueError(f"unrecognized argument {given}: an override is --config.FIELD=VALUE") from None
    except flags.Error as e:  # config_flags' FlagOrderError, UnsupportedOperationError
        raise ValueError(" ".join(str(e).split())) from None
    if rest[1:]:
        raise ValueError(
            f"unexpected argument(s) {' '.join(rest[1:])}: a config override is --config.FIELD=VALUE or "
            "--config.FIELD VALUE (a bool field: --config.FIELD=False or --noconfig.FIELD)"
        )
    return config


# The fields that hold a local path or a URL: made absolute at load (``paths.absolute``), so a run
# reads the same files from any directory; a task field only when it names a task file.
PATH_FIELDS = ("data_dir", "vocab", "init_from", "uptrain.source")
TASK_FIELDS = ("task", "uptrain.calibration_task")


def load(spec: str | os.PathLike, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """``spec``'s config (``path.py[:variant]``) with ``overrides`` (``--config.a.b=value`` ...),
    its path fields made absolute (:data:`PATH_FIELDS`)."""
    config = override(load_file(spec), overrides)
    with config.unlocked():
        for dotted, value in path_values(config).items():
            *sections, name = dotted.split(".")
            node = config
            for section in sections:
                node = node[section]
            node[name] = value
    return config


def path_values(config: Any) -> dict[str, Any]:
    """The path fields of ``config`` (a ConfigDict or a stored config's dict) made absolute."""
    out = {}
    for dotted in PATH_FIELDS + TASK_FIELDS:
        node = config
        for part in dotted.split("."):
            node = node.get(part) if hasattr(node, "get") else None
        if isinstance(node, str):
            out[dotted] = paths.absolute(node, is_path=dotted in PATH_FIELDS or node.endswith(".py"))
    return out


def field_names(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    """Every leaf field of ``config``, dotted (``batch_size``, ``model.num_kv_heads``, ...)."""
    names = []
    for key in sorted(config.keys()):
        value = config[key]
        if isinstance(value, ml_collections.ConfigDict):
            names += field_names(value, f"{prefix}{key}.")
        else:
            names.append(f"{prefix}{key}")
    return names


def _unknown_field(config: ml_collections.ConfigDict, argv: Sequence[str]) -> str | None:
    """The message for the first override in ``argv`` that names no field of ``config``."""
    for arg in argv:
        match = _OVERRIDE.match(arg)
        if not match:
            continue
        dotted = match.group(1)
        node, walked = config, []
        for name in dotted.split("."):
            where = ".".join(["config", *walked])
            if not isinstance(node, ml_collections.ConfigDict):
                return f"--config.{dotted}: {where} is a field ({type(node).__name__}), not a section"
            if name not in node:
                known = field_names(node)
                close = difflib.get_close_matches(dotted, field_names(config), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                prefix = where.removeprefix("config").lstrip(".")
                listed = ", ".join(f"{prefix}.{k}" if prefix else k for k in known)
                return f"--config.{dotted}: {where} has no field {name!r}{hint}; the known fields: {listed}"
            node, walked = node[name], [*walked, name]
    return None


def _bad_value(config: ml_collections.ConfigDict, message: str) -> str:
    """absl's ``flag --config.x=v: <parser error>`` -> one line naming the field and its type."""
    message = " ".join(message.split())
    match = re.match(r"^flag --config\.([\w.]+)=", message)
    if not match:
        return message
    dotted = match.group(1)
    try:
        kind = config_path.get_type(dotted, config).__name__
    except (AttributeError, KeyError, TypeError):
        return message
    return f"config.{dotted} takes a value of type {kind}: {message.removeprefix('flag ')}"
