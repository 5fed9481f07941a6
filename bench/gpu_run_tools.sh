#!/usr/bin/env bash
# One device call on nvidia-h200: the operator tools against the built-in tiny model on CUDA
# (two servers: --max-num-batched-tokens 256 and 16384), with the NVML GPU guard live.
# NOT RUN YET: written on the optools branch, whose tree the device machine does not see; run it after the merge.
# Needs the wheels of bench/gpu_env.sh plus the client's: httpx==0.28.1 httpcore==1.0.9 h11==0.16.0
# anyio==4.11.0 sniffio==1.3.1 certifi idna nvidia-ml-py==13.615.71 tqdm==4.67.1 (same pip download line).
# Usage (from the repo root): bash bench/gpu_run_tools.sh
set -uo pipefail
source bench/gpu_env.sh
T="python3 -m tpserve.cli"
step "machine"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,temperature.gpu --format=csv,noheader
step "two tiny servers on CUDA (chunk 256 and 16384)"
$T serve --device cuda --port 18201 --max-num-batched-tokens 256 > "$OUT/serve_a.log" 2>&1 &
A=$!
$T serve --device cuda --port 18202 --max-num-batched-tokens 16384 > "$OUT/serve_b.log" 2>&1 &
B=$!
for i in $(seq 120); do curl -sf localhost:18201/health >/dev/null && curl -sf localhost:18202/health >/dev/null && break; sleep 1; done
UA=http://127.0.0.1:18201; UB=http://127.0.0.1:18202
step "smoke (random tiny model: the answer checks fail, the protocol checks must pass)"
timeout 120 $T smoke --url $UA --max-tokens 64 --json "$OUT/smoke.json" 2>/dev/null
step "bench serve: sweep 1,8,32, 64 requests each, 128 tokens, cold prefill, GPU guard"
timeout 240 $T bench serve --url $UA --concurrency 1,8,32 --num-requests 64 --max-tokens 128 --dataset random \
  --prompt-len 512 --cold-prefill --json "$OUT/bench_serve.json" 2>/dev/null
step "bench prefill-block: 16k-token prompt, chunk 256 vs 16384"
timeout 240 $T bench prefill-block --url $UA --url2 $UB --long-tokens 16384 --streams 4 --short 4 \
  --json "$OUT/prefill_block.json" 2>/dev/null
step "quality nll and divergence: chunk 256 vs 16384"
timeout 120 $T quality nll --url $UA --url2 $UB --json "$OUT/nll.json" 2>/dev/null | tail -3
timeout 120 $T quality divergence --url $UA --url2 $UB --n 8 --max-tokens 64 2>/dev/null | tail -1
kill -TERM $A $B; wait $A $B
step "done"
