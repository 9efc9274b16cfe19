"""The files gqa_jax ships beside its code: ``configs/`` (the train configs), ``experiments/`` (the
sweep files) and ``scripts/`` (the launchers).

In a checkout (an editable install, or the repository on ``PYTHONPATH``) they are the repository's
top-level folders. An installed package (``pip install .``) carries copies as
``gqa_jax/_shipped/<name>/`` (pyproject.toml maps them there), so the commands that use them (the
demo, ``sweep`` / ``report`` with a shipped sweep's name, ``train --config NAME``) work from any
directory. A name is looked up in one place only: the installed copy when there is one, else the
checkout's; a path the user gives is always used as given.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent  # .../gqa_jax
FOLDERS = ("configs", "experiments", "scripts")


def checkout() -> Path | None:
    """The repository this package runs from (the folder holding gqa_jax/ and pyproject.toml), or
    None for an installed package."""
    root = PACKAGE.parent
    if (PACKAGE / "_shipped").is_dir() or not (root / "pyproject.toml").is_file():
        return None
    return root


def folder(name: str) -> Path:
    """``configs``, ``experiments`` or ``scripts``: the installed copy, else the checkout's."""
    if name not in FOLDERS:
        raise ValueError(f"unknown shipped folder {name!r}; known: {', '.join(FOLDERS)}")
    installed = PACKAGE / "_shipped" / name
    if installed.is_dir():
        return installed
    root = checkout()
    if root is None or not (root / name).is_dir():
        raise FileNotFoundError(
            f"gqa_jax's {name}/ is missing: neither {installed} (an installed package) nor a checkout's "
            f"{PACKAGE.parent / name}; reinstall gqa_jax (pip install .) or run from a checkout"
        )
    return root / name


def names(name: str) -> list[str]:
    """The shipped files of ``configs`` or ``experiments``, by name (``mini``, ``finetune``, ...)."""
    return sorted(p.stem for p in folder(name).glob("*.py") if not p.name.startswith("_"))


def resolve(text: str, name: str, what: str) -> Path:
    """A file the user named: a path as given when it has a folder or a ``.py`` suffix (it must
    exist), else a shipped file of folder ``name`` (``mini`` -> experiments/mini.py); a
    FileNotFoundError that lists the shipped ones otherwise. ``what`` names it in errors."""
    given = Path(text).expanduser()
    if given.suffix == ".py" or len(given.parts) > 1:
        if not given.is_file():
            raise FileNotFoundError(
                f"{what} {text} does not exist; give a path to an existing file, or the name of a shipped "
                f"one: {', '.join(names(name))}"
            )
        return given
    file = folder(name) / f"{text}.py"
    if not file.is_file():
        raise FileNotFoundError(
            f"no shipped {what} named {text!r}; the shipped ones: {', '.join(names(name))}"
        )
    return file
