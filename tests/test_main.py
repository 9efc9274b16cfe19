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
