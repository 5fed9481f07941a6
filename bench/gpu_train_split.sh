# Train the demo model over two or three device calls (each call may run 10 minutes; the run needs 17-19 on an H100).
# Before it, on the CPU: tpserve train-demo RUN --prepare-only --docs 120000, and RUN copied to
# .carry_train/data (data.xz, data.json, model/ with the tokenizer files), carried with .whl:
#   call 1: bash bench/gpu_train_split.sh --steps 2300 --stop-after 500
#   call 2: bash bench/gpu_train_split.sh --resume --steps 2300
# (where the steps run slower than ~2.2 a second, call 2 takes --stop-after 555 and a third call ends the run)
# (batch 32, the default: batch 64 does not fit an H100's memory). Make call 2 within the idle release.
# The run lives in out/trainrun (ignored by git, kept on the machine between calls while it is
# held); call 2 refuses to start from scratch when the machine was given back in between.
# Each call copies the exported checkpoint, losses and train_info to $OUT.
source bench/gpu_env.sh
RUN=$PWD/out/trainrun
resume=0
if [ "$1" = "--resume" ]; then resume=1; shift; fi
mkdir -p "$RUN/model"
if [ $resume = 1 ] && [ ! -f "$RUN/state.pt" ]; then echo "no $RUN/state.pt: the machine is a fresh one"; exit 3; fi
cp -n .carry_train/data/data.xz .carry_train/data/data.json "$RUN/"; cp -n .carry_train/data/model/* "$RUN/model/"
nvidia-smi -L
python3 -m tpserve.cli train-demo "$RUN" --device cuda "$@" > "$OUT/train.log" 2>&1; echo "train rc=$?"
tr '\r' '\n' < "$OUT/train.log" | grep -v '^\s*$' | awk 'NR % 60 == 0' | tail -12
tr '\r' '\n' < "$OUT/train.log" | tail -22
cp "$RUN"/model/model*.safetensors* "$RUN/model/config.json" "$RUN/model/train_info.json" "$RUN/losses.json" "$OUT/"
ls -la "$OUT"
