"""The installable package: pyproject.toml's package list and dependencies against the tree, and an
installed wheel (not a checkout) that runs the shipped sweeps and configs from another directory."""

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

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


def test_an_installed_package_runs_the_shipped_sweeps_and_configs_from_anywhere(installed, tmp_path):
    target, env = installed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def gqa(*args):
        return subprocess.run([sys.executable, "-m", "gqa_jax", *args], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    where = subprocess.run(
        [sys.executable, "-c", "from gqa_jax import shipped; print(shipped.PACKAGE, shipped.checkout(), "
         "shipped.folder('experiments'))"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert where == [str(target / "gqa_jax"), "None", str(target / "gqa_jax" / "_shipped" / "experiments")]
    for name in ("configs", "experiments", "scripts"):
        shipped_files = sorted(
            p.name for p in (target / "gqa_jax" / "_shipped" / name).iterdir() if p.is_file()
        )
        assert shipped_files == sorted(p.name for p in (REPO / name).iterdir() if p.suffix in (".py", ".sh"))
    assert os.access(target / "gqa_jax" / "_shipped" / "scripts" / "launch_tpu.sh", os.X_OK)

    dry = gqa("sweep", "mini", "--set", "scale=quick", "--root", "runs", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"--config {target}/gqa_jax/_shipped/configs/pretrain.py" in dry.stdout
    assert str(REPO) not in dry.stdout
    tpu = gqa(
        "sweep", "table1", "--root", "runs", "--dry-run", "--launcher", "tpu", "--tpu", "t", "--zone", "z"
    )
    assert tpu.returncode == 0 and f"{target}/gqa_jax/_shipped/scripts/launch_tpu.sh" in tpu.stdout, (
        tpu.stderr
    )
    for sweep in ("fig4_conversion", "fig5_alpha", "fig6_groups"):
        assert gqa("sweep", sweep, "--root", "runs", "--dry-run").returncode == 0
    assert not (elsewhere / "runs").exists()  # a dry run writes nothing
    missing = gqa("report", "nosuch", "--root", "runs")
    assert missing.returncode == 2
    assert (
        "no shipped sweep file named 'nosuch'; the shipped ones: fig4_conversion, fig5_alpha"
        in missing.stderr
    )
    path = gqa("sweep", "experiments/mini.py", "--root", "runs", "--dry-run")  # a path is a path
    assert path.returncode == 2 and "sweep file experiments/mini.py does not exist" in path.stderr
    config = gqa("train", "--config", "nosuch:task=x", "--workdir", "w")
    assert config.returncode == 2 and "the shipped ones: base, finetune, pretrain, uptrain" in config.stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == []
