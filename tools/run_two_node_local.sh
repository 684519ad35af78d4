#!/usr/bin/env bash
# Two-node run on one host: two torchrun agents (node 0 and node 1, 2 ranks each) meeting
# at a c10d rendezvous on 127.0.0.1; trains table_row_wise + table_column_wise tables and
# checks them against single-process training (tools/two_node_check.py).
#   bash tools/run_two_node_local.sh            # PORT: a free one; PYTHON: .venv/bin/python (tools/setup.sh's)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$PWD/.venv/bin/python}
PORT=${PORT:-$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export OMP_NUM_THREADS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOGDIR=$(mktemp -d)
pids=()
# however the script ends (a failure, Ctrl-C, kill; a signal exits through the EXIT trap): the
# agents still running are stopped (they pass SIGTERM on to their ranks) and the logs removed
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true; rm -rf "$LOGDIR"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for node in 0 1; do
  "$PY" -m torch.distributed.run --nnodes 2 --nproc-per-node 2 \
      --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$PORT" --rdzv-id neo-two-node-$PORT \
      --max-restarts 0 --log-dir "$LOGDIR/torchrun$node" tools/two_node_check.py >"$LOGDIR/node$node.log" 2>&1 &
  pids+=($!)
done
status=0
for i in 0 1; do
  wait "${pids[$i]}" || status=$?
done
cat "$LOGDIR"/node0.log "$LOGDIR"/node1.log | grep -v -e "^WARNING" -e "^\*\*\*" -e "OMP_NUM_THREADS" || true
if [ "$status" -ne 0 ]; then echo "two-node run FAILED (status $status)" >&2; fi
exit "$status"
