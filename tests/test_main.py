"""The command line's main job (for now the demo)."""

from gqa_jax.__main__ import main


def test_demo_quick_scale_runs_every_stage(tmp_path, monkeypatch, capsys):
    """The main job end to end at smoke scale, on a 150-file slice of the stdlib."""
    from gqa_jax.data import stdlib_suite

    monkeypatch.setenv(stdlib_suite.MAX_FILES_ENV, "150")
    monkeypatch.delenv(stdlib_suite.ROOT_ENV, raising=False)
    args = ["demo", "--scale", "quick", "--workdir", str(tmp_path / "mini"), "--data-dir", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    cells = [line.split("|") for line in out.splitlines() if line.startswith(("| MHA", "| GQA", "| MQA"))]
    rows = {row[1].strip(): row for row in cells}
    assert set(rows) == {"MHA", "GQA-2", "MQA"}
    kib = {name: float(row[4].split()[0]) for name, row in rows.items()}
    assert kib["MHA"] == 2 * kib["GQA-2"] == 4 * kib["MQA"]  # the cache shrinks by N / K
    assert (tmp_path / "mini" / "table1.json").is_file()
    assert main(args) == 0  # a second run skips every finished stage
    assert "done before, skipped" in capsys.readouterr().err


def test_no_command_is_an_error(capsys):
    assert main([]) == 2


def test_a_command_imports_only_its_own_modules():
    """`bench decode` builds only its own arguments: the data, metrics and demo modules (TFDS,
    ROUGE, ...) stay unimported, so a bench runs on a machine without them (a GPU box)."""
    import subprocess
    import sys

    code = (
        "import sys; from gqa_jax.__main__ import main; rc = main(['bench', 'decode', '--help']); "
        "print(sorted(m for m in ('gqa_jax.reproduce', 'gqa_jax.metrics', 'tensorflow_datasets', "
        "'rouge_score', 'ml_collections') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_top_level_help_still_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("demo", "bench", "train", "plan", "data", "convert", "info"):
        assert command in out
