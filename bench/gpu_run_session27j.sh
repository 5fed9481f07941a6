#!/usr/bin/env bash
# Twenty-seventh session, tenth call: why the Triton GEMV at 8 rows ran 1.4-1.5x slower under PDL (twenty-sixth
# session): `pdl_chain.py --rows 8` with two more forms, PDL with the plain launches' tiles pinned and PDL with the
# autotuner's own choice for PDL launches (a guess: tuning PDL launches back to back picks a worse tile). That form
# of pdl_chain.py was not committed: its "pinned" form launched `_gemv_kernel.fn` with the `best_config` each shape
# got from a plain `gemv` call; the eleventh call's pdl_chain.py replaced both forms.
set -uo pipefail
source bench/gpu_env.sh
step "pdl_chain M=8"
timeout 240 python3 bench/pdl_chain.py --rows 8 --repeats 8 --rounds 3 --json "$OUT/s27j_pdl_chain_m8.json" 2>&1 | tail -14
step "done"
