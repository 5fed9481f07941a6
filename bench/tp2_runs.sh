#!/usr/bin/env bash
# Runs for two GPUs of one host (nvidia-h200-x2 or nvidia-h100-x2), one device call per part (each under 600 s).
# The commands are checked on the CPU at tiny widths (`--size tiny --device cpu`, the 45-layer schedule included);
# on two GPUs none has run yet. A fresh machine compiles Triton kernels for minutes (the TP=1 KKKM command took
# over 220 s there and 25 s with the cache warm), so a part may need a second call after the first one compiled.
#
#   run, kind nvidia-h200-x2, carry [".whl", ".carry_triton"]:   bash bench/tp2_runs.sh step
#   then ... collectives, ... model, ... boot
#
# step         1. tiny checkpoints: greedy tokens TP=1 / TP=2 (NCCL, with and without SP) against CPU float32, then
#                 decode CUDA graphs against eager (bench/gpu_check_tiny.py --tp, --graphs);
#              2. real-width KKKM, graphs on, prefill 4096 and decode batch 1 / 32 / 64 at TP=1 (GPU 0) and TP=2,
#                 in this one call (goal: TP=2 batch-1 step <= 0.6x TP=1); then TP=2 batch 1 with --pdl off
#                 (PDL next to the collectives is untested on two GPUs).
# collectives  1. bench/collectives_gpu.sh (every backend checked against a plain sum, then timed eager and inside
#                 graphs against NCCL, 1 KiB .. 256 MiB, and the tuned size tables);
#              2. prefill 16k at TP=2 with SP and the workspace collectives against NCCL only (A/B in one call), and
#                 decode with fused collectives against unfused.
# model        the whole GLM-5.3-Flash at TP=2: 45 layers (KKKM x 11 + K, dense MLP in the first 3), NVFP4 experts,
#              random weights generated on the GPUs (--load-format dummy is bench model's way); the start-up memory
#              plan per rank is logged; prefill 32k, decode batch 1 / 8 / 32 (goals: >= 20,000 tok/s, >= 400
#              tok/s at batch 1).
# boot         boot with and without a snapshot. Snapshots are of checkpoints on disk (random weights made on the
#              GPU have none), and the whole model's is ~90 GiB a rank, its bf16 checkpoint 598 GiB: more than
#              this machine's 128 GiB disk. So bench/boot_snapshot.py times one real-width MoE layer on one rank (a
#              ~16 GB bf16 checkpoint it writes first; the snapshot beside it) and the whole model's boot is
#              extrapolated per layer, said so.
set -uo pipefail
source bench/gpu_env.sh
PART=${1:-step}
LAYERS45=$(python3 -c "print('KKKM' * 11 + 'K')")
MODEL=(python3 -m tpserve.cli bench model --device cuda)
case "$PART" in
  step)
    step "machine"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvidia-smi topo -m | head -4
    step "tiny checkpoints: TP=1 / TP=2 against CPU"
    timeout 200 python3 bench/gpu_check_tiny.py --tp 2>&1 | tee "$OUT/tp2_tiny_tp.log" | grep "^|"
    step "tiny checkpoints: decode graphs against eager"
    timeout 120 python3 bench/gpu_check_tiny.py --graphs 2>&1 | tee "$OUT/tp2_tiny_graphs.log" | grep "^|"
    for tp in 1 2; do
      step "real-width KKKM, TP=$tp"
      if [ $tp = 1 ]; then dev=0; else dev=0,1; fi
      CUDA_VISIBLE_DEVICES=$dev timeout 400 "${MODEL[@]}" --layers KKKM --tp $tp --prefill 4096 --repeats 1 \
        --decode-steps 16 --batch 1 32 64 --json "$OUT/tp2_kkkm_tp$tp.json" 2>&1 | grep -E "^\||^layers|rror"
    done
    step "real-width KKKM, TP=2, --pdl off (the runs above: on, the default)"
    timeout 150 "${MODEL[@]}" --layers KKKM --tp 2 --pdl off --prefill 4096 --repeats 1 --decode-steps 16 --batch 1 \
      --json "$OUT/tp2_kkkm_tp2_pdl_off.json" 2>&1 | grep -E "decode step|rror"
    ;;
  collectives)
    step "collectives (bench/collectives_gpu.sh)"
    OUT="$OUT/collectives" timeout 420 bash bench/collectives_gpu.sh 2>&1 | tail -30
    for form in "--sp --custom-allreduce" "--no-sp --no-custom-allreduce"; do
      step "prefill 16k, TP=2, $form"
      timeout 150 "${MODEL[@]}" --layers KKKM --tp 2 $form --prefill 16384 --repeats 2 --decode-steps 4 --batch 1 \
        --json "$OUT/tp2_sp_${form// /_}.json" 2>&1 | grep -E "^\||rror"
    done
    for form in --fused-collectives --no-fused-collectives; do
      step "decode, TP=2, $form"
      timeout 120 "${MODEL[@]}" --layers KKKM --tp 2 $form --prefill 256 --repeats 1 --decode-steps 32 --batch 1 32 \
        --json "$OUT/tp2_decode_${form#--}.json" 2>&1 | grep -E "^\||rror"
    done
    ;;
  model)
    step "the whole model, TP=2, NVFP4 experts, random weights"
    timeout 480 "${MODEL[@]}" --layers "$LAYERS45" --dense-first --quantization nvfp4 --tp 2 --prefill 32768 \
      --repeats 1 --decode-steps 16 --batch 1 8 32 --json "$OUT/tp2_model45.json" 2>&1 \
      | grep -E "^\||^layers|memory plan|rror|boot"
    ;;
  boot)
    step "boot with and without a snapshot (bench/boot_snapshot.py, one real-width MoE layer, one rank)"
    timeout 540 python3 bench/boot_snapshot.py --layers K --json "$OUT/tp2_boot.json" 2>&1 | tail -14
    ;;
  *) echo "part: step, collectives, model or boot, got $PART"; exit 2 ;;
esac
step "done"
