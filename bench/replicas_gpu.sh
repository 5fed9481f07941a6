#!/usr/bin/env bash
# Replicas sharing one GPU: `serve -dp DP` of CONFIG (random NVFP4 weights, snapshot on) on GPU 0 behind the router,
# the multi-turn trace through it, with RR=1 the trace again through a round_robin front router over the same
# replicas (`serve --worker-urls`), and with ROLL=1 a rolling restart under load (bench/rolling_restart.py). DP=1
# serves one engine with the same memory share, the single-replica baseline of the trace.
#   bash bench/replicas_gpu.sh CONFIG   (env: DP=2, POLICY=cache_aware, ROLL=0, RR=0, PORT=8011; the trace: CONVS=16,
#                                        TURNS=6, WORDS=510 a message, TOKENS=100 an answer; TRACE=0 skips the trace
#                                        through the fleet's own router; DEVICE=cpu QUANT=none:
#                                        the same on the CPU, a check of the script)
# Needs the router on the device (bench/gpu_env.sh); writes the serve log, the trace's JSON and roll.json to $OUT.
set -uo pipefail
C=$1; DP=${DP:-2}; POLICY=${POLICY:-cache_aware}; PORT=${PORT:-8011}; U=http://127.0.0.1:$PORT
A=http://127.0.0.1:$((PORT + 1))  # serve's control port (admin routes)
OUT=${OUT:-/tmp/tpserve-out}; mkdir -p "$OUT"; TAG=$POLICY-$DP; LOG=$OUT/serve-$TAG.log
gpus=0; for _ in $(seq 2 "$DP"); do gpus=$gpus,0; done
share=$(python3 -c "print(int(90 / max($DP, 2)) / 100)")  # DP=1: one replica's share
fleet=(); [ "$DP" -gt 1 ] && fleet=(-dp "$DP" --router-policy "$POLICY")
t0=$(date +%s)
CUDA_VISIBLE_DEVICES=$gpus python3 -m tpserve.cli serve "$C" --load-format dummy --snapshot --quantization "${QUANT:-nvfp4}" \
  --gpu-memory-utilization "$share" --device "${DEVICE:-cuda}" --port "$PORT" "${fleet[@]}" > "$LOG" 2>&1 &
pid=$!
SERVE_PID=$pid URL=$U ADMIN=$A DP=$DP python3 - <<'EOF' || { echo "not serving:"; tail -20 "$LOG"; kill $pid; exit 1; }
import os, sys, time, httpx
pid, url, admin, dp = int(os.environ["SERVE_PID"]), os.environ["URL"], os.environ["ADMIN"], int(os.environ["DP"])
for _ in range(900):
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(1)  # serve exited
    try:
        if dp == 1 and httpx.get(url + "/health").status_code == 200:
            sys.exit(0)
        reps = httpx.get(admin + "/admin/replicas").json()["replicas"] if dp > 1 else []
        if reps and all(r["state"] == "serving" for r in reps):
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(1)
sys.exit(1)
EOF
echo "serving $(( $(date +%s) - t0 )) s after the start ($DP x $share of the GPU)"
grep -E 'ready in|restored|in rotation|memory plan' "$LOG" | cut -c1-220 | head -12
trace() {  # URL JSON
  python3 -m tpserve.cli bench serve --url "$1" --dataset multiturn --num-requests "${CONVS:-16}" --concurrency "${CONVS:-16}" \
    --turns "${TURNS:-6}" --prompt-len "${WORDS:-510}" --turn-len "${WORDS:-510}" --max-tokens "${TOKENS:-100}" --json "$2" 2>&1 | grep -v httpx | tail -14
}
[ "${TRACE:-1}" = 1 ] && trace "$U" "$OUT/trace-$TAG.json"
if [ "${RR:-0}" = 1 ] && [ "$DP" -gt 1 ]; then  # the same replicas behind a round_robin front router (no boot)
  urls=$(python3 -c "import httpx; print(' '.join(r['url'] for r in httpx.get('$A/admin/replicas').json()['replicas']))")
  python3 -m tpserve.cli serve --worker-urls $urls --router-policy round_robin --port $((PORT + 10)) --admin-port $((PORT + 11)) \
    > "$OUT/front-rr.log" 2>&1 &
  front=$!
  for _ in $(seq 120); do
    curl -sf -o /dev/null -H 'Content-Type: application/json' -d '{"prompt": "front", "max_tokens": 1}' \
      "http://127.0.0.1:$((PORT + 10))/v1/completions" && break
    sleep 1
  done
  trace "http://127.0.0.1:$((PORT + 10))" "$OUT/trace-round_robin-$DP.json"
  kill "$front"; wait "$front"
fi
if [ "${ROLL:-0}" = 1 ] && [ "$DP" -gt 1 ]; then
  python3 bench/rolling_restart.py --url "$U" --concurrency 8 --json "$OUT/roll.json"
  grep -E 'restarted|restored|stopped' "$LOG" | cut -c1-200
fi
kill "$pid"; wait "$pid"
