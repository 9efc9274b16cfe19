"""The installable package: pyproject.toml's package list and dependencies against the tree, and an
installed wheel (not a checkout) that runs the shipped sweeps and configs from another directory."""

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib

from gqa_jax import shipped

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Imported by gqa_jax only inside the functions that need them, from the optional extras.
OPTIONAL = {"torch": "hf", "transformers": "hf"}


def _distribution(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_package_list_is_the_tree():
    packages = set(PYPROJECT["tool"]["setuptools"]["packages"])
    tree = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "gqa_jax").rglob("__init__.py")}
    assert {p for p in packages if not p.startswith("gqa_jax._shipped.")} == tree
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert mapped == {f"gqa_jax._shipped.{name}": name for name in shipped.FOLDERS}
    assert {f"gqa_jax._shipped.{name}" for name in shipped.FOLDERS} <= packages


def test_every_import_is_declared():
    declared = {_distribution(r) for r in PYPROJECT["project"]["dependencies"]}
    extras = {
        k: {_distribution(r) for r in v} for k, v in PYPROJECT["project"]["optional-dependencies"].items()
    }
    owners = importlib.metadata.packages_distributions()
    missing = []
    for file in (REPO / "gqa_jax").rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "gqa_jax":
                    continue
                dists = {_distribution(d) for d in owners.get(top, [top])}
                wanted = extras[OPTIONAL[top]] if top in OPTIONAL else declared
                if not dists & wanted:
                    missing.append(f"{file.relative_to(REPO)}: {top} ({', '.join(sorted(dists))})")
    assert not missing, "imported but not declared in pyproject.toml:\n" + "\n".join(sorted(set(missing)))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from this tree, installed (without its dependencies, which this environment
    has) into a folder of its own: ``(folder, environment whose PYTHONPATH is that folder)``."""
    tmp = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", REPO],
                   check=True, capture_output=True, cwd=tmp)  # fmt: skip
    (wheel,) = (tmp / "dist").glob("gqa_jax-*.whl")
    target = tmp / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", target, wheel], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    return target, env


FIGURE_SWEEPS = ("fig4_conversion", "fig5_alpha", "fig6_groups")
# Runs each argv through ``python -m gqa_jax``'s ``main`` in one process (a process per command
# costs the imports each time): prints [{"rc", "out", "err"}, ...] and where ``shipped`` looks.
DRIVER = """
import contextlib, io, json, sys
from gqa_jax import shipped
from gqa_jax.__main__ import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    results.append({"rc": rc, "out": out.getvalue(), "err": err.getvalue()})
where = [str(shipped.PACKAGE), str(shipped.checkout()), str(shipped.folder("experiments"))]
print(json.dumps({"where": where, "results": results}))
"""


def test_an_installed_package_runs_the_shipped_sweeps_and_configs_from_anywhere(installed, tmp_path):
    target, env = installed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    commands = {
        "dry": ["sweep", "mini", "--set", "scale=quick", "--root", "runs", "--dry-run"],
        "tpu": ["sweep", "table1", "--root", "runs", "--dry-run", "--launcher", "tpu", "--tpu", "t",
                "--zone", "z"],
        **{s: ["sweep", s, "--root", "runs", "--dry-run"] for s in FIGURE_SWEEPS},
        "missing": ["report", "nosuch", "--root", "runs"],
        "path": ["sweep", "experiments/mini.py", "--root", "runs", "--dry-run"],  # a path is a path
        "config": ["train", "--config", "nosuch:task=x", "--workdir", "w"],
    }  # fmt: skip
    ran = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(list(commands.values()))],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout.splitlines()[-1])
    out = dict(zip(commands, (SimpleNamespace(**r) for r in found["results"]), strict=True))
    assert found["where"] == [
        str(target / "gqa_jax"),
        "None",
        str(target / "gqa_jax" / "_shipped" / "experiments"),
    ]
    for name in ("configs", "experiments", "scripts"):
        shipped_files = sorted(
            p.name for p in (target / "gqa_jax" / "_shipped" / name).iterdir() if p.is_file()
        )
        assert shipped_files == sorted(p.name for p in (REPO / name).iterdir() if p.suffix in (".py", ".sh"))
    assert os.access(target / "gqa_jax" / "_shipped" / "scripts" / "launch_tpu.sh", os.X_OK)

    assert out["dry"].rc == 0, out["dry"].err
    assert f"--config {target}/gqa_jax/_shipped/configs/pretrain.py" in out["dry"].out
    assert str(REPO) not in out["dry"].out
    tpu = out["tpu"]
    assert tpu.rc == 0 and f"{target}/gqa_jax/_shipped/scripts/launch_tpu.sh" in tpu.out, tpu.err
    for sweep in FIGURE_SWEEPS:
        assert out[sweep].rc == 0, out[sweep].err
    assert not (elsewhere / "runs").exists()  # a dry run writes nothing
    assert out["missing"].rc == 2
    assert (
        "no shipped sweep file named 'nosuch'; the shipped ones: fig4_conversion, fig5_alpha"
        in out["missing"].err
    )
    assert out["path"].rc == 2 and "sweep file experiments/mini.py does not exist" in out["path"].err
    config = out["config"]
    assert config.rc == 2 and "the shipped ones: base, finetune, pretrain, uptrain" in config.err
    assert sorted(p.name for p in elsewhere.iterdir()) == []
