#!/usr/bin/env bash
# Twenty-second session, sixth call (~2.5 min): sampled speculation's host copies cut (a verify position one copy,
# was two; a draft depth one, was three: spec_verify.rejection_tokens / sample_tokens keep the tokens on the
# device): fixed k = 3, 2, 7 at temperature 0.8, batch 1, one engine (bench/spec_sides.py), on the tree before
# (.base_src = `git archive bdfa57d src`) and after, in one call.
set -uo pipefail
source bench/gpu_env.sh
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
step "sampled speculation, before"
PYTHONPATH=/tmp/site:$PWD/.base_src/src timeout 80 python3 bench/spec_sides.py --device cuda --k 7 --sides 3,2,7 \
  --temperature 0.8 --batch 1 --max-tokens 96 --rounds 3 --json "$OUT/sides_t08_before.json" 2>&1 \
  | grep -E "^median|Error|error|Traceback"
step "sampled speculation, after"
timeout 80 python3 bench/spec_sides.py --device cuda --k 7 --sides 3,2,7 --temperature 0.8 --batch 1 \
  --max-tokens 96 --rounds 3 --json "$OUT/sides_t08_after.json" 2>&1 | grep -E "^median|Error|error|Traceback"
step "done"
