"""Greedy tokens of the built-in demo model with one backend switch on triton and on torch.

    python bench/backend_demo_tokens.py [--switch norm_backend] [--dtype bfloat16] [--max-tokens 96]

--switch: an engine option taking triton | torch (norm_backend, moe_route_backend, mhc_backend,
moe_backend); every other option keeps its default. The demo model is trained (not chaotic like the
random tiny checkpoints), so in bf16 the two backends
should agree on its structured prompts (train/acceptance.py) except at near ties. Prints how many of
the prompts give identical tokens and the first position where any differ. cuda only.
"""

from __future__ import annotations

import argparse

from tpserve import LLM, SamplingParams
from tpserve.train.acceptance import mtp_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switch", default="norm_backend")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    prompts = mtp_prompts()
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    outs = {}
    for backend in ("torch", "triton"):
        llm = LLM(device="cuda", dtype=args.dtype, kv_cache_memory="2GiB", **{args.switch: backend})
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
        llm.shutdown()
    same = sum(a == b for a, b in zip(outs["torch"], outs["triton"]))
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
             for a, b in zip(outs["torch"], outs["triton"])]
    print(f"| demo model | {args.dtype} | {args.switch} triton vs torch: greedy equal {same}/{len(prompts)} | "
          f"first differing position per prompt: {first} |")


if __name__ == "__main__":
    main()
