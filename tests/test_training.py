"""Training: loss, schedules, accumulation, and the train() loop (NaN guard, corrupt checkpoints,
uptraining) on tiny models over mock data."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
from flax import nnx

from gqa_jax import checkpoints, convert, metric_writers, run_config, training
from gqa_jax.config import preset
from gqa_jax.data import pipeline as pipeline_lib
from gqa_jax.errors import RunError
from gqa_jax.model import T5

# One encoder and one decoder layer where the depth is not what a test checks: half the compile.
ONE_LAYER = {"num_encoder_layers": 1, "num_decoder_layers": 1}
SHALLOW = {f"model.{k}": v for k, v in ONE_LAYER.items()}  # as tiny_config's fields


def toy_batch(B=8, S=12, T=6, V=128, seed=0):
    rng = np.random.default_rng(seed)
    tgt = rng.integers(2, V, (B, T)).astype(np.int32)
    tgt[:, -2:] = 0  # padding: weights 0
    return {
        "encoder_input_tokens": rng.integers(2, V, (B, S)).astype(np.int32),
        "decoder_target_tokens": tgt,
        "decoder_input_tokens": pipeline_lib.shift_right(tgt),
        "decoder_loss_weights": (tgt != 0).astype(np.float32),
    }


def test_cross_entropy_sums_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    targets = rng.integers(0, 5, (2, 3))
    weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    out = training.cross_entropy(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), z_loss=1e-4)
    lse = np.log(np.exp(logits).sum(-1))
    ce = lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(out["ce"], (ce * weights).sum(), rtol=1e-5)
    np.testing.assert_allclose(out["z"], 1e-4 * (lse**2 * weights).sum(), rtol=1e-5)
    assert float(out["tokens"]) == 3.0


def test_schedules():
    rsqrt = training.make_schedule(training.OptimizerConfig("rsqrt", warmup_steps=10_000))
    assert float(rsqrt(0)) == pytest.approx(0.01) and float(rsqrt(9_999)) == pytest.approx(0.01)
    assert float(rsqrt(40_000)) == pytest.approx(0.005)
    continued = training.make_schedule(training.OptimizerConfig("rsqrt", warmup_steps=10_000, offset=90_000))
    assert float(continued(0)) == pytest.approx(float(rsqrt(90_000)))
    const = training.make_schedule(training.OptimizerConfig("constant", learning_rate=1e-3))
    assert float(const(0)) == float(const(10**6)) == pytest.approx(1e-3)
    linear = training.make_schedule(training.OptimizerConfig("linear", learning_rate=1e-2, decay_steps=100))
    rates = [float(linear(s)) for s in (0, 50, 99, 100, 200)]
    assert rates == pytest.approx([1e-2, 5e-3, 1e-4, 0.0, 0.0])  # step 99 is the last update of 100
    with pytest.raises(ValueError, match="unknown schedule"):
        training.make_schedule(training.OptimizerConfig("cosine"))
    with pytest.raises(ValueError, match="linear schedule needs learning_rate > 0 and decay_steps >= 1"):
        training.make_schedule(training.OptimizerConfig("linear", learning_rate=1e-2))


def test_accumulation_matches_one_batch_and_loss_falls():
    model = T5(preset("tiny", **ONE_LAYER), rngs=nnx.Rngs(0))
    graphdef, _ = training.split_model(model)
    opt = training.make_optimizer(training.OptimizerConfig("constant", learning_rate=1e-2))
    batch = toy_batch()
    one = training.make_train_step(graphdef, opt, donate=False)
    four = training.make_train_step(graphdef, opt, num_microbatches=4, donate=False)
    s0 = training.init_state(model, opt, seed=0)
    a, ma = one(s0, batch)
    b, mb = four(s0, batch)
    np.testing.assert_allclose(ma["loss"], mb["loss"], rtol=1e-5)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6)
    state, losses = s0, []
    for _ in range(8):
        state, m = one(state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < 0.7 * losses[0]
    assert int(state.step) == 8


def tiny_config(vocab_path, tmp_path, **fields):
    file = fields.pop("_file", "configs/pretrain.py")
    over = [
        f"--config.vocab={vocab_path}",
        f"--config.data_dir={tmp_path / 'data'}",
        "--config.task=c4_span",
        "--config.batch_size=4",
        "--config.input_length=64",
        "--config.log_every=1",
        "--config.progress=False",
        "--config.eval_every=-1",
    ]
    over += [f"--config.{k}={v}" for k, v in fields.items()]
    return run_config.load(file, over)


def test_nan_guard_stops_and_keeps_the_last_good_checkpoint(small_vocab, tmp_path, monkeypatch):
    original = pipeline_lib.BatchIterator.__next__

    def poisoned(self):
        batch = original(self)
        if self.step == 3:  # the third batch carries a NaN loss weight
            batch = dict(batch, decoder_loss_weights=np.full_like(batch["decoder_loss_weights"], np.nan))
        return batch

    monkeypatch.setattr(pipeline_lib.BatchIterator, "__next__", poisoned)
    config = tiny_config(small_vocab.path, tmp_path, num_train_steps=5, checkpoint_every=2, **SHALLOW)
    with tfds.testing.mock_data(num_examples=16), pytest.raises(FloatingPointError, match="at step 3"):
        training.train(config, tmp_path / "run")
    report = json.loads((tmp_path / "run" / "nan_step_3.json").read_text())
    assert report["last_checkpoint"] == 2 and report["batch"]["encoder_input_tokens"]["shape"] == [4, 64]
    # step 0 (written before training) and step 2; step 3's NaN update is never saved
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == ["0", "2"]
    steps = [m["step"] for m in metric_writers.read_metrics(tmp_path / "run")]
    assert steps == [1, 2]


def test_corrupt_latest_checkpoint_is_set_aside_and_the_run_resumes(small_vocab, tmp_path, capsys):
    config = tiny_config(small_vocab.path, tmp_path, num_train_steps=4, checkpoint_every=2, **SHALLOW)
    run = tmp_path / "run"
    with tfds.testing.mock_data(num_examples=16):
        training.train(config, run)
        before = {m["step"]: m for m in metric_writers.read_metrics(run)}
        for f in (run / "checkpoints" / "4" / "state").rglob("*"):
            if f.is_file():
                f.write_bytes(b"garbage")
        config = tiny_config(small_vocab.path, tmp_path, num_train_steps=4, checkpoint_every=2, **SHALLOW)
        capsys.readouterr()
        training.train(config, run)
    assert any(
        line.startswith("checkpoint 4 ") and "moved it to" in line
        for line in capsys.readouterr().err.splitlines()
    )
    assert len(list((run / "corrupt_checkpoints").iterdir())) == 1  # set aside, not deleted
    after = {m["step"]: m for m in metric_writers.read_metrics(run)}
    for step in (3, 4):  # recomputed from checkpoint 2: the same numbers as the first time
        for key in ("train/loss", "train/grad_norm", "train/accuracy"):
            assert after[step][key] == before[step][key]


def test_restart_with_a_different_config_is_refused(small_vocab, tmp_path):
    run = tmp_path / "run"
    with tfds.testing.mock_data(num_examples=8):
        training.train(tiny_config(small_vocab.path, tmp_path, num_train_steps=1, **SHALLOW), run)
        with pytest.raises(RunError, match="different config.*batch_size"):
            training.train(
                tiny_config(small_vocab.path, tmp_path, num_train_steps=2, batch_size=8, **SHALLOW), run
            )


def test_uptraining_converts_then_runs_alpha_times_original_steps(small_vocab, tmp_path):
    cfg = preset("tiny", vocab_size=small_vocab.vocab_size, **ONE_LAYER)  # the run takes its shape
    source = checkpoints.save(T5(cfg, rngs=nnx.Rngs(1)), tmp_path / "mha")
    config = tiny_config(
        small_vocab.path,
        tmp_path,
        _file="configs/uptrain.py",
        **{
            "uptrain.source": str(source),
            "uptrain.num_kv_heads": 1,
            "uptrain.alpha": 0.25,
            "uptrain.original_steps": 12,
            "optimizer.warmup_steps": 4,
        },
    )
    # the starting point is exactly the mean-pooled conversion of the source
    model, opt_cfg, _ = training.init_model(config, small_vocab)
    expected, _, _ = convert.to_grouped(*checkpoints.load_any(source)[:2], 1, "mean")
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(x, y)
    assert opt_cfg.offset == 12
    with tfds.testing.mock_data(num_examples=16):
        summary = training.train(config, tmp_path / "run")
    assert summary["steps"] == summary["final_step"] == 3  # round(0.25 x 12)
    rows = metric_writers.read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the pre-training schedule continued from the source's step 12: 1/sqrt(12 + step)
    assert rows[0]["train/learning_rate"] == pytest.approx(12**-0.5)
    assert rows[2]["train/learning_rate"] == pytest.approx(14**-0.5)
    manifest = json.loads((tmp_path / "run" / "conversion.json").read_text())
    assert manifest["method"] == "mean"
    assert checkpoints.load(tmp_path / "run" / "model")[1].kv_heads("decoder_self") == 1

    # alpha 0: the conversion is saved without a step, and scored at step 0 (Fig. 5's first point)
    zero = tiny_config(
        small_vocab.path,
        tmp_path,
        _file="configs/uptrain.py",
        eval_at_start=True,
        eval_every=0,
        eval_examples=4,
        eval_batch_size=4,
        **{"uptrain.source": str(source), "uptrain.alpha": 0.0},
    )
    with tfds.testing.mock_data(num_examples=16):
        summary = training.train(zero, tmp_path / "alpha0")
    assert summary["steps"] == summary["final_step"] == 0
    rows = metric_writers.read_metrics(tmp_path / "alpha0")
    assert [r["step"] for r in rows] == [0] and np.isfinite(rows[0]["eval/loss"])
    saved = nnx.to_pure_dict(nnx.state(checkpoints.load(tmp_path / "alpha0" / "model")[0], nnx.Param))
    for x, y in zip(jax.tree.leaves(saved), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(x, y)


def test_finetuning_schedule_linear_decays_to_zero_at_the_last_step(small_vocab, tmp_path):
    source = checkpoints.save(
        T5(preset("tiny", vocab_size=small_vocab.vocab_size), rngs=nnx.Rngs(1)), tmp_path / "m"
    )
    fields = {"_file": "configs/finetune.py", "task": "cnn_dailymail", "init_from": str(source)}
    config = tiny_config(
        small_vocab.path, tmp_path, num_train_steps=40, **fields, **{"optimizer.learning_rate": 0.01}
    )
    assert training.init_model(config, small_vocab)[1].schedule == "constant"  # the paper's, the default
    config = tiny_config(
        small_vocab.path, tmp_path, num_train_steps=40, **fields,
        **{"optimizer.learning_rate": 0.01, "optimizer.schedule": "linear"},
    )  # fmt: skip
    training.check_config(config)
    opt_cfg = training.init_model(config, small_vocab)[1]
    assert (opt_cfg.schedule, opt_cfg.decay_steps, opt_cfg.learning_rate) == ("linear", 40, 0.01)
    with pytest.raises(
        ValueError, match="config.optimizer.schedule must be one of constant, linear, got 'cosine'"
    ):
        training.check_config(
            tiny_config(small_vocab.path, tmp_path, **fields, **{"optimizer.schedule": "cosine"})
        )


def test_bad_configs(small_vocab, tmp_path):
    with pytest.raises(ValueError, match="recipe"):
        training.check_config(tiny_config(small_vocab.path, tmp_path, recipe="distill"))
    with pytest.raises(ValueError, match="unknown task"):
        training.check_config(tiny_config(small_vocab.path, tmp_path, task="c5"))
    with pytest.raises(ValueError, match="span-corruption"):
        training.check_config(tiny_config(small_vocab.path, tmp_path, task="cnn_dailymail"))
    with pytest.raises(ValueError, match="uptrain.source"):
        training.check_config(tiny_config(small_vocab.path, tmp_path, _file="configs/uptrain.py"))
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\]"):
        training.check_config(tiny_config(small_vocab.path, tmp_path, _file="configs/uptrain.py",
                                          **{"uptrain.source": "x", "uptrain.alpha": 1.5}))  # fmt: skip
    with pytest.raises(ValueError, match="config.model.d_model=48 sets a model shape, but this run starts"):
        training.check_config(tiny_config(small_vocab.path, tmp_path, _file="configs/uptrain.py",
                                          **{"uptrain.source": "x", "model.d_model": 48}))  # fmt: skip
    with pytest.raises(ValueError, match="no field 'batchsize'"):
        tiny_config(small_vocab.path, tmp_path, batchsize=3)
    with pytest.raises(ValueError, match="int"):
        tiny_config(small_vocab.path, tmp_path, batch_size="big")


def test_a_config_trains_a_shape_of_its_own(small_vocab, tmp_path):
    config = tiny_config(
        small_vocab.path,
        tmp_path,
        **{"model.d_model": 48, "model.num_heads": 6, "model.head_dim": 4, "model.num_decoder_layers": 1},
    )
    cfg, _, _ = training.init_model(config, small_vocab)
    assert (cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.num_encoder_layers, cfg.num_decoder_layers) == (
        48,
        6,
        4,
        2,
        1,
    )
    assert cfg.vocab_size == small_vocab.vocab_size


def test_bfloat16_activations_with_float32_params_train():
    cfg = preset("tiny", dtype="bfloat16", param_dtype="float32", **ONE_LAYER)
    model = T5(cfg, rngs=nnx.Rngs(0))
    graphdef, _ = training.split_model(model)
    opt = training.make_optimizer(training.OptimizerConfig("constant", learning_rate=1e-2))
    state = training.init_state(model, opt, seed=0)
    step = training.make_train_step(graphdef, opt)
    batch = toy_batch(B=4, S=8, T=6)
    losses = []
    for _ in range(6):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
