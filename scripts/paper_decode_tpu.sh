#!/usr/bin/env bash
# Table 1 and Fig. 6 under the paper's decode (T5X's, an instrument for its timings), and the ablation
# of its switches, predicted for 8 TPUv4 chips by libtpu's compiler on this host: the runs behind
# docs/results/paper-decode.md, one compile at a time (each XXL run takes minutes), resumable (done
# runs are skipped). Needs libtpu (pip install -r requirements-tpu.txt).
#
#   scripts/paper_decode_tpu.sh [ROOT]          # ROOT: default runs/paper-decode
#   scripts/paper_decode_tpu.sh --dry-run [ROOT]  # print the runs instead
#
# Then the reports: python -m gqa_jax report experiments/table1.py --root ROOT/table1
#   --set predict=v4:2x2x2 --set mesh=1x8 --set decode=D (one per decode below), and the same for
#   experiments/fig6_groups.py with --root ROOT/fig6 --set decode=paper --set caches=float.
set -euo pipefail

dry=()
if [[ "${1:-}" == "--dry-run" ]]; then dry=(--dry-run); shift; fi
root="${1:-runs/paper-decode}"
tpu=(--set predict=v4:2x2x2 --set mesh=1x8)

table1() {  # table1 DECODE ONLY: the sweep's time runs matching ONLY, under DECODE
  nice -n 19 python -m gqa_jax sweep experiments/table1.py --root "$root/table1" "${tpu[@]}" \
    --set decode="$1" --only "$2" --jobs 1 "${dry[@]}"
}

table1 paper "time_*"                      # Table 1 under the paper's decode, its four models
table1 ours "time_*_2048_512_*"            # ours again at 2048 / 512: the default decode unchanged
# Fig. 6 at 2048 / 512 under the paper's decode: the groups Table 1's runs do not have (1, 8 and 64 are
# Table 1's MQA, GQA-8 and MHA runs at 2048 / 512, the same programs)
for k in 4 16 32; do
  nice -n 19 python -m gqa_jax sweep experiments/fig6_groups.py --root "$root/fig6" "${tpu[@]}" \
    --set decode=paper --set caches=float --only "time_xxl_k${k}_*" --jobs 1 "${dry[@]}"
done
# the ablation, on the XXL models: each switch of the paper's decode alone, and its cache write (b)
for decode in cross_recompute one_hot_write+t5x_layout one_hot_write t5x_layout; do
  table1 "$decode" "time_*_xxl_*"
done
