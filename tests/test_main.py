"""The command line's main job (for now the demo)."""

from gqa_jax.__main__ import main


def test_demo_runs_and_shows_the_cache_shrinking(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line[:3] in ("MHA", "GQA", "MQA")}
    assert rows["MHA"][4] == "1.000" and rows["GQA-2"][4] == "0.500" and rows["MQA"][4] == "0.250"


def test_no_command_is_an_error(capsys):
    assert main([]) == 2
