"""Table 1: MHA-Large, MHA-XXL, MQA-XXL and GQA-8-XXL fine-tuned on the seven tasks, scored on the
dev sets, and their decode time per sample.

    python -m gqa_jax sweep experiments/table1.py --root runs/table1 --dry-run \\
        --set t5_large=ckpt/t5_1_1_large --set t5_xxl=ckpt/t5_1_1_xxl --set vocab=spm/cc_all.32000.model
    python -m gqa_jax sweep experiments/table1.py --root runs/table1 [same --set ...]
    python -m gqa_jax report experiments/table1.py --root runs/table1

Runs: MQA-XXL and GQA-8-XXL are T5.1.1-XXL mean-pooled to 1 / 8 K/V heads (decoder self- and
cross-attention) and uptrained for alpha = 0.05 of its 1M pre-training steps on C4 span
corruption; every model is fine-tuned on every task (constant lr 0.001, batch 128, dropout 0.1,
the task's lengths, the best dev checkpoint kept), evaluated on the dev split with greedy
decoding, and timed at each task's lengths on random weights (the largest batch that fits, up to
32 per device). T_infer is the mean of a model's times at its tasks' lengths, each set of
lengths once (512 / 256, 2048 / 512, 2048 / 32), as the report takes it. The starting
checkpoints are paths the user gives (ours, HuggingFace T5 directories or T5X checkpoint_N;
``t5_large``, ``t5_xxl``), as is T5's SentencePiece model (``vocab``).

Expected runtime: the paper's scale (XXL on a TPU pod: about 600 TPUv3 chip-days for the two
uptrainings alone); the time runs alone fit on one GPU. The paper's numbers (T_infer s / Average):
MHA-Large 0.37 / 46.0, MHA-XXL 1.51 / 47.2, MQA-XXL 0.24 / 46.6, GQA-8-XXL 0.28 / 47.1.

T_infer predicted for the paper's 8 TPUv4 chips instead of measured, on this CPU (the time runs
alone, no checkpoint needed; libtpu: ``pip install -r requirements-tpu.txt``):

    python -m gqa_jax sweep experiments/table1.py --root runs/table1 --set predict=v4:2x2x2 \
        --only "time_*" --jobs 2
    python -m gqa_jax report experiments/table1.py --root runs/table1 --set predict=v4:2x2x2

(``time --predict``: a roofline of the TPU compiler's cost analysis, docs/experiments.md; the
report labels the times as predictions and gives their ratio to the paper's and the read-once
floor beside each; ``--set mesh=1x8`` for one mesh instead of every split: 3 to 10 minutes per run,
two at a time, the longest where the batch is searched (MHA-XXL at input 2048).
The measured predictions: docs/results/predicted-tpu.md.)

``--set decode=paper`` times (or predicts) the decode as the paper's code ran it instead of ours
(T5X's cross K/V projected at every step, its one-hot cache write in its layout; an instrument for
the paper's timings, docs/decoding.md), or ``--set decode=SWITCH[+SWITCH]`` some of it, in runs of
their own (``..._decode-paper``): docs/results/paper-decode.md.
"""

from gqa_jax.experiments import paper
from gqa_jax.experiments import runs as R
from gqa_jax.experiments.sweep import Sweep

PARAMS = {
    "t5_large": "ckpt/t5_1_1_large",
    "t5_xxl": "ckpt/t5_1_1_xxl",
    "vocab": "spm/cc_all.32000.model",
    "data_dir": None,
    "finetune_steps": paper.FINETUNE_STEPS,
    "eval_every": paper.EVAL_EVERY,
    "seeds": 1,
    "predict": None,  # a TPU slice (v4:2x2x2): the time runs predicted for it, not measured
    "mesh": "auto",  # with predict: DATAxMODEL over its chips, or auto (every split, the fastest)
    "decode": "ours",  # the time runs' decode: ours, or the paper's (an instrument for its timings)
}
# name -> (preset, K/V heads, start: an MHA checkpoint param or an uptraining run)
MODELS = {
    "MHA-Large": ("large", 16, "t5_large"),
    "MHA-XXL": ("xxl", 64, "t5_xxl"),
    "MQA-XXL": ("xxl", 1, "uptrain_mqa_xxl"),
    "GQA-8-XXL": ("xxl", 8, "uptrain_gqa8_xxl"),
}


def get_sweep(params):
    runs = [
        R.uptrain("uptrain_mqa_xxl", params["t5_xxl"], 1, params, tags={"model": "MQA-XXL"}),
        R.uptrain("uptrain_gqa8_xxl", params["t5_xxl"], 8, params, tags={"model": "GQA-8-XXL"}),
    ]
    lengths = sorted({(task.input_length, task.target_length) for task in _tasks()})
    for model, (preset, kv, start) in MODELS.items():
        key = model.lower().replace("-", "_")
        init, deps = (params[start], ()) if start in params else (f"{{run:{start}}}/model", (start,))
        for task, *_ in paper.TABLE1_TASKS:
            for seed in range(params["seeds"]):
                runs += R.finetune_and_evaluate(
                    key, init, task, params, seed=seed, deps=deps, tags={"model": model}
                )
        for s, t in lengths:
            tags = {"model": model, "lengths": f"{s}/{t}"}
            runs.append(
                R.time(
                    f"time_{key}_{s}_{t}",
                    preset,
                    kv,
                    s,
                    t,
                    tags=tags,
                    predict=params["predict"],
                    mesh=params["mesh"],
                    decode=params["decode"],
                )
            )
    return Sweep("table1", tuple(runs), paper.table1_paper())


def _tasks():
    from gqa_jax.data import tasks

    return [tasks.get_task(name) for name, *_ in paper.TABLE1_TASKS]
