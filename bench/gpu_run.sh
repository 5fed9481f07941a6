#!/usr/bin/env bash
# One device call: the device environment (bench/gpu_env.sh: the carried wheels, NVLink multicast off, the Triton
# cache restored from .carry_triton), then each argument as a command under its own time limit, its whole output in
# $OUT/cmdN.log and its last lines printed. `tpserve` runs this tree's CLI (python3 -m tpserve.cli).
#
#   run, carry [".whl", ".carry_triton"]:
#     bash bench/gpu_run.sh "tpserve bench model --device cuda --layers KKKM --prefill 4096 --batch 1 32 64" \
#                           "python3 bench/gpu_check_tiny.py --graphs"
#   TIMEOUT (seconds a command, default 500), TAIL (lines printed a command, default 40),
#   SAVE_TRITON=1 (write $OUT/triton_cache.tar.gz at the end, for the next call's .carry_triton).
set -uo pipefail
source bench/gpu_env.sh
tpserve() { python3 -m tpserve.cli "$@"; }
export -f tpserve
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
i=0
for cmd in "$@"; do
  i=$((i + 1))
  step "$i: $cmd"
  timeout "${TIMEOUT:-500}" bash -c "$cmd" > "$OUT/cmd$i.log" 2>&1
  rc=$?
  tail -n "${TAIL:-40}" "$OUT/cmd$i.log"
  echo "rc=$rc"
done
if [ "${SAVE_TRITON:-0}" = 1 ]; then save_triton_cache; fi
step "done"
