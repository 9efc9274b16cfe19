"""Figure 6: XXL decode time per sample against the number of groups (K/V heads) 1, 4, 8, 16, 32
and 64 (64 = MHA), at input 2048 / output 512, on random weights: no data, no training; and,
beyond the paper, the same curve with an int8 KV cache.

    python -m gqa_jax sweep experiments/fig6_groups.py --root runs/fig6
    python -m gqa_jax report experiments/fig6_groups.py --root runs/fig6

Each run times greedy decoding of 512 tokens (EOS disabled) after 2048 input tokens, compile
excluded, median of 5 runs, the largest batch that fits up to 32 per device (``--set batch=8``
for a given one). ``--set caches=float,int8`` (the default) gives one line per KV cache: ``float``
keeps the model's dtype (bfloat16, the paper's), ``int8`` stores one byte and a float32 scale per
token and K/V head (``gqa_jax.kv_quant``; also ``float8_e4m3fn``, ``float8_e5m2``); ``--set
caches=float`` is the paper's figure alone. A quantized cache takes less memory, so ``auto`` may
choose a larger batch for it. Expected runtime: minutes per run on one large GPU; not runnable on
a 2-core CPU at this size. The paper's finding: from 1 to 8 groups the time grows little, then it
climbs toward MHA's (it plots the curve; it prints no numbers).

Predicted instead of timed, on this CPU (libtpu: ``pip install -r requirements-tpu.txt``):

    python -m gqa_jax sweep experiments/fig6_groups.py --root runs/fig6 --set predict=v4:2x2x2 --jobs 2
    python -m gqa_jax report experiments/fig6_groups.py --root runs/fig6 --set predict=v4:2x2x2

``predict`` names a TPU slice (``v4:2x2x2``: the paper's 8 TPUv4 chips); each run compiles the
prefill and one decode step for it with the TPU compiler and predicts the time per sample per chip
by a roofline (``time --predict``, docs/experiments.md), the mesh and batch tuned per model
(``--set mesh=1x8`` for one mesh: 8-way model parallelism, the fastest in every auto run measured);
the runs are named ``..._predicted_v4-2x2x2``, beside measured ones. 3 to 10 minutes per run on 2
cores at ``mesh=1x8``, two at a time, the longest where the batch is searched (32 and 64 groups).
The measured predictions (both caches, with the read-once floors): docs/results/predicted-tpu.md;
under the paper's decode (``--set decode=paper``, an instrument for its timings):
docs/results/paper-decode.md.
"""

from gqa_jax.experiments import paper
from gqa_jax.experiments import runs as R
from gqa_jax.experiments.sweep import Sweep

PARAMS = {
    "preset": "xxl",
    "batch": "auto",
    "dtype": "bfloat16",
    "caches": "float,int8",
    "predict": None,
    "mesh": "auto",
    "decode": "ours",  # or the paper's decode (an instrument for its timings, docs/decoding.md)
}


def get_sweep(params):
    s, t = paper.FIG6_LENGTHS
    caches = paper.fig6_caches(params["caches"])
    runs = []
    for cache in caches:
        suffix, options, tags = paper.fig6_cache_run(cache)
        for k in paper.FIG6_GROUPS:
            runs.append(
                R.time(
                    f"time_xxl_k{k}{suffix}",
                    params["preset"],
                    k,
                    s,
                    t,
                    batch=params["batch"],
                    dtype=params["dtype"],
                    tags={"groups": k, **tags},
                    predict=params["predict"],
                    mesh=params["mesh"],
                    decode=params["decode"],
                    **options,
                )
            )
    info = {"groups": list(paper.FIG6_GROUPS), "reference_groups": 64, "input_len": s, "output_len": t,
            "caches": list(caches)}  # fmt: skip
    return Sweep("fig6_groups", tuple(runs), info)
