"""The command line: the dispatcher and `train`'s config parsing (the demo: tests/test_mini.py)."""

import os
from pathlib import Path

import pytest

from gqa_jax.__main__ import main


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


def test_top_level_help_builds_no_command():
    """`--help` lists the commands without building their arguments (no heavy imports)."""
    import subprocess
    import sys

    code = (
        "import sys; from gqa_jax.__main__ import main; rc = main(['--help']); "
        "print(sorted(m for m in ('gqa_jax.reproduce', 'gqa_jax.data.tasks', 'tensorflow_datasets', "
        "'ml_collections', 'gqa_jax.training') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


# ------------------------------------------------------------------------------- train's config
REPO = Path(__file__).resolve().parents[1]


def train_config(*argv):
    """`train`'s config as the command line parses it (no training run)."""
    from gqa_jax.__main__ import parse
    from gqa_jax.cli import train

    args = parse(["train", "--config", str(REPO / "configs" / "pretrain.py"), "--workdir", "w", *argv])
    assert args.workdir == "w"
    return train.config(args)


def train_error(capsys, *argv, config="pretrain.py"):
    """`train`'s exit code 2 and its one-line error (the config fails before any training)."""
    assert main(["train", "--config", str(REPO / "configs" / config), "--workdir", "w", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("python -m gqa_jax train: error: ")
    return err


@pytest.mark.parametrize(
    "argv",
    [
        ("--config.num_train_steps=5",),
        ("--config.num_train_steps", "5"),
    ],
)
def test_train_overrides_with_equals_or_space(argv):
    assert train_config(*argv).num_train_steps == 5


def test_train_overrides_nested_bool_float_tuple_fields():
    config = train_config(
        "--config.model.num_kv_heads", "2", "--config.z_loss", "-1e-3", "--config.optimizer.learning_rate=1",
        "--config.progress=False", "--noconfig.pack", "--config.mesh", "2x4",
        "--config.model.grouped_attentions", "cross", "--config.model.grouped_attentions=decoder_self",
    )  # fmt: skip
    assert config.model.num_kv_heads == 2 and config.z_loss == -1e-3
    assert config.optimizer.learning_rate == 1.0 and isinstance(config.optimizer.learning_rate, float)
    assert config.progress is False and config.pack is False and config.mesh == "2x4"
    assert config.model.grouped_attentions == ("cross", "decoder_self")


def test_train_none_default_fields_are_typed(capsys):
    assert train_config().input_length is None
    assert train_config("--config.input_length", "12").input_length == 12
    assert train_config("--config.init_from=runs/x/model").init_from == os.path.abspath("runs/x/model")
    err = train_error(capsys, "--config.input_length", "long")
    assert "config.input_length takes a value of type int" in err


def test_train_unknown_field_lists_the_known_fields(capsys):
    err = train_error(capsys, "--config.num_train_step=5")
    assert "no field 'num_train_step'" in err and "did you mean num_train_steps?" in err
    for field in ("batch_size", "num_train_steps", "model.num_kv_heads", "uptrain.alpha", "z_loss"):
        assert field in err
    err = train_error(capsys, "--config.model.num_kv_head", "2")
    assert "config.model has no field 'num_kv_head'" in err and "model.num_kv_heads" in err
    assert "batch_size" not in err  # the fields of the section named
    err = train_error(capsys, "--config.batch_size.rows=2")
    assert "config.batch_size is a field (int), not a section" in err


def test_train_wrong_type_names_the_field(capsys):
    err = train_error(capsys, "--config.batch_size=big")
    assert "config.batch_size takes a value of type int" in err and "'big'" in err
    err = train_error(capsys, "--config.pack=maybe")
    assert "config.pack takes a value of type bool" in err


def test_train_refuses_stray_arguments(capsys):
    assert "unrecognized argument --batch" in train_error(capsys, "--batch", "8")
    assert "unexpected argument(s) False" in train_error(capsys, "--config.pack", "False")  # bools: =False


def test_train_variants(capsys):
    from gqa_jax.__main__ import parse
    from gqa_jax.cli import train

    spec = f"{REPO / 'configs' / 'finetune.py'}:task=stdlib_docsum,init=/m,steps=7"
    config = train.config(parse(["train", "--config", spec, "--workdir", "w"]))
    assert (config.recipe, config.task, config.init_from, config.num_train_steps) == (
        "finetune", "stdlib_docsum", "/m", 7
    )  # fmt: skip
    err = train_error(capsys, config="finetune.py:task=stdlib_docsum,tsk=x")
    assert "configs/finetune.py: unknown variant keys ['tsk']; known: task, init, model, steps" in err
    err = train_error(capsys, config="finetune.py:task")
    assert "config variant item 'task' must look like key=value" in err


def test_train_help_names_the_override_forms(capsys):
    assert main(["train", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--config.FIELD=VALUE or --config.FIELD VALUE" in out and "configs/base.py" in out


@pytest.mark.parametrize("where,message", [("", "is a folder"), ("none/x.json", "does not exist")])
def test_a_json_output_that_cannot_be_written_is_refused_before_any_work(where, message, tmp_path, capsys):
    code = main(["bench", "cache", "--model", str(tmp_path / "no_model"), "--json", str(tmp_path / where)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "argument --json" in err[0] and message in err[0], err


def test_a_predict_mesh_not_of_the_slice_is_named_before_libtpu_loads(tmp_path, capsys, monkeypatch):
    from gqa_jax.tools import tpu_topology

    def no_libtpu(name):
        raise AssertionError("libtpu was asked for the slice")

    monkeypatch.setattr(tpu_topology, "slice_devices", no_libtpu)
    out = tmp_path / "t"
    argv = ["--preset", "tiny", "--predict", "v4:2x2x2", "--mesh", "3x3"]
    assert main(["time", "--workdir", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert "--mesh 3x3 has 9 devices but TPU slice v4:2x2x2 has 8 chips" in err and not out.exists()
