#!/usr/bin/env bash
# Two-node run on one host: two torchrun agents (node 0 and node 1, 2 ranks each) meeting
# at a c10d rendezvous on 127.0.0.1; trains table_row_wise + table_column_wise tables and
# checks them against single-process training (tools/two_node_check.py).
#   bash tools/run_two_node_local.sh            # PORT: the store's (default: one the OS gives); PYTHON: .venv/bin/python
# The rendezvous store is served by a helper process of this script that binds its port itself
# and lives until the end; both agents join it as clients (is_host=false). Picking a free port
# first and leaving an agent to bind it later raced with other processes: on a busy host another
# process took the port in between, both agents joined that process's store as clients (torch's
# c10d backend falls back to a client when it cannot bind) and failed when it closed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$PWD/.venv/bin/python}
export OMP_NUM_THREADS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOGDIR=$(mktemp -d)
pids=()
store_pid=
# however the script ends (a failure, Ctrl-C, kill; a signal exits through the EXIT trap): the
# agents still running are stopped (they pass SIGTERM on to their ranks), then the store, and
# the logs removed
cleanup() {
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  if [ -n "$store_pid" ]; then kill -TERM "$store_pid" 2>/dev/null || true; fi
  rm -rf "$LOGDIR"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"$PY" - "$LOGDIR/store_port" "${PORT:-0}" >"$LOGDIR/store.log" 2>&1 <<'PYEOF' &
import datetime, os, sys, time
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[2]), is_master=True, wait_for_workers=False,
                 timeout=datetime.timedelta(seconds=300))
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(store.port))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])    # the port, once the store listens on it
while True:
    time.sleep(60)
PYEOF
store_pid=$!
for _ in $(seq 600); do                          # up to 60 s for the store to listen
  [ -s "$LOGDIR/store_port" ] && break
  kill -0 "$store_pid" 2>/dev/null || { cat "$LOGDIR/store.log" >&2; echo "two-node run FAILED: the rendezvous store did not start" >&2; exit 1; }
  sleep 0.1
done
[ -s "$LOGDIR/store_port" ] || { echo "two-node run FAILED: the rendezvous store did not start within 60 s" >&2; exit 1; }
PORT=$(cat "$LOGDIR/store_port")
for node in 0 1; do
  "$PY" -m torch.distributed.run --nnodes 2 --nproc-per-node 2 \
      --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$PORT" --rdzv-conf is_host=false --rdzv-id neo-two-node-$PORT \
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
