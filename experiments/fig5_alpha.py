"""Figure 5: the uptraining fraction alpha. T5.1.1-XXL mean-pooled to MQA and to GQA-8, uptrained
for alpha = 0 (converted only), 0.05 and 0.1 of its pre-training steps, fine-tuned on the Table 1
tasks and scored on their dev sets, with MHA-XXL (fine-tuned as it is) as the reference line.

    python -m gqa_jax sweep experiments/fig5_alpha.py --root runs/fig5 --dry-run \\
        --set t5_xxl=ckpt/t5_1_1_xxl --set vocab=spm/cc_all.32000.model
    python -m gqa_jax report experiments/fig5_alpha.py --root runs/fig5

Expected runtime: four XXL uptrainings (50k and 100k steps) and 35 XXL fine-tunings: TPU-pod
scale. The paper's finding: GQA is already reasonable at alpha 0, MQA needs uptraining; both gain
from 5%, with less from 10% (it plots the curve; it prints no numbers).
"""

from gqa_jax.experiments import paper
from gqa_jax.experiments import runs as R
from gqa_jax.experiments.sweep import Sweep

PARAMS = {
    "t5_xxl": "ckpt/t5_1_1_xxl",
    "vocab": "spm/cc_all.32000.model",
    "data_dir": None,
    "finetune_steps": paper.FINETUNE_STEPS,
    "eval_every": paper.EVAL_EVERY,
    "seeds": 1,
}
MODELS = {"MQA-XXL": 1, "GQA-8-XXL": 8}


def get_sweep(params):
    runs = []
    starts = [("MHA-XXL", None, params["t5_xxl"], ())]
    for model, kv in MODELS.items():
        key = model.lower().replace("-", "_")
        for alpha in paper.FIG5_ALPHAS:
            name = f"{'convert' if alpha == 0 else 'uptrain'}_{key}_a{alpha:g}"
            tags = {"model": model, "alpha": alpha}
            if alpha == 0:
                runs.append(R.convert(name, params["t5_xxl"], kv, tags=tags))
            else:
                runs.append(R.uptrain(name, params["t5_xxl"], kv, params, alpha=alpha, tags=tags))
            starts.append((model, alpha, f"{{run:{name}}}/model", (name,)))
    for model, alpha, init, deps in starts:
        key = model.lower().replace("-", "_") + ("" if alpha is None else f"_a{alpha:g}")
        for task, *_ in paper.TABLE1_TASKS:
            tags = {"model": model} | ({} if alpha is None else {"alpha": alpha})
            for seed in range(params["seeds"]):
                runs += R.finetune_and_evaluate(key, init, task, params, seed=seed, deps=deps, tags=tags)
    info = {"tasks": [list(t) for t in paper.TABLE1_TASKS], "alphas": list(paper.FIG5_ALPHAS),
            "models": list(MODELS), "reference": "MHA-XXL"}  # fmt: skip
    return Sweep("fig5_alpha", tuple(runs), info)
