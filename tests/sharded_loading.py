"""Run with 8 simulated CPU devices (tests/eight_devices.py runs it for
test_checkpoints_sharded.py): every checkpoint format loaded with ``mesh=2x4`` against its
one-device load, one JSON line per (format, K); with ``--train VOCAB``, uptraining and
fine-tuning from a T5X checkpoint on 2x4 against one device, one JSON line per recipe."""

import json
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorflow_datasets as tfds
from flax.nnx import traversals
from safetensors.numpy import save_file
from t5x_files import t5x_from_ours, write_legacy, write_orbax

from gqa_jax import checkpoints, run_config, sharding, training
from gqa_jax.checkpoints import hf, layout
from gqa_jax.config import preset
from gqa_jax.model import build, dotted, flat_params

REPO = Path(__file__).resolve().parents[1]


def write_hf(directory: Path, model) -> Path:
    """Our MHA model as a HF T5.1.1 safetensors directory (through the importer's own table)."""
    c = model.config
    flat = flat_params(model)
    tensors = {name: t.to_stored(np.asarray(flat[t.path])) for name, t in hf.tensor_map(c).items()}
    tensors["lm_head.weight"] = np.ascontiguousarray(np.asarray(flat[("lm_head",)]).T)
    directory.mkdir()
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    fields = {"model_type": "t5", "vocab_size": c.vocab_size, "d_model": c.d_model, "d_ff": c.d_ff,
              "d_kv": c.head_dim, "num_heads": c.num_heads, "num_layers": c.num_encoder_layers,
              "num_decoder_layers": c.num_decoder_layers, "feed_forward_proj": c.mlp_activation,
              "relative_attention_num_buckets": c.relative_attention_num_buckets,
              "relative_attention_max_distance": c.relative_attention_max_distance,
              "tie_word_embeddings": False}  # fmt: skip
    (directory / "config.json").write_text(json.dumps(fields))
    return directory


def main(root: Path) -> None:
    assert jax.device_count() == 8, jax.devices()
    mesh = sharding.make_mesh("2x4")
    reads: dict[str, int] = {}  # parameter -> the largest block (elements) any one read returned
    plain_read = layout.read

    def recording_read(tensor, read_stored, index=None):
        block = plain_read(tensor, read_stored, index)
        name = dotted(tensor.path)
        reads[name] = max(reads.get(name, 0), block.size)
        return block

    layout.read = recording_read
    for k in (8, 1):
        config = preset("tiny", num_heads=8, head_dim=4, num_kv_heads=k, relative_attention_max_distance=128)
        source = build(config, seed=1)
        paths = {
            "gqa_jax": checkpoints.save(source, root / f"ours_{k}"),
            "t5x": write_legacy(root / f"t5x_{k}", t5x_from_ours(source)),
            "t5x_orbax": write_orbax(root / f"t5x_orbax_{k}", t5x_from_ours(source)),
        }
        if k == config.num_heads:  # HF T5 is MHA only
            paths["huggingface"] = write_hf(root / f"hf_{k}", source)
        for kind, path in paths.items():
            with jax.default_device(jax.devices()[0]):
                one = flat_params(checkpoints.load_any(path)[0])
            reads.clear()
            model, _, found = checkpoints.load_any(path, mesh=mesh)  # sharded
            got = flat_params(model)
            expected = flat_params(sharding.param_shardings(traversals.unflatten_mapping(one), mesh)[0])
            row = {"kind": kind, "found": found, "k": k, "params": len(got), "sharded": 0}
            row |= {"unequal": [], "wrong_sharding": [], "full_reads": []}
            for path_, want in one.items():
                name, x = dotted(path_), got[path_]
                if not np.array_equal(np.asarray(x), np.asarray(want)):
                    row["unequal"].append(name)
                spec = expected[path_].spec
                if x.sharding.spec != spec:
                    row["wrong_sharding"].append(f"{name}: {x.sharding.spec} != {spec}")
                shard_size = int(np.prod(x.sharding.shard_shape(x.shape)))
                if shard_size < x.size:  # a sharded parameter: no device holds it whole
                    row["sharded"] += 1
                    if any(s.data.size != shard_size for s in x.addressable_shards):
                        row["wrong_sharding"].append(f"{name}: a device holds more than its shard")
                    if reads.get(name, 0) > shard_size:
                        row["full_reads"].append(f"{name}: read {reads[name]} of {x.size}")
            row["blocks_read"] = len(reads)
            if kind == "t5x":  # the optimizer state around a loaded model is created sharded
                opt = training.make_optimizer(training.OptimizerConfig("rsqrt", warmup_steps=10))
                state, shardings, _, _ = training.create_state(model, opt, mesh, seed=0)
                leaves = list(
                    zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(shardings.opt_state), strict=True)
                )
                row["opt_wrong"] = sum(not x.sharding.is_equivalent_to(s, x.ndim) for x, s in leaves)
                row["opt_sharded"] = sum(x.addressable_shards[0].data.size < x.size for x, _ in leaves)
            print(json.dumps(row), flush=True)


def train_from_a_checkpoint(root: Path, vocab: str) -> None:
    """Two steps of uptraining (MHA -> GQA-2 by mean) and of fine-tuning, each started from the
    same T5X checkpoint on one device and on a 2x4 mesh (fine-tuning with FSDP); the final
    parameters must agree."""
    config = preset(
        "tiny",
        num_heads=8,
        head_dim=4,
        relative_attention_max_distance=128,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    source = write_legacy(root / "t5x", t5x_from_ours(build(config.replace(vocab_size=512), seed=1)))
    common = [f"--config.vocab={vocab}", f"--config.data_dir={root / 'data'}", "--config.batch_size=8",
              "--config.input_length=32", "--config.target_length=8", "--config.log_every=1",
              "--config.progress=False", "--config.eval_every=-1"]  # fmt: skip
    # uptraining continues the source's rsqrt schedule: at step 10000, a learning rate of 0.01
    uptrain = ["--config.task=c4_span", f"--config.uptrain.source={source}",
               "--config.uptrain.num_kv_heads=2", "--config.uptrain.alpha=0.0002",
               "--config.uptrain.original_steps=10000"]  # fmt: skip
    finetune = ["--config.num_train_steps=2", "--config.model.dropout_rate=0.0"]
    recipes = {
        "uptrain": (f"{REPO}/configs/uptrain.py", uptrain),
        "finetune": (f"{REPO}/configs/finetune.py:task=cnn_dailymail,init={source}", finetune),
    }
    for recipe, (file, overrides) in recipes.items():
        finals, specs = {}, {}
        # uptraining on 2x4 with the plain rules, fine-tuning on 2x4 with FSDP
        runs = (
            {"1x1": [], "2x4_fsdp": ["--config.fsdp=True"]}
            if recipe == "finetune"
            else {"1x1": [], "2x4": []}
        )
        for name, extra in runs.items():
            cfg = run_config.load(file, [*common, *overrides, f"--config.mesh={name[:3]}", *extra])
            with tfds.testing.mock_data(num_examples=32):
                summary = training.train(cfg, root / f"{recipe}_{name}")
            finals[name] = flat_params(checkpoints.load(root / f"{recipe}_{name}" / "model")[0])
            specs[name] = saved_spec(
                root / f"{recipe}_{name}" / "checkpoints" / "2", "encoder.layers.0.mlp.wi_0"
            )
        one = finals.pop("1x1")
        row = {"recipe": recipe, "steps": summary["final_step"], "kind": summary.get("source_kind")}
        for name, got in finals.items():
            row[f"max_param_diff_{name}"] = max(
                float(np.max(np.abs(np.asarray(one[p]) - np.asarray(v)))) for p, v in got.items()
            )
            row[f"wi_0_spec_{name}"] = specs[name]  # the checkpoint's sharding of one [D, F] kernel
        print(json.dumps(row), flush=True)


def saved_spec(step_dir: Path, name: str) -> list:
    """The PartitionSpec a train checkpoint recorded for the parameter ``name``."""
    with ocp.PyTreeCheckpointer() as checkpointer:
        tree = checkpointer.metadata(step_dir / "state").item_metadata.tree
    leaf = tree["params"]
    for key in name.split("."):
        leaf = leaf[key]
    return [str(a) for a in leaf.sharding.partition_spec] if leaf.sharding is not None else []


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        if sys.argv[1:2] == ["--train"]:
            train_from_a_checkpoint(Path(tmp), sys.argv[2])
        else:
            main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp))
