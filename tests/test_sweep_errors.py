"""A sweep's input, named in one line before any work: a broken sweep file (its file and line),
a ``--set`` of the wrong type (the key), and paths made absolute where the user typed them."""

import os
from pathlib import Path

import pytest

from gqa_jax.__main__ import main
from gqa_jax.experiments.sweep import load_sweep, resolve_path

REPO = Path(__file__).resolve().parents[1]
MINI = REPO / "experiments" / "mini.py"
GOOD = "from gqa_jax.experiments.sweep import Sweep\nPARAMS = {'n': 1}\n"


@pytest.mark.parametrize(
    "body,message",
    [
        ("PARAMS = {}\ndef get_sweep(params)\n    pass\n", "line 2: SyntaxError: expected ':'"),
        ("import no_such_module_here\n", "line 1 (loading it): ModuleNotFoundError: No module named"),
        (GOOD + "def get_sweep(params):\n    return {}['k']\n", "line 4 (in get_sweep): KeyError: 'k'"),
    ],
)
def test_a_broken_sweep_file_is_one_line_with_its_file_and_line(body, message, tmp_path, capsys):
    file = tmp_path / "broken.py"
    file.write_text(body)
    assert main(["sweep", str(file), "--root", str(tmp_path / "root"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"sweep file {file}, {message}" in err[0], err
    assert not (tmp_path / "root").exists()


def test_a_set_of_the_wrong_type_names_the_key():
    with pytest.raises(
        ValueError, match=r"^--set fig4_seeds=abc: fig4_seeds is a whole number \(default 1\)$"
    ):
        load_sweep(MINI, ["fig4_seeds=abc"])


def test_paths_are_made_absolute_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suite_link").mkdir()
    home = os.path.expanduser("~")
    assert resolve_path("data_dir", "suite_link") == str(tmp_path / "suite_link")
    assert resolve_path("data_dir", "~/.cache/x") == f"{home}/.cache/x"
    assert resolve_path("whatever", "suite_link") == str(tmp_path / "suite_link")  # it exists here
    assert resolve_path("task", "my_task.py") == str(tmp_path / "my_task.py")
    for key, value in [("task", "stdlib_docsum"), ("data_dir", "gs://b/d"), ("model", "{run:x}/model"),
                       ("scale", "quick"), ("data_dir", None)]:  # fmt: skip
        assert resolve_path(key, value) == value
    sweep = load_sweep(MINI, ["scale=quick", "data_dir=suite_link"])
    dirs = {r.args["data_dir"] for r in sweep.runs if "data_dir" in r.args}
    assert dirs == {str(tmp_path / "suite_link")}


def test_a_count_that_would_drop_a_figure_is_refused():
    with pytest.raises(ValueError, match="fig4_seeds=0 leaves Fig. 4 without a run"):
        load_sweep(MINI, ["fig4_seeds=0"])


def test_the_quick_sweep_trains_on_the_vocabulary_the_quick_demo_builds(tmp_path):
    from gqa_jax.data import stdlib_suite

    runs = load_sweep(MINI, ["scale=quick", f"data_dir={tmp_path}"]).runs
    demo_vocab = str(stdlib_suite.suite_vocab_path(tmp_path, 1000))  # reproduce.run's for the quick scale
    assert {r.args["vocab"] for r in runs if "vocab" in r.args} == {demo_vocab}
    assert stdlib_suite.suite_vocab_size(demo_vocab, tmp_path) == 1000  # a run builds it where missing
    assert stdlib_suite.suite_vocab_size(tmp_path / "spm1000.model", tmp_path) is None
    assert {r.args.get("vocab") for r in load_sweep(MINI, []).runs} == {None}  # the suite's default size
