"""What the adaptive policy has learned after a few generate calls, and the k it would choose.

    python bench/spec_policy_fit.py [--batch 16] [--k 5] [--max-tokens 64] [--calls 2] [--device cpu]

Runs --calls generate calls of --batch requests (the structured prompts of `bench spec`) with the
adaptive policy, then prints its fitted step and draft costs, its acceptance estimates, the cost it
predicts for one step at this batch for every k, and the k it chooses there (not exploring). Compare
the predicted step + draft time with what `tpserve bench spec` measures per step (decode tok/s and the
mean accepted length).
"""

from __future__ import annotations

import argparse

from tpserve import LLM, SamplingParams
from tpserve.tools.acceptance import mtp_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    llm = LLM(device=args.device, speculative_config={"method": "mtp", "num_speculative_tokens": args.k},
              max_num_seqs=max(args.batch, 8), kv_cache_memory=2 * 2**30)
    structured = mtp_prompts()
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for _ in range(args.calls):
        llm.generate([structured[i % len(structured)] for i in range(args.batch)], sp)
    policy = llm.engine.speculator.policy
    snap = policy.snapshot()
    print("step cost:", {k: f"{v:.3g}" for k, v in snap["step_cost"].items()})
    print("draft cost:", {k: f"{v:.3g}" for k, v in snap["draft_cost"].items()})
    print("acceptance by position:", [round(a, 3) for a in snap["acceptance"]])
    print(f"| k | predicted step ms (batch {args.batch}) | predicted draft ms | expected tokens per step |")
    print("| --- | --- | --- | --- |")
    prod, tokens = 1.0, 1.0
    for k in range(args.k + 1):
        if k:
            prod *= snap["acceptance"][k - 1]
            tokens += prod
        print(f"| {k} | {1e3 * policy.step_cost(args.batch * (1 + k)):.1f} | "
              f"{1e3 * policy.draft_cost(k, args.batch):.1f} | {args.batch * tokens:.1f} |")
    while policy.begin_step().explore:
        pass
    print("chosen k (not exploring, no request estimates):", policy.choose_k(args.batch, []))
    llm.shutdown()


if __name__ == "__main__":
    main()
