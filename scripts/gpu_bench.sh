#!/usr/bin/env bash
# Decoding and training benchmarks on one GPU, in one go, each stage under its own time limit:
#
#   OUT=results/h200 scripts/gpu_bench.sh        # from the repository root
#
#   1. env           versions, the GPU (nvidia-smi), a tiny decode bench as a smoke test
#   2. decode_small  `bench decode` on T5.1.1-small, bfloat16, batch 8, input 512, 64 new tokens:
#                    all four tables, HuggingFace `generate` on the same GPU at the same dtype
#   3. train         `bench train` on small, base, large: bfloat16 activations, batch 32, 512 / 114
#   4. decode_xxl    `bench decode` on T5.1.1-XXL (random weights), bfloat16, batch 8, input 2048,
#                    512 new tokens (the paper's Figure 6 lengths), MHA / GQA-8 / MQA, no HF
#
# Every stage writes STAGE.md (the tables) and STAGE.json under $OUT; progress goes to
# $OUT/log.txt. A stage that fails or runs out of time is reported and the next one runs.
# Python packages missing on the machine can be given as wheels in .whl/ (installed with
# --no-deps into /tmp/site, put first on PYTHONPATH). GPU_BENCH_QUICK=1 shrinks every stage to
# the tiny preset (a check of this script on a CPU).
set -u
OUT=${OUT:-gpu_bench_out}
mkdir -p "$OUT"
log="$OUT/log.txt"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
  rm -rf /tmp/site  # a package left there by an earlier run would shadow the machine's own
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >>"$log" 2>&1 || { echo "wheel install failed (see $log)"; exit 1; }
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi

if [[ "${GPU_BENCH_QUICK:-0}" == 1 ]]; then
  small=(--preset tiny --batch 2 --input-len 32 --new-tokens 8 --lengths 8 --runs 2)
  train=(--presets tiny --batch 2 --input-len 32 --target-len 8 --steps 2)
  xxl=(--preset tiny --batch 2 --input-len 64 --new-tokens 16 --lengths 16 --runs 2 --no-hf)
  limits=(60 120 120 120)
else
  small=(--preset small --batch 8 --input-len 512 --new-tokens 64)
  train=(--presets small,base,large --batch 32 --input-len 512 --target-len 114 --steps 5)
  xxl=(--preset xxl --batch 8 --input-len 2048 --new-tokens 512 --kv-heads 64,8,1 --lengths 512
    --uncached-budget 0 --runs 3 --no-hf)
  limits=(60 150 150 230)
fi

stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  echo "== $name (limit ${limit} s): $*" | tee -a "$log"
  timeout "$limit" "$@" >"$OUT/$name.md" 2>>"$log"
  rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$log"
  tail -n 40 "$OUT/$name.md"
}

env_report() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  python3 - <<'EOF'
import jax, flax, optax, numpy
print("python", __import__("sys").version.split()[0], "jax", jax.__version__, "flax", flax.__version__,
      "optax", optax.__version__, "numpy", numpy.__version__)
print("backend", jax.default_backend(), jax.devices())
try:
    import torch, transformers
    print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)
except ImportError as e:
    print("no torch/transformers:", e)
EOF
  python3 -m gqa_jax bench decode --preset tiny --batch 2 --input-len 16 --new-tokens 4 --lengths 4 \
    --runs 1 --no-hf >/dev/null
}

export -f env_report
stage env "${limits[0]}" bash -c env_report
stage decode_small "${limits[1]}" env XLA_PYTHON_CLIENT_PREALLOCATE=false \
  python3 -m gqa_jax bench decode "${small[@]}" --dtype bfloat16 --json "$OUT/decode_small.json"
stage train "${limits[2]}" python3 -m gqa_jax bench train "${train[@]}" --dtype bfloat16 \
  --json "$OUT/train.json"
stage decode_xxl "${limits[3]}" python3 -m gqa_jax bench decode "${xxl[@]}" --dtype bfloat16 \
  --json "$OUT/decode_xxl.json"
