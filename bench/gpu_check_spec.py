"""Speculative decoding on a GPU: greedy tokens with MTP drafts vs plain decoding, on the built-in
demo model and its structured prompts (plus free text), in float32 and bfloat16; prints a table.

    python bench/gpu_check_spec.py [--device cuda] [--max-tokens 96] [--dtypes float32 bfloat16] [--k 1 3]
"""

import argparse

from tpserve import LLM, SamplingParams
from tpserve.tools.acceptance import mtp_prompts

TEXT = ["The capital of France is", "def fibonacci(n):", "Q: What is 12 + 7?\nA:", "Once upon a time"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    ap.add_argument("--k", type=int, nargs="*", default=[1, 3])
    args = ap.parse_args()
    prompts = mtp_prompts() + TEXT
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=1)
    print("| dtype | k | prompts equal | first divergence (token index) | max logprob diff (equal prompts) | "
          "mean accepted length |")
    print("| --- | --- | --- | --- | --- | --- |")
    for dtype in args.dtypes:
        plain = LLM(device=args.device, dtype=dtype, max_num_seqs=16, kv_cache_memory="2GiB")
        ref = plain.generate(prompts, sp)
        plain.shutdown()
        for k in args.k:
            spec = LLM(device=args.device, dtype=dtype, max_num_seqs=16, kv_cache_memory="2GiB",
                       speculative_config={"method": "mtp", "num_speculative_tokens": k})
            out = spec.generate(prompts, sp)
            equal, first, diff = 0, [], 0.0
            for a, b in zip(ref, out):
                ta, tb = a.outputs[0].token_ids, b.outputs[0].token_ids
                if ta == tb:
                    equal += 1
                    diff = max([diff] + [abs(x[t].logprob - y[t].logprob) for x, y, t in
                                         zip(a.outputs[0].logprobs, b.outputs[0].logprobs, ta)])
                else:
                    first.append(next(i for i, (x, y) in enumerate(zip(ta, tb)) if x != y))
            s = spec.engine.stats()
            print(f"| {dtype} | {k} | {equal}/{len(prompts)} | {first or '-'} | {diff:.2e} | "
                  f"{s['spec_decode_mean_accepted_length']:.2f} |")
            spec.shutdown()


if __name__ == "__main__":
    main()
