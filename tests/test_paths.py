"""User-given paths: local directories, or gs:// URLs that stay URLs. On an offline fake GCS
(tests/fake_gcs.py), checkpoint save / restore, ``convert`` and ``train`` (with a resume) write
only to the bucket, and a guard fails the test if any code path turns a URL into a local path."""

from __future__ import annotations

import builtins
import json
import os
from pathlib import Path

import fake_gcs
import numpy as np
import pytest
import tensorflow_datasets as tfds
from etils import epath
from sharded_loading import write_hf
from t5x_files import t5x_from_ours, write_legacy, write_orbax

from gqa_jax import checkpoints, convert, metric_writers, paths, run_config, training
from gqa_jax.config import preset
from gqa_jax.experiments import runner
from gqa_jax.model import build, flat_params

REPO = Path(__file__).resolve().parents[1]
# One encoder and one decoder layer: fewer arrays, so fewer objects and requests on the fake GCS;
# what is checked (where each byte goes, and that it reads back equal) holds at any depth.
ONE_LAYER = {"num_encoder_layers": 1, "num_decoder_layers": 1}


def test_local_paths_urls_and_refusals(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.resolve("~/runs/a", "workdir") == epath.Path(tmp_path / "runs" / "a")
    monkeypatch.chdir(tmp_path)
    assert os.fspath(paths.resolve("rel", "workdir")) == str(tmp_path / "rel")
    url = paths.resolve("gs://my-bucket/runs/gqa8", "workdir")
    assert os.fspath(url) == "gs://my-bucket/runs/gqa8" and paths.is_remote(url)
    assert os.fspath(url / "checkpoints") == "gs://my-bucket/runs/gqa8/checkpoints"
    for bad, message in [
        ("", "workdir is an empty path"),
        ("gs://", "names no bucket"),
        ("s3://b/run", "s3:// paths are not supported; use a local directory or gs://bucket/path"),
        ("http://host/run", "http:// paths are not supported"),
    ]:
        with pytest.raises(ValueError, match=message):
            paths.resolve(bad, "workdir")
    with pytest.raises(ValueError, match="sweep root 'gs://b/s' is a URL, but a sweep keeps"):
        runner.run_sweep(None, "gs://b/s")
    assert os.listdir(tmp_path) == []  # nothing like ./gs: was created


def _no_local_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail on any local file operation on a path that holds "gs:": what pathlib makes of a URL."""

    def guard(fn):
        def checked(path, *args, **kwargs):
            if isinstance(path, (str, os.PathLike)) and "gs:" in os.fsdecode(os.fspath(path)):
                raise AssertionError(f"a URL became a local path: {fn.__name__}({os.fspath(path)!r})")
            return fn(path, *args, **kwargs)

        return checked

    for module, name in [(builtins, "open"), (os, "open"), (os, "mkdir"), (os, "makedirs"), (os, "replace"),
                         (os, "rename"), (os, "stat"), (os, "listdir"), (os, "scandir")]:  # fmt: skip
        monkeypatch.setattr(module, name, guard(getattr(module, name)))


def _equal(a, b) -> None:
    fa, fb = flat_params(a), flat_params(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]))


def test_checkpoints_convert_and_train_on_gcs_write_nothing_local(small_vocab, tmp_path, monkeypatch, capsys):
    bucket = fake_gcs.start()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    model = build(preset("tiny", num_kv_heads=4, **ONE_LAYER))
    config = run_config.load(
        str(REPO / "configs" / "pretrain.py"),
        [f"--config.vocab={small_vocab.path}", f"--config.data_dir={tmp_path / 'data'}",
         "--config.task=c4_span", "--config.batch_size=4", "--config.input_length=64",
         "--config.log_every=1", "--config.progress=False", "--config.eval_every=-1",
         "--config.num_train_steps=2", "--config.checkpoint_every=1",
         "--config.model.preset=tiny", "--config.model.num_encoder_layers=1",
         "--config.model.num_decoder_layers=1"],
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as guard:
        _no_local_urls(guard)
        with pytest.raises(AssertionError, match="a URL became a local path"):
            Path(f"{bucket}/x").mkdir(parents=True)  # the guard itself works
        # checkpoints: save, refuse to overwrite, overwrite, load, recognized by load_any
        saved = checkpoints.save(model, f"{bucket}/ck/mha")
        assert os.fspath(saved) == f"{bucket}/ck/mha"
        with pytest.raises(FileExistsError, match="already exists"):
            checkpoints.save(model, f"{bucket}/ck/mha")
        checkpoints.save(model, f"{bucket}/ck/mha", overwrite=True)
        loaded, cfg = checkpoints.load(f"{bucket}/ck/mha")
        _equal(loaded, model)
        assert checkpoints.load_any(f"{bucket}/ck/mha")[2] == "gqa_jax"
        # convert gs:// -> gs://, and its --check re-derivation
        dst, manifest = convert.convert_checkpoint(f"{bucket}/ck/mha", f"{bucket}/ck/gqa2", 2, "mean")
        assert manifest["source"]["path"] == f"{bucket}/ck/mha"
        assert convert.check_conversion(dst) == []
        # train; break the last checkpoint; resume one step further: checkpoint 2 is moved aside,
        # the run resumes from 1, and metrics.jsonl holds each step once
        with tfds.testing.mock_data(num_examples=16):
            first = training.train(config, f"{bucket}/run")
            (epath.Path(f"{bucket}/run/checkpoints/2/state") / "manifest.ocdbt").write_bytes(b"broken")
            config.num_train_steps = 3
            capsys.readouterr()
            again = training.train(config, f"{bucket}/run")
            err = capsys.readouterr().err.splitlines()
            assert any(x.startswith("checkpoint 2 in") and "cannot be restored" in x for x in err), err
    assert first["final_step"] == 2 and again["final_step"] == 3
    steps = [m["step"] for m in metric_writers.read_metrics(f"{bucket}/run") if "train/loss" in m]
    assert steps == [1, 2, 3]
    discarded = epath.Path(f"{bucket}/run/metrics.discarded.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in discarded] == [2]
    assert any(n.startswith("run/corrupt_checkpoints/2-") for n in fake_gcs.objects("run/"))
    names = set(fake_gcs.objects("run/"))
    for expected in ("run/config.json", "run/model_config.json", "run/metrics.jsonl", "run/summary.json",
                     "run/model/checkpoint.json", "run/checkpoints/3/state/_METADATA"):  # fmt: skip
        assert expected in names, sorted(names)
    assert any(n.startswith("run/tensorboard/events.out.tfevents") for n in names)
    assert json.loads(epath.Path(f"{bucket}/run/summary.json").read_text())["final_step"] == 3
    assert not any(".tmp-" in n or n.endswith(".checkpoint.json") for n in fake_gcs.objects("ck/"))
    assert os.listdir(cwd) == []
    assert sorted(os.listdir(tmp_path)) == ["cwd"]  # mock data: not even the data_dir was created


def test_every_loader_reads_a_checkpoint_on_gcs(tmp_path):
    """Ours, T5X legacy (zarr through TensorStore's gcs driver), T5X orbax and HF safetensors (byte
    ranges through epath) from gs://, each equal to the weights written."""
    bucket = fake_gcs.start()
    source = build(preset("tiny", relative_attention_max_distance=128, **ONE_LAYER), seed=3)
    written = {
        "gqa_jax": checkpoints.save(source, tmp_path / "ours"),
        "t5x": write_legacy(tmp_path / "t5x", t5x_from_ours(source)),
        "t5x_orbax": write_orbax(tmp_path / "t5x_orbax", t5x_from_ours(source)),
        "huggingface": write_hf(tmp_path / "hf", source),
    }
    for kind, path in written.items():
        url = fake_gcs.upload(path, f"{bucket}/sources/{kind}")
        model, _, found = checkpoints.load_any(url)
        assert found == kind
        _equal(model, source)


def test_an_atomic_write_leaves_the_old_text_or_the_new_and_no_temporary_file(tmp_path, monkeypatch):
    """``paths.write_text_atomic``, the one writer of the run records: a write replaces the file
    whole; a write that fails before its rename leaves the old text and no temporary file beside
    it; on gs:// the object holds the text and nothing else is written."""
    file = tmp_path / "run.json"
    paths.write_text_atomic(file, '{"status": "running"}\n')
    paths.write_text_atomic(file, '{"status": "done"}\n')
    assert file.read_text() == '{"status": "done"}\n' and os.listdir(tmp_path) == ["run.json"]

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(paths.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        paths.write_text_atomic(file, '{"status": "failed"}\n')
    assert file.read_text() == '{"status": "done"}\n' and os.listdir(tmp_path) == ["run.json"]
    monkeypatch.undo()

    bucket = fake_gcs.start()
    paths.write_text_atomic(f"{bucket}/atomic/run.json", "héllo\n")
    assert fake_gcs.objects("atomic/") == ["atomic/run.json"]
    assert epath.Path(f"{bucket}/atomic/run.json").read_text() == "héllo\n"


def test_an_unreachable_bucket_is_named_before_any_work(small_vocab, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # the discard port: refused
    from gqa_jax.__main__ import main

    code = main(["train", "--config", str(REPO / "configs" / "finetune.py"), "--workdir", "gs://b/run",
                 f"--config.data_dir={tmp_path / 'data'}"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "workdir gs://b/run is on Google Cloud Storage" in err[0], err
    assert not (tmp_path / "data").exists()  # nothing built before the error
