"""Tokens of the built-in model for fixed prompts under greedy and seeded sampled settings, as JSON (to compare two
trees on one machine: the sampler's device copies and filters changed, its draws must not).

    python bench/sampled_tokens.py --device cuda --out F.json [--speculative]
"""

from __future__ import annotations

import argparse
import json

from tpserve import LLM, SamplingParams
from tpserve.tools.acceptance import mtp_prompts

SETTINGS = [dict(temperature=0), dict(temperature=0.8, seed=1), dict(temperature=0.8, top_p=0.95, seed=2),
            dict(temperature=0.8, top_k=50, seed=3), dict(temperature=1.0, min_p=0.05, top_k=20, seed=4),
            dict(temperature=0.7, repetition_penalty=1.2, seed=5)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--speculative", action="store_true", help="with MTP speculation (k = 3)")
    args = ap.parse_args()
    spec = {"method": "mtp", "num_speculative_tokens": 3} if args.speculative else None
    llm = LLM(device=args.device, max_num_seqs=8, kv_cache_memory=2**30, speculative_config=spec)
    prompts = mtp_prompts()[:6]
    out = {}
    for i, s in enumerate(SETTINGS):  # one batch of every prompt per setting, and a mixed batch
        res = llm.generate(prompts, SamplingParams(max_tokens=48, ignore_eos=True, **s))
        out[str(s)] = [r.outputs[0].token_ids for r in res]
    mixed = [SamplingParams(max_tokens=48, ignore_eos=True, **SETTINGS[i % len(SETTINGS)]) for i in range(6)]
    out["mixed"] = [r.outputs[0].token_ids for r in llm.generate(prompts, mixed)]
    with open(args.out, "w") as f:
        json.dump(out, f)
    llm.shutdown()
    print(f"wrote {args.out}: {len(out)} settings")


if __name__ == "__main__":
    main()
