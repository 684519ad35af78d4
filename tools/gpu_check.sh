#!/usr/bin/env bash
# Neo's GPU checks in one command, for a CUDA machine (H100 / H200): every stage runs even when one
# before it failed, each under its own time limit, and a table of stages, exit statuses and times
# is printed last; the script's exit status is 1 where any stage failed.
#
#   bash tools/gpu_check.sh                   # logs and JSON under $OUT (default bench_out/gpu)
#   STAGES="tests triton" bash tools/gpu_check.sh     # only some stages
#
# Stages:
#   env       the GPU (nvidia-smi), Python, torch, Triton, CUDA
#   tests     the Triton backend's tests compiled for the GPU (tests/embedding/test_triton_backend.py,
#             the cache's Triton data path): every optimizer and weight type against the reference
#   triton    tools/gpu_check_triton.py --dims 64,128,256 --profile (TRITON_ARGS replaces the
#             flags; add --sweep for every launch configuration): realistic shapes against the CPU
#             reference, the 2^31-element table, the fused kernels' PTX, the kernels' timings as a
#             share of a device copy at D 64, 128 and 256, and the module's time split (profiler)
#   bench     tools/bench_embedding.py --cuda-only at batch 4096 and 32768 (Triton against
#             nn.EmbeddingBag + torch.optim.Adagrad), JSON in $OUT
#   train     the README's main job (configs/main_job.yaml) on one GPU: train.device=cuda, the Triton
#             backend, the same global batch (2048) as the two CPU ranks; its final JSON line in $OUT
#   cached    configs/cached_tables.yaml on one GPU: the software-managed cache on the device, the
#             tables in pinned host memory
#   profile   tools/profile_train.py on the main job's config on one GPU, 300 steps: device
#             synchronisations, kernel launches and host reads a step (the step is host-bound there)
#
# Files in $OUT: gpu_check.log (everything), bench_embedding_gpu_b4096.json,
# bench_embedding_gpu_b32768.json, train_gpu.json, cached_gpu.json, profile_train.txt,
# profile_train.json.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/bench_out/gpu}"
STAGES="${STAGES:-env tests triton bench train cached profile}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
SUMMARY=()
FAILED=0
RUNS=$(mktemp -d -t neo-gpu-XXXXXX)

stage() {   # stage NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    [[ " $STAGES " == *" $name "* ]] || return 0
    echo
    echo "=== $name (limit ${limit} s): $*"
    local t0 rc
    t0=$(date +%s)
    timeout --kill-after 10 "$limit" bash -c '"$@"' _ "$@"     # bash -c: a stage may be a function
    rc=$?
    [ "$rc" -eq 0 ] || FAILED=1
    echo "=== $name: exit status $rc, $(( $(date +%s) - t0 )) s"
    SUMMARY+=("$(printf '%-8s exit %3d  %4d s' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
}

env_report() {
    date -u '+%Y-%m-%d %H:%M UTC'
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
        --format=csv || true
    "$PY" - <<'EOF'
import platform, torch, triton
p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
print(f"python {platform.python_version()}  torch {torch.__version__} (CUDA {torch.version.cuda})  triton {triton.__version__}")
if p is not None:
    print(f"GPU {p.name}: {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs, capability {p.major}.{p.minor}")
try:
    from neo.cpp import cpu_isa_info
    i = cpu_isa_info()
    print(f"CPU {i['cpu_model']} ({i['cpu_id']}); Neo CPU kernels: {i['neo_cpu_isa'] or 'not built (plain torch paths)'}")
except Exception as e:
    print(f"neo does not import: {type(e).__name__}: {e}")
EOF
}

train_on_gpu() {   # train_on_gpu CONFIG JSON_OUT [overrides...]: one rank, device cuda, the final JSON line kept
    local cfg=$1 json=$2
    shift 2
    "$PY" -m neo.train "$cfg" train.device=cuda train.embedding_backend=triton train.progress=false \
        train.run_dir="$RUNS/$(basename "$cfg" .yaml)" train.checkpoint_dir="$RUNS/$(basename "$cfg" .yaml)/ck" "$@" \
        | tee "$RUNS/train.out"
    local rc=${PIPESTATUS[0]}
    grep '^{' "$RUNS/train.out" | tail -1 > "$json"
    return "$rc"
}

export PY RUNS
export -f env_report train_on_gpu

stage env 30 env_report
stage tests 110 "$PY" -m pytest -q -p no:randomly tests/embedding/test_triton_backend.py \
    tests/embedding/test_cache.py::test_triton_data_path_matches_torch
stage triton 170 "$PY" tools/gpu_check_triton.py ${TRITON_ARGS:---dims 64,128,256 --profile}
stage bench 75 bash -c "'$PY' tools/bench_embedding.py --cuda-only --iters 50 --json '$OUT/bench_embedding_gpu_b4096.json' &&
    '$PY' tools/bench_embedding.py --cuda-only --iters 50 --batch 32768 --json '$OUT/bench_embedding_gpu_b32768.json'"
stage train 70 train_on_gpu configs/main_job.yaml "$OUT/train_gpu.json" train.batch_size=2048
stage cached 50 train_on_gpu configs/cached_tables.yaml "$OUT/cached_gpu.json"
stage profile 90 "$PY" tools/profile_train.py configs/main_job.yaml train.device=cuda train.embedding_backend=triton \
    train.batch_size=2048 train.steps=300 --out "$OUT/profile_train.txt" --json "$OUT/profile_train.json"

rm -rf "$RUNS"
echo
echo "== gpu_check summary ($(date -u '+%H:%M UTC'))"
printf '%s\n' "${SUMMARY[@]}"
exit "$FAILED"
