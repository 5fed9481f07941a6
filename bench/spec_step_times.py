"""Where a generate call's time goes, step by step, with and without speculative decoding.

    python bench/spec_step_times.py [--batch 16] [--k 5] [--max-tokens 64] [--device cpu]

One generate call of --batch requests (the structured prompts of `bench spec`), greedy; every engine
step timed. Prints, per setting: the whole call, the first step (the prefill of every prompt; with
speculation the MTP layer also runs over every prompt position) and the steps after it (time, tokens
emitted, ms per token).
"""

from __future__ import annotations

import argparse
import time

from tpserve import LLM, SamplingParams
from tpserve.tools.bench.spec import step_times
from tpserve.train.acceptance import mtp_prompts


def timed_call(llm: LLM, prompts: list[str], sp: SamplingParams) -> tuple[float, list[float]]:
    with step_times(llm.engine) as steps:
        t = time.perf_counter()
        llm.generate(prompts, sp)
        return time.perf_counter() - t, [seconds for seconds, _, _ in steps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    structured = mtp_prompts()
    prompts = [structured[i % len(structured)] for i in range(args.batch)]
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print("| setting | call s | tok/s | first step (prefill) s | later steps | later s | ms per token after the prefill |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, spec in (("off", None), (f"k={args.k}", {"method": "mtp", "num_speculative_tokens": args.k,
                                                      "adaptive": False, "truncate_threshold": 0.0})):
        llm = LLM(device=args.device, speculative_config=spec, max_num_seqs=max(args.batch, 8),
                  kv_cache_memory=2 * 2**30)
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8))  # warm-up
        total, steps = timed_call(llm, prompts, sp)
        tokens = args.batch * args.max_tokens
        later = sum(steps[1:])
        # the prefill step emits each request's first token
        print(f"| {name} | {total:.2f} | {tokens / total:.1f} | {steps[0]:.2f} | {len(steps) - 1} | {later:.2f} | "
              f"{1e3 * later / (tokens - args.batch):.2f} |")
        llm.shutdown()


if __name__ == "__main__":
    main()
