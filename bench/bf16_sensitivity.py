"""How far bf16 alone moves the tiny checkpoints from float32 (CPU, torch forms everywhere).

The yardstick for bf16 comparisons between kernel variants: the same prompts as
bench/gpu_check_tiny.py (greedy tokens of 4 prompts, prefill logits of the 120-token one).
Usage: python bench/bf16_sensitivity.py [--configs default,shared,variant]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import TINY_CONFIGS, make_checkpoint, prefill_logits, random_prompts

from tpserve import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
COMMON = {"kv_cache_memory": "64MiB", "block_size": 16, "max_num_batched_tokens": 64}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=",".join(TINY_CONFIGS))
    args = ap.parse_args()
    prompts = random_prompts((9, 120, 40, 77), seed=3)
    print("| config | bf16 vs fp32 (cpu, torch forms): greedy equal | max logit diff | max abs logit |\n"
          "| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            path = str(make_checkpoint(Path(tmp), name))
            res = {}
            for dtype in ("float32", "bfloat16"):
                llm = LLM(path, device="cpu", dtype=dtype, **COMMON)
                try:
                    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)
                    res[dtype] = ([o.outputs[0].token_ids for o in outs], prefill_logits(llm, prompts[1]).float())
                finally:
                    llm.shutdown()
            same = sum(a == b for a, b in zip(res["float32"][0], res["bfloat16"][0]))
            diff = (res["float32"][1] - res["bfloat16"][1]).abs().max().item()
            print(f"| {name} | {same}/{len(prompts)} | {diff:.2e} | {res['float32'][1].abs().max().item():.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
