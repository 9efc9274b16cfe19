"""The ``train`` command line of the resume tests (tests/test_resume.py, tests/test_multihost.py)
and what they compare: the logged metrics, and a checkpoint's state read back as numpy arrays."""

import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

PRETRAIN = str(Path(__file__).resolve().parents[1] / "configs" / "pretrain.py")
N = 2  # checkpoint every N steps
COMPARED = ("loss", "z_loss", "accuracy", "grad_norm", "param_norm", "tokens", "learning_rate")


def command(workdir, data, vocab, steps):
    """``python -m gqa_jax train`` of a tiny pre-training run on the suite's subset (one encoder and
    one decoder layer: half the tiny preset's programs to compile; what is checked holds at any
    depth)."""
    return [
        sys.executable, "-m", "gqa_jax", "train", "--config", PRETRAIN,
        "--workdir", str(workdir),
        f"--config.data_dir={data}", f"--config.vocab={vocab}", "--config.batch_size=4",
        "--config.input_length=128", f"--config.num_train_steps={steps}", f"--config.checkpoint_every={N}",
        "--config.log_every=1", "--config.eval_every=-1", "--config.progress=False",
        "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
    ]  # fmt: skip


def restore_state(path, item="state"):
    """A checkpoint's TrainState (or a saved model's params) as numpy arrays (whatever devices or
    mesh wrote it)."""
    with ocp.PyTreeCheckpointer() as ckpt:
        meta = ckpt.metadata(path / item)
        tree = getattr(meta, "item_metadata", meta)
        tree = getattr(tree, "tree", tree)
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        return ckpt.restore(path / item, restore_args=args)
