"""Figure 4: how to build the MQA model's K/V heads from T5.1.1-Large's: mean-pooled (the paper's),
the group's first head, or random; uptrained for alpha = 0.05, fine-tuned and scored on CNN/DM,
Multi-News and TriviaQA (dev sets).

    python -m gqa_jax sweep experiments/fig4_conversion.py --root runs/fig4 --dry-run \\
        --set t5_large=ckpt/t5_1_1_large --set vocab=spm/cc_all.32000.model
    python -m gqa_jax report experiments/fig4_conversion.py --root runs/fig4

Expected runtime: three Large uptrainings (50k steps each) and nine fine-tunings: TPU-pod scale.
The paper's finding: Mean > First > Random (it plots the bars; it prints no numbers).
``--set methods=all`` adds every other method of ``gqa_jax.conversion`` and the calibrated variant
of each that calibrates (calibrated on 4 batches of the uptraining task: docs/checkpoints.md), each
one more uptraining with its fine-tunings, beside the paper's three.
"""

from gqa_jax.experiments import paper
from gqa_jax.experiments import runs as R
from gqa_jax.experiments.sweep import Sweep

PARAMS = {
    "t5_large": "ckpt/t5_1_1_large",
    "vocab": "spm/cc_all.32000.model",
    "data_dir": None,
    "finetune_steps": paper.FINETUNE_STEPS,
    "eval_every": paper.EVAL_EVERY,
    "seeds": 1,
    "methods": "paper",  # mean, first, random; "all": every method and calibrated variant; or a list
}


def get_sweep(params):
    runs = []
    methods = paper.conversion_methods(params["methods"])
    for method in methods:
        up = f"uptrain_mqa_large_{method}"
        runs.append(R.uptrain(up, params["t5_large"], 1, params, method=method, tags={"method": method}))
        for task, *_ in paper.FIG4_TASKS:
            for seed in range(params["seeds"]):
                tags = {"model": "MQA-Large", "method": method}
                runs += R.finetune_and_evaluate(method, f"{{run:{up}}}/model", task, params, seed=seed,
                                                deps=(up,), tags=tags)  # fmt: skip
    info = {"tasks": [list(t) for t in paper.FIG4_TASKS], "methods": list(methods),
            "claim": "Mean > First > Random"}  # fmt: skip
    return Sweep("fig4_conversion", tuple(runs), info)
