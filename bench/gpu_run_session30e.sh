#!/usr/bin/env bash
# Thirtieth session, fifth call: tokens unchanged by Speculator.while_waiting (a fused step's observation filed while
# the next step runs): bench/sampled_tokens.py --speculative (adaptive, k = 3; its greedy setting runs fused steps)
# on this tree and on the tree before the session (dbadadb, carried as .base_src), and plain decoding on this tree.
set -uo pipefail
source bench/gpu_env.sh
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin  # (the demo model, not carried twice)
step "speculative, tree before"
PYTHONPATH=/tmp/site:$PWD/.base_src/src timeout 150 python3 bench/sampled_tokens.py --device cuda --speculative \
  --out /tmp/spec_base.json 2>&1 | grep -E "Error|error|Traceback"
step "speculative, this tree"
timeout 150 python3 bench/sampled_tokens.py --device cuda --speculative --out /tmp/spec_new.json 2>&1 \
  | grep -E "Error|error|Traceback"
step "plain, this tree"
timeout 100 python3 bench/sampled_tokens.py --device cuda --out /tmp/plain_new.json 2>&1 | grep -E "Error|error|Traceback"
python3 - <<'PY'
import json
base, new, plain = (json.load(open(f"/tmp/{n}.json")) for n in ("spec_base", "spec_new", "plain_new"))
print("settings:", len(new), "| speculative this tree == tree before:", base == new,
      "| differing settings:", [k for k in new if base.get(k) != new[k]])
greedy = "{'temperature': 0}"
print("greedy speculative == plain:", new[greedy] == plain[greedy], "| mixed batch speculative == tree before:",
      new["mixed"] == base["mixed"])
PY
step "done"
