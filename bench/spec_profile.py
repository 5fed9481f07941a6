"""Where a decode step's time goes, with and without MTP speculation: wall time per engine step split
into the engine's phases (schedule, plan, forward, verify, commit, draft ...), each timed with a device
synchronize before and after (so GPU time lands in the phase that launched it). The demo model's
structured prompts, greedy, --batch of them at a time (batch 1: one by one).

    python bench/spec_profile.py [--device cuda] [--k 3] [--max-tokens 96] [--batch 1]
"""

import argparse
import time
from collections import defaultdict

import torch

from tpserve import LLM, SamplingParams
from tpserve.train.acceptance import mtp_prompts


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def instrument(llm, device):
    totals, calls = defaultdict(float), defaultdict(int)
    eng = llm.engine
    spec = eng.speculator
    targets = [("step", eng, "step"), ("schedule", eng.scheduler, "schedule"), ("plan", eng, "_plan"),
               ("forward", eng.executor, "execute"), ("append", eng, "_append"), ("output", eng, "_output")]
    if spec is not None:
        targets += [("verify", spec, "verify"), ("commit", eng.executor, "commit"), ("propose", spec, "propose"),
                    ("draft forward", eng.executor, "draft"), ("draw", spec, "_draw")]
    for name, obj, attr in targets:
        fn = getattr(obj, attr)

        def wrapped(*a, _fn=fn, _name=name, **kw):
            _sync(device)
            t0 = time.perf_counter()
            out = _fn(*a, **kw)
            _sync(device)
            totals[_name] += time.perf_counter() - t0
            calls[_name] += 1
            return out

        setattr(obj, attr, wrapped)
    return totals, calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--batch", type=int, default=1, help="requests per generate call")
    args = ap.parse_args()
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    structured = mtp_prompts()
    prompts = [structured[i % len(structured)] for i in range(max(args.batch, len(structured)))]
    groups = [prompts[i:i + args.batch] for i in range(0, len(prompts), args.batch)]
    print("| setting | phase | calls per step | ms per step | ms per call |")
    print("| --- | --- | --- | --- | --- |")
    for name, spec in (("plain", None), (f"k={args.k}", {"method": "mtp", "num_speculative_tokens": args.k,
                                                          "adaptive": False, "truncate_threshold": 0.0})):
        llm = LLM(device=args.device, max_num_seqs=max(8, args.batch), kv_cache_memory="1GiB", speculative_config=spec)
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8))  # warm-up
        t0 = time.perf_counter()  # first without the timers (no added synchronizes)
        tokens = sum(len(o.outputs[0].token_ids) for g in groups for o in llm.generate(g, sp))
        print(f"| {name} | (no timers) | - | {1000 * (time.perf_counter() - t0) / tokens:.3f} ms per token | "
              f"{tokens / (time.perf_counter() - t0):.1f} tok/s |")
        totals, calls = instrument(llm, args.device)
        tokens = 0
        t0 = time.perf_counter()
        for g in groups:
            tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(g, sp))
        wall = time.perf_counter() - t0
        steps = calls["step"]
        for phase in sorted(totals, key=lambda k: -totals[k]):
            print(f"| {name} | {phase} | {calls[phase] / steps:.2f} | {1000 * totals[phase] / steps:.3f} | "
                  f"{1000 * totals[phase] / calls[phase]:.3f} |")
        print(f"| {name} | (tokens/s, steps) | {tokens / wall:.1f} tok/s | {steps} steps | {tokens / steps:.2f} tok/step |")
        llm.shutdown()


if __name__ == "__main__":
    main()
