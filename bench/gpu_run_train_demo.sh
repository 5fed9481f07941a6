# Device call that trained the shipped demo model (2026-12-01, one nvidia-h200 call, 463 s wall).
# Before it, on the CPU (corpus + BPE + packed rows, 80,000 documents, seed 0; ~10 min on 2 cores):
#   tpserve train-demo RUN --prepare-only          (writes RUN/data.xz, RUN/data.json, RUN/model/tokenizer*)
# then RUN was carried as .carry_train/data with the source as .carry_train/src, and this ran as
#   bash .carry_train/gpu_train.sh --time-budget 400
# The checkpoint files came back in $OUT and went to src/tpserve/builtin/glm5-next-demo (with the
# tokenizer files from RUN/model and the generation_config.json that export writes).
# one device call: install the carried wheels, train (or resume) the demo model, copy the checkpoint to $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.carry_train/src PYTHONUNBUFFERED=1
nvidia-smi -L; python3 -c "import torch, tqdm, safetensors; print('torch', torch.__version__)"
RUN=$PWD/.carry_train/run
mkdir -p $RUN/model
cp -n .carry_train/data/data.xz .carry_train/data/data.json $RUN/; cp -n .carry_train/data/model/* $RUN/model/
python3 -m tpserve.cli train-demo $RUN --device cuda "$@" > $OUT/train.log 2>&1; echo "train rc=$?"
tr '\r' '\n' < $OUT/train.log | grep -v '^\s*$' | awk 'NR % 40 == 0' | tail -25
tr '\r' '\n' < $OUT/train.log | tail -30
nvidia-smi --query-gpu=memory.used --format=csv
cp $RUN/model/model*.safetensors* $RUN/model/config.json $RUN/model/train_info.json $RUN/losses.json $OUT/ ; ls -la $OUT
