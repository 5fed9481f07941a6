"""Per prompt of `bench spec`'s structured set: fixed-k speculative decoding's steps, mean run (tokens a step) and
acceptance by position, and each step's tokens left before max_tokens (where adaptive k's end-of-request rule could
act: Speculator._left).

    PYTHONPATH=src python bench/spec_per_prompt.py [--k 7] [--max-tokens 96,32] [--device cpu] [--batch B]

Greedy, one request at a time, on the built-in demo model with its MTP layer. `--batch B`: also the structured
prompts in one generate call of B requests, each step's running requests and the tokens it emitted (where a
batch's last requests leave it to run small steps).
"""

from __future__ import annotations

import argparse

from tpserve import LLM, SamplingParams
from tpserve.tools.bench.spec import structured_groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--max-tokens", default="96,32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=0)
    args = ap.parse_args()
    lengths = [int(n) for n in args.max_tokens.split(",") if n.strip()]
    if not lengths or any(n < 2 for n in lengths):
        ap.error(f"--max-tokens: integers >= 2, got {args.max_tokens!r}")
    if not 1 <= args.k <= 7:
        ap.error(f"--k: 1..7, got {args.k}")
    llm = LLM(speculative_config={"method": "mtp", "num_speculative_tokens": args.k, "adaptive": False,
                                  "truncate_threshold": 0.0}, device=args.device)
    spec = llm.engine.speculator
    counters, lefts, next_k = spec.counters, [], spec._next_k

    def spy(*a, **kw):
        k = next_k(*a, **kw)
        running = llm.engine.scheduler.running
        if running:
            lefts.append(running[0].max_tokens - len(running[0].output_ids))
        return k
    spec._next_k = spy
    for n in lengths:
        sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        print(f"\n{n} tokens a request, k = {args.k}:")
        for i, group in enumerate(structured_groups(1)):
            drafts, accepted = counters.num_drafts, counters.num_accepted_tokens
            per_pos = list(counters.accepted_per_pos)
            lefts.clear()
            llm.generate(group, sp)
            steps, acc = counters.num_drafts - drafts, counters.num_accepted_tokens - accepted
            pos = [b - a for a, b in zip(per_pos, counters.accepted_per_pos)]
            print(f"  prompt {i}: {steps} verify steps, mean run {1 + acc / max(steps, 1):.2f} tokens, accepted by "
                  f"position {pos}; tokens left before each step's choice {lefts}")
        if args.batch:
            print(f"  batch {args.batch}, one generate call: (running requests, tokens emitted) a step "
                  f"{batch_steps(llm, structured_groups(args.batch)[0], sp)}")
    llm.shutdown()


def batch_steps(llm, prompts: list[str], sp) -> list[tuple[int, int]]:
    from tpserve.tools.bench.spec import step_times

    eng, running = llm.engine, []
    step = eng.step

    def counted():
        running.append(len(eng.scheduler.running))
        return step()
    eng.step = counted
    try:
        with step_times(eng) as steps:
            llm.generate(prompts, sp)
    finally:
        eng.step = step
    return [(r, s.tokens) for r, s in zip(running, steps) if s.tokens]


if __name__ == "__main__":
    main()
