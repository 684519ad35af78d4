#!/usr/bin/env bash
# The README's main job: DLRM on synthetic data, 2 processes on this machine, every sharding type.
#
#   bash tools/main_job.sh [key=value ...]      # overrides go to the config, e.g. train.epochs=2
#
# Prints the sharding plan, a progress bar and one final line of JSON; exits 1 if the final AUC
# is not within 0.01 of the synthetic data's best achievable AUC.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# torchrun's log folders (empty unless it redirects output) in a folder removed at the end: without
# --log-dir it leaves a torchelastic_* folder in the temporary directory at every launch
LOGDIR=$(mktemp -d -t neo-torchrun-XXXXXX)
trap 'rm -rf "$LOGDIR"' EXIT
start=$(date +%s)
set +e
"$PY" -m torch.distributed.run --standalone --nproc-per-node 2 --log-dir "$LOGDIR" -m neo.train configs/main_job.yaml "$@"
status=$?
set -e
echo "main job: exit status $status, wall time $(( $(date +%s) - start )) s" >&2
exit $status
