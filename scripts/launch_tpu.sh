#!/usr/bin/env bash
# Run one command on every worker of a Cloud TPU VM pod slice, as one multi-host JAX job.
#
#   scripts/launch_tpu.sh --tpu NAME --zone ZONE [--project P] [--repo DIR] [--dry-run] -- COMMAND...
#
# Every worker runs `cd DIR && GQA_JAX_DISTRIBUTED=auto COMMAND` at the same time
# (`gcloud compute tpus tpu-vm ssh --worker=all`); gqa_jax then calls
# jax.distributed.initialize(), which finds the other workers itself. DIR (default ~/gqa_jax)
# must hold this repository on every worker (the first example below puts it there), and
# --workdir must be reachable by all workers: gs://bucket/run, or a filesystem
# mounted on every worker.
# --dry-run prints the commands instead of running them.
#
# Examples:
#   scripts/launch_tpu.sh --tpu my-v4-32 --zone us-central2-b --repo '~' -- \
#     'git clone YOUR_GQA_JAX_REMOTE gqa_jax && pip install -e ./gqa_jax "jax[tpu]"'
#   scripts/launch_tpu.sh --tpu my-v4-32 --zone us-central2-b -- \
#     python -m gqa_jax train --config configs/uptrain.py --workdir gs://MY_BUCKET/runs/gqa8 --config.mesh=2x8
set -euo pipefail

usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

tpu="" zone="" project="" repo="~/gqa_jax" dry_run=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tpu) tpu="${2:?--tpu needs a TPU VM name}"; shift 2 ;;
    --zone) zone="${2:?--zone needs a zone}"; shift 2 ;;
    --project) project="${2:?--project needs a project id}"; shift 2 ;;
    --repo) repo="${2:?--repo needs a directory}"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) echo "launch_tpu.sh: unknown argument '$1' (the command goes after --)" >&2; exit 2 ;;
  esac
done
[[ -n "$tpu" ]] || { echo "launch_tpu.sh: --tpu NAME is required (the TPU VM pod slice)" >&2; exit 2; }
[[ -n "$zone" ]] || { echo "launch_tpu.sh: --zone ZONE is required (e.g. us-central2-b)" >&2; exit 2; }
[[ $# -gt 0 ]] || { echo "launch_tpu.sh: no command given after --" >&2; exit 2; }

# One string for the remote shell: the command's words, each quoted.
remote=""
for word in "$@"; do remote+=" $(printf '%q' "$word")"; done
if [[ $# -eq 1 ]]; then remote=" $1"; fi  # a single argument is a shell snippet: run it as written
remote="cd $repo && export GQA_JAX_DISTRIBUTED=auto &&$remote"

cmd=(gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command "$remote")
[[ -n "$project" ]] && cmd+=(--project "$project")

if [[ $dry_run -eq 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
command -v gcloud >/dev/null || { echo "launch_tpu.sh: gcloud not found (install the Google Cloud CLI)" >&2; exit 2; }
exec "${cmd[@]}"
