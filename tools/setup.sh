#!/usr/bin/env bash
# Set up Neo in ./.venv: pinned dependencies, then build the C++ extension in place.
#   bash tools/setup.sh          # Neo and its core dependencies
#   bash tools/setup.sh --dev    # plus pytest and the peers (FBGEMM CPU, TorchRec) for tests/benchmarks
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip_q() {  # quiet pip that still fails loudly
  local out
  if ! out=$(python -m pip install -q --disable-pip-version-check "$@" 2>&1); then echo "$out" >&2; return 1; fi
  echo "$out" | grep -v -e '^WARNING: Location' -e '^$' || true
}
pip_q -r requirements.txt
if [ "${1:-}" = "--dev" ]; then
  pip_q -r requirements-dev.txt
  pip_q --no-deps torchrec==1.8.0
fi
python -c "import torch; assert torch.__version__.startswith('2.13.0') or torch.cuda.is_available(), torch.__version__"
pip_q --no-build-isolation --no-deps -e .
python -c "import torch, neo._C" || { echo "building neo._C failed" >&2; exit 1; }
