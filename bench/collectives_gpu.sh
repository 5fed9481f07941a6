#!/usr/bin/env bash
# Collectives on GPUs: correctness of every path first, then timings, then tuned tables.
#
#   device tool, kind nvidia-h200-x2, timeout_s=600:   bash bench/collectives_gpu.sh
#   only some steps:   bash bench/collectives_gpu.sh check,eager   (steps: check, eager, graph)
#   (any N-GPU host: WORLD=N bash bench/collectives_gpu.sh; files go to $OUT, else ./collectives_out)
#
# Needs only what the lent CUDA image has: torch (CUDA build, symmetric memory), triton, numpy,
# tqdm, matplotlib. No wheels to carry: tpserve runs from ./src (PYTHONPATH), through
# `python -m tpserve.tools.bench.collectives`, which imports none of the server dependencies.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1).
#
# Steps (each under its own time limit; a failed step does not stop the next):
#   1. environment: GPUs, topology, driver, versions, peer access
#   2. check: every backend of all_reduce / all_gather / reduce_scatter in fp32, bf16, fp16,
#      contiguous + strided, odd sizes, larger than the workspace, against a plain sum
#      (workspace paths bitwise), results identical on every rank, CUDA-graph replays
#   3. timings, eager (CUDA events, median), bf16, 1 KiB .. 256 MiB
#   4. timings inside CUDA graph replays, bf16, 1 KiB .. 64 MiB
#   5. tuned size tables built from 3 and 4 (no extra measuring)
# Files in $OUT: log.txt (everything), eager.json, graph.json, eager.png, graph.png,
# tuned_eager.json, tuned_graph.json. The short summary is printed last.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/collectives_out}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
: >"$LOG"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
WORLD=${WORLD:-$($PY -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)}
CLI=("$PY" -m tpserve.tools.bench.collectives)
STATUS=()

step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $* ($(date +%T))" | tee -a "$LOG"
  local t0=$SECONDS
  timeout --kill-after=20 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc after $((SECONDS - t0))s" | tee -a "$LOG"
  STATUS+=("$name rc=$rc ($((SECONDS - t0))s)")
  return $rc
}

{
  echo "--- nvidia-smi"; nvidia-smi 2>&1
  echo "--- topology"; nvidia-smi topo -m 2>&1
  echo "--- env"; env | grep -E '^(NCCL|TORCH|NVSHMEM|CUDA|PYTHONPATH)' | sort
  $PY - <<'PY' 2>&1
import torch, triton, numpy, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "triton", triton.__version__, "numpy", numpy.__version__)
n = torch.cuda.device_count()
print("gpus", n, [torch.cuda.get_device_name(i) for i in range(n)])
print("peer access", [[int(torch.cuda.can_device_access_peer(i, j)) if i != j else 1
                       for j in range(n)] for i in range(n)])
import torch.distributed._symmetric_memory as sm
print("symm_mem ops:", [o for o in dir(torch.ops.symm_mem) if "shot" in o])
print("nccl", torch.cuda.nccl.version())
PY
} >>"$LOG" 2>&1
echo "world=$WORLD  (log: $LOG)"
if [ "$WORLD" -lt 2 ]; then
  echo "need at least 2 GPUs"; tail -30 "$LOG"; exit 1
fi

STEPS=${1:-all}   # all, or a comma list of: check,eager,graph
want() { [ "$STEPS" = all ] || [[ ",$STEPS," == *",$1,"* ]]; }
# limits sum to < 10 minutes (the device tool's per-command limit)
want check && step check 220 "${CLI[@]}" bench --world "$WORLD" --device cuda --check \
  --no-timing --dtypes float32,bfloat16,float16 --timeout 200
want eager && step eager 150 "${CLI[@]}" bench --world "$WORLD" --device cuda \
  --dtypes bfloat16 --sizes 1K:256M --json "$OUT/eager.json" --plot "$OUT/eager.png" --timeout 140
want graph && step graph 150 "${CLI[@]}" bench --world "$WORLD" --device cuda \
  --dtypes bfloat16 --sizes 1K:64M --graph --json "$OUT/graph.json" --plot "$OUT/graph.png" \
  --timeout 140
[ -f "$OUT/eager.json" ] && step tune_eager 20 "${CLI[@]}" tune --world "$WORLD" \
  --device cuda --from-json "$OUT/eager.json" --out "$OUT/tuned_eager.json"
[ -f "$OUT/graph.json" ] && step tune_graph 20 "${CLI[@]}" tune --world "$WORLD" \
  --device cuda --from-json "$OUT/graph.json" --out "$OUT/tuned_graph.json"

echo
echo "################ summary (full log: $LOG)"
printf '%s\n' "${STATUS[@]}"
echo "--- warnings / errors (first 40)"
grep -nE "WARNING|Warning:|unavailable|Error|error:|Traceback|CHECK FAILED|timed out" "$LOG" \
  | grep -v "^.*FutureWarning" | head -40
echo "--- check"
grep -E "^check passed|^CHECK FAILED|^  rank " "$LOG" | head -40
for mode in eager graph; do
  [ -f "$OUT/$mode.json" ] || continue
  echo "--- $mode all_reduce timings (all_gather / reduce_scatter tables: log.txt)"
  $PY - "$OUT/$mode.json" <<'PY'
import json, sys
from tpserve.tools.bench.collectives import print_rows
d = json.load(open(sys.argv[1]))
rows = [r for r in d["rows"] if r["op"] == "all_reduce"]
world = rows[0]["world"] if rows else 0
print_rows(rows, world, d["spec"]["device"] + (" (CUDA graphs)" if d["spec"].get("graph") else ""))
PY
done
