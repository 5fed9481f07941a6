"""Plain decoding (no speculation) greedy against sampled: decode tok/s of the structured prompts on one engine.

    python bench/sampled_decode.py [--batch 1] [--max-tokens 96] [--rounds 6] [--device cpu] [--json F]

Settings: greedy; temperature 0.8; 0.8 with top_p 0.95; 0.8 with top_k 50 (each round one pass per setting, the
order rotated). Prints each setting's median decode tok/s over the rounds. A sampled step used to copy its settings
to the device with blocking copies, each a stream sync that made the host wait for the step async scheduling had
just launched (engine/h2d.py): run this on the trees before and after such a change (PYTHONPATH at each src).
"""

from __future__ import annotations

import argparse
import json
import statistics

from spec_ab import timed_pass

from tpserve import LLM, SamplingParams
from tpserve.tools.bench.spec import structured_groups

SETTINGS = {"greedy": dict(temperature=0), "T 0.8": dict(temperature=0.8),
            "T 0.8 top_p 0.95": dict(temperature=0.8, top_p=0.95), "T 0.8 top_k 50": dict(temperature=0.8, top_k=50)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    llm = LLM(device=args.device, max_num_seqs=max(args.batch, 8), kv_cache_memory=2**30)
    groups = structured_groups(args.batch)
    names = list(SETTINGS)
    params = {n: SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, **SETTINGS[n]) for n in names}
    for n in names:
        timed_pass(llm, groups, params[n])  # untimed
    rates = {n: [] for n in names}
    for r in range(args.rounds):
        for j in range(len(names)):
            n = names[(r + j) % len(names)]
            rates[n].append(timed_pass(llm, groups, params[n]))
    print("| setting | decode tok/s (median) | min | max |")
    print("| --- | --- | --- | --- |")
    out = {"args": vars(args), "settings": {}}
    for n in names:
        med = statistics.median(rates[n])
        out["settings"][n] = {"tok_s": rates[n], "median": med}
        print(f"| {n} | {med:.1f} | {min(rates[n]):.1f} | {max(rates[n]):.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    llm.shutdown()


if __name__ == "__main__":
    main()
