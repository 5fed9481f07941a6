"""Adaptive k against a fixed k in steady state, interleaved in one process (less exposed to drift
than `bench spec`, which times its settings one after another).

    python bench/spec_ab.py [--batch 1] [--k 5] [--fixed-k K] [--baseline fixed|off] [--candidate adaptive|fixed|off]
                            [--max-tokens 64] [--temperature T]
                            [--rounds 6] [--pairs 1] [--one-engine] [--device cpu] [--truncate-threshold T]
                            [--draft-graph G] [--json F]

With --pairs N, N pairs of engines are built one after another, each pair in the other order than the
one before (an A/A control, fixed k=7 against fixed k=7 on an H200, gave 0.939 with every round of 16
below 0.97: one engine of a pair can be slower as a whole); the median is over all rounds, and each
pair's median is printed too. Both engines first run one untimed pass over the structured prompts of `bench spec` (the adaptive
policy learns its costs and acceptance there; fixed k warms up the same way). Then each round runs
one timed pass per engine, alternating which goes first, and records decode-step throughput (steps
without a prefill chunk). Prints the per-round ratio adaptive / fixed and its median, and how often the
adaptive engine chose each k over the timed rounds (k = 0: a plain step). --baseline off compares the
adaptive engine with plain decoding instead (batch 64: does it cost nothing where it drafts nothing);
--candidate fixed with --baseline off times fixed k against plain decoding (the speedup, interleaved);
--candidate off with --baseline off is the A/A control of plain decoding.
--one-engine (adaptive or fixed k = --k against fixed k = --k): one engine runs both, switched between rounds
(`Speculator.set_adaptive`), so the two sides share graphs, memory and allocator state and differ in the policy
alone; each pair is then one engine. With --candidate fixed it is the A/A control of the one-engine comparison:
both sides fixed k, the spread of its ratios is what the measurement itself moves.
--temperature T > 0 samples, unseeded (a seeded request drafts a fixed k whatever the policy says, so that its
output does not depend on step timings): no fused steps (those are greedy), so k per step changes a step's cost.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
from collections import Counter

from tpserve import LLM, SamplingParams
from tpserve.tools.bench.spec import decode_rate, step_times, structured_groups


def timed_pass(llm: LLM, groups: list[list[str]], sp: SamplingParams) -> float:
    """Decode tok/s of one pass over the generate calls."""
    with step_times(llm.engine) as steps:
        for g in groups:
            llm.generate(g, sp)
    return decode_rate(steps)


def record_adaptive(speculator, result: dict, label: str) -> None:
    """What an adaptive speculator measured (its decode rates with and without drafts) and estimated (acceptance
    by position), into `result` and printed."""
    result["measured_rates"] = speculator.rates.snapshot()
    result["acceptance"] = speculator.policy.snapshot()["acceptance"]
    print(f"{label} measured rates: {result['measured_rates']}")
    print(f"{label} acceptance per position: {[round(a, 3) for a in result['acceptance']]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--k", type=int, default=5, help="the adaptive mode's largest k (and the fixed k by default)")
    ap.add_argument("--fixed-k", type=int, default=None, help="the fixed engine's k (default: --k)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sampled, unseeded")
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds per pair of engines")
    ap.add_argument("--pairs", type=int, default=1,
                    help="pairs of engines, each built in the other order (two identical engines differed by "
                         "up to 6%% on an H200: the pairs spread that over both sides)")
    ap.add_argument("--one-engine", action="store_true",
                    help="adaptive and fixed k on one engine, switched between rounds (not two engines)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--baseline", choices=("fixed", "off"), default="fixed",
                    help="the other engine: fixed k (default) or no speculation")
    ap.add_argument("--candidate", choices=("adaptive", "fixed", "off"), default="adaptive",
                    help="the engine compared with the baseline: adaptive k (default), fixed k = --k, or off")
    ap.add_argument("--draft-graph", default=None, help="--draft-graph of both engines (default: the engine's)")
    ap.add_argument("--truncate-threshold", type=float, default=None,
                    help="the adaptive engine's truncation threshold (default: the engine's default)")
    ap.add_argument("--json", default=None, help="also write the rounds, the median and the k histogram here")
    args = ap.parse_args()
    if args.one_engine and (args.candidate == "off" or args.baseline != "fixed"
                            or (args.fixed_k is not None and args.fixed_k != args.k)):
        ap.error("--one-engine: adaptive (k <= --k) or fixed k = --k against fixed k = --k only")
    if not args.temperature >= 0:
        ap.error(f"--temperature: must be >= 0, got {args.temperature}")
    groups = structured_groups(args.batch)
    sp = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True)
    fixed_k = args.k if args.fixed_k is None else args.fixed_k
    kw = dict(device=args.device, max_num_seqs=max(args.batch, 8), kv_cache_memory=2**30)
    if args.draft_graph:
        kw["draft_graph"] = args.draft_graph
    other = None if args.baseline == "off" else {"method": "mtp", "num_speculative_tokens": fixed_k,
                                                  "adaptive": False, "truncate_threshold": 0.0}
    base_name = "off" if other is None else f"fixed k={fixed_k}"
    configs = {"base": other,
               "cand": None if args.candidate == "off" else
               {"method": "mtp", "num_speculative_tokens": args.k,
                **({"adaptive": False, "truncate_threshold": 0.0} if args.candidate == "fixed" else {}),
                **({} if args.truncate_threshold is None else {"truncate_threshold": args.truncate_threshold})}}
    chosen = Counter()  # k the candidate picked per step with requests left to draft for (timed rounds)
    ratios, rounds = [], []
    cand = {"adaptive": f"adaptive (k<={args.k})", "fixed": f"fixed k={args.k}", "off": "off"}[args.candidate]
    print(f"| pair | round | {base_name} decode tok/s | {cand} decode tok/s | {cand} / {base_name} |")
    print("| --- | --- | --- | --- | --- |")
    for pair in range(args.pairs):  # each pair of engines built in the other order than the one before
        built = ["base", "cand"] if pair % 2 == 0 else ["cand", "base"]
        if args.one_engine:
            one = LLM(speculative_config=configs["cand"], **kw)
            engines = {"base": one, "cand": one}
        else:
            engines = {name: LLM(speculative_config=configs[name], **kw) for name in built}

        side = {"now": None}  # the side running (one engine: which side's steps to count)

        def run(name: str) -> float:
            side["now"] = name
            if args.one_engine:
                engines[name].engine.speculator.set_adaptive(name == "cand" and args.candidate == "adaptive")
            return timed_pass(engines[name], groups, sp)

        for name in built:
            run(name)  # untimed pass
        cand_engine = engines["cand"].engine
        speculator = cand_engine.speculator

        def counted(fn, cand_engine=cand_engine, speculator=speculator):  # propose / verify_fused choose k
            def wrapped(*a, **kw):
                fn(*a, **kw)
                # after a request's last step there is nothing to draft for; one engine: the candidate's rounds only
                if cand_engine.scheduler.running and side["now"] == "cand":
                    chosen[speculator.last_k] += 1
            return wrapped
        def idle_counted(fn, speculator=speculator):  # a step that skips the speculator (Speculator.idle): k = 0
            def wrapped():
                skip = fn()
                chosen[0] += skip and side["now"] == "cand"
                return skip
            return wrapped
        if speculator is not None:
            speculator.propose, speculator.verify_fused = counted(speculator.propose), counted(speculator.verify_fused)
            speculator.idle = idle_counted(speculator.idle)
        for r in range(args.rounds):
            order = ["base", "cand"] if r % 2 == 0 else ["cand", "base"]
            rate = {name: run(name) for name in order}
            ratios.append(rate["cand"] / rate["base"])
            rounds.append({"pair": pair, "built": built, "order": order, "base_tok_s": rate["base"],
                           "cand_tok_s": rate["cand"], "ratio": ratios[-1]})
            print(f"| {pair + 1} | {r + 1} | {rate['base']:.1f} | {rate['cand']:.1f} | {ratios[-1]:.3f} |", flush=True)
        if pair < args.pairs - 1:
            for llm in {id(x): x for x in engines.values()}.values():
                llm.shutdown()
            del engines, cand_engine
            gc.collect()
    per_pair = [statistics.median(x["ratio"] for x in rounds if x["pair"] == p) for p in range(args.pairs)]
    print(f"median {cand} / {base_name}: {statistics.median(ratios):.3f} over {len(ratios)} rounds "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); per pair of engines: "
          + ", ".join(f"{x:.3f}" for x in per_pair))
    total = sum(chosen.values()) or 1
    print(f"{cand} k per step: " + ", ".join(f"k={k} {100 * n / total:.0f}%" for k, n in sorted(chosen.items())))
    result = {"args": vars(args), "baseline": base_name, "candidate": cand, "rounds": rounds,
              "median": statistics.median(ratios), "per_pair_median": per_pair, "k_per_step": {str(k): n for k, n in sorted(chosen.items())}}
    if args.candidate == "adaptive":  # what the adaptive engine measured and fitted (why it chose those k)
        record_adaptive(speculator, result, cand)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    for llm in {id(x): x for x in engines.values()}.values():
        llm.shutdown()


if __name__ == "__main__":
    main()
