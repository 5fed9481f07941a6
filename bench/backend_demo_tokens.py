"""Greedy tokens of the built-in demo model with one switch at two values (a backend on torch and on triton).

    python bench/backend_demo_tokens.py [--switch norm_backend] [--values torch,triton] [--dtype bfloat16]
                                        [--max-tokens 96]

--switch: an engine option (norm_backend, moe_route_backend, ... with torch,triton; a boolean switch such as
merge_linears or async_scheduling with --values false,true); every other option keeps its default. The demo model is trained (not chaotic like the
random tiny checkpoints), so in bf16 the two backends
should agree on its structured prompts (tools/acceptance.py) except at near ties. Prints how many of
the prompts give identical tokens and the first position where any differ. cuda only.
"""

from __future__ import annotations

import argparse

from tpserve import LLM, SamplingParams
from tpserve.tools.acceptance import mtp_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switch", default="norm_backend")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--values", default="torch,triton", help="the two values compared, the first as reference")
    args = ap.parse_args()
    values = [{"true": True, "false": False}.get(v, v) for v in args.values.split(",")]
    if len(values) != 2:
        ap.error("--values: two values, comma-separated")
    prompts = mtp_prompts()
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    outs = {}
    for value in values:
        llm = LLM(device="cuda", dtype=args.dtype, kv_cache_memory="2GiB", **{args.switch: value})
        outs[value] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
        llm.shutdown()
    ref, new = outs[values[0]], outs[values[1]]
    same = sum(a == b for a, b in zip(ref, new))
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(ref, new)]
    print(f"| demo model | {args.dtype} | {args.switch} {values[1]} vs {values[0]}: greedy equal "
          f"{same}/{len(prompts)} | first differing position per prompt: {first} |")


if __name__ == "__main__":
    main()
