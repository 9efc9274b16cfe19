"""Figure 6: XXL decode time per sample against the number of groups (K/V heads) 1, 4, 8, 16, 32
and 64 (64 = MHA), at input 2048 / output 512, on random weights: no data, no training.

    python -m gqa_jax sweep experiments/fig6_groups.py --root runs/fig6
    python -m gqa_jax report experiments/fig6_groups.py --root runs/fig6

Each run times greedy decoding of 512 tokens (EOS disabled) after 2048 input tokens, compile
excluded, median of 5 runs, the largest batch that fits up to 32 per device (``--set batch=8``
for a given one). Expected runtime: minutes per run on one large GPU; not runnable on a 2-core CPU
at this size. The paper's finding: from 1 to 8 groups the time grows little, then it climbs
toward MHA's (it plots the curve; it prints no numbers).
"""

from gqa_jax.experiments import paper
from gqa_jax.experiments import runs as R
from gqa_jax.experiments.sweep import Sweep

PARAMS = {"preset": "xxl", "batch": "auto", "dtype": "bfloat16"}


def get_sweep(params):
    s, t = paper.FIG6_LENGTHS
    runs = tuple(
        R.time(
            f"time_xxl_k{k}",
            params["preset"],
            k,
            s,
            t,
            batch=params["batch"],
            dtype=params["dtype"],
            tags={"groups": k},
        )  # fmt: skip
        for k in paper.FIG6_GROUPS
    )
    info = {"groups": list(paper.FIG6_GROUPS), "reference_groups": 64, "input_len": s, "output_len": t}
    return Sweep("fig6_groups", runs, info)
