"""Adaptive k against several fixed k on one engine, measured in one run (issue 12: "adaptive k >= the best fixed
k on the same prompts, measured in one run").

    python bench/spec_sides.py [--k 7] [--sides adaptive,7,5,3] [--temperature 0] [--batch 1] [--max-tokens 96]
                               [--rounds 8] [--device cpu] [--json F]
                               [--host-times] [--gc-stats]

One engine built with num_speculative_tokens = --k runs every side, switched between passes
(`Speculator.set_adaptive(on, fixed_k)`): the sides share graphs, memory and allocator state and differ in the
policy alone (two engines built alike differed by up to 6% on an H200: bench/spec_ab.py). A side is `adaptive`
(k <= --k) or a fixed k; a side may repeat (`7,7`: the A/A control, whose spread is what the measurement itself
moves). Each round runs one pass of the structured prompts per side, the order rotated round by round, after one
untimed pass per side. Greedy (--temperature 0): every fixed side must be --k, since a greedy step that can be
fused runs the fused graphs' --k rows whatever k is (a smaller fixed k would cost --k's step and emit less; compare
engines built with it through bench/spec_ab.py). Sampled (--temperature T > 0, unseeded: a seeded request drafts a
fixed k whatever the policy says): steps are not fused, verify graphs exist for every row count and drafts run depth
by depth, so a fixed k on this engine costs what it costs on an engine built with it.

Prints each round's decode tok/s per side, whether greedy sides gave the same tokens (one untimed pass each after
the rounds), each side's median, the median over rounds of adaptive / each fixed side (and / the best fixed side:
the one with the highest median), and the adaptive side's k per step.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections import Counter

from spec_ab import record_adaptive, timed_pass

from tpserve import LLM, SamplingParams
from tpserve.tools.bench.spec import structured_groups


def parse_sides(text: str, k: int) -> list[str]:
    sides = [s.strip() for s in text.split(",") if s.strip()]
    for s in sides:
        if s != "adaptive" and not (s.isdigit() and 1 <= int(s) <= k):
            raise ValueError(f"--sides: each side is 'adaptive' or a fixed k in 1..--k ({k}), got {s!r}")
    if len(sides) < 2:
        raise ValueError(f"--sides: at least two sides, got {text!r}")
    return sides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=7, help="the engine's num_speculative_tokens (adaptive's largest k)")
    ap.add_argument("--sides", default="adaptive,7")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None)
    ap.add_argument("--host-times", action="store_true",
                    help="also time, per side, the engine's fused steps (_fused_step), their device part "
                         "(execute_spec: launch to results on the host) and the host's walk after it (verify_fused), "
                         "us a call")
    ap.add_argument("--gc-stats", action="store_true",
                    help="also count, per side, Python's garbage collections by generation and the time spent in them")
    args = ap.parse_args()
    try:
        sides = parse_sides(args.sides, args.k)
    except ValueError as exc:
        ap.error(str(exc))
    if not args.temperature >= 0:
        ap.error(f"--temperature: must be >= 0, got {args.temperature}")
    if args.temperature == 0 and any(s != "adaptive" and int(s) != args.k for s in sides):
        ap.error(f"--sides: greedy steps are fused to --k ({args.k}) rows on this engine, so a fixed side below it "
                 "does not stand in for an engine built with it (bench/spec_ab.py compares such engines)")
    names = [s if sides.count(s) == 1 else f"{s}#{sides[:i + 1].count(s)}" for i, s in enumerate(sides)]
    names = [n if n.startswith("adaptive") else f"k={n}" for n in names]
    groups = structured_groups(args.batch)
    sp = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True)
    llm = LLM(speculative_config={"method": "mtp", "num_speculative_tokens": args.k}, device=args.device,
              max_num_seqs=max(args.batch, 8), kv_cache_memory=2**30)
    speculator = llm.engine.speculator
    now = {"side": None}
    chosen: dict[str | None, Counter] = {n: Counter() for n in names + [None]}  # None: untimed passes

    def run(i: int) -> float:
        now["side"] = names[i]
        side = sides[i]
        speculator.set_adaptive(side == "adaptive", None if side == "adaptive" else int(side))
        return timed_pass(llm, groups, sp)

    for i in range(len(sides)):
        run(i)  # untimed: compiles, and the adaptive side learns its costs and acceptance
    propose, verify_fused, idle = speculator.propose, speculator.verify_fused, speculator.idle

    def counted(fn):  # the k each step chose (after a request's last step nothing is drafted: not counted)
        def wrapped(*a, **kw):
            fn(*a, **kw)
            if llm.engine.scheduler.running:
                chosen[now["side"]][speculator.last_k] += 1
        return wrapped

    def idle_counted():  # a step that skips the speculator (Speculator.idle): k = 0
        skip = idle()
        chosen[now["side"]][0] += bool(skip)
        return skip

    speculator.propose, speculator.verify_fused, speculator.idle = counted(propose), counted(verify_fused), idle_counted
    spent: dict[str | None, Counter] = {n: Counter() for n in names + [None]}
    calls: dict[str | None, Counter] = {n: Counter() for n in names + [None]}
    if args.host_times:  # (outermost wrappers: each side's calls carry the same timer overhead)
        owners = {"_fused_step": (llm.engine, "_fused_step"), "execute_spec": (llm.engine.executor, "execute_spec"),
                  "verify_fused": (speculator, "verify_fused")}
        for label, (owner, attr) in owners.items():
            def timer(*a, _fn=getattr(owner, attr), _label=label, **kw):
                t = time.perf_counter()
                try:
                    return _fn(*a, **kw)
                finally:
                    spent[now["side"]][_label] += time.perf_counter() - t
                    calls[now["side"]][_label] += 1
            setattr(owner, attr, timer)
    collected: dict[str, Counter] = {n: Counter() for n in names}
    if args.gc_stats:  # (gc.callbacks: each collection's generation and time, under the side running then)
        started = [0.0]

        def on_gc(phase, info):
            if phase == "start":
                started[0] = time.perf_counter()
            elif now["side"] in collected:
                collected[now["side"]][f"gen{info['generation']}"] += 1
                collected[now["side"]]["ms"] += 1e3 * (time.perf_counter() - started[0])
        gc.callbacks.append(on_gc)
    rounds = []
    print("| round | " + " | ".join(f"{n} tok/s" for n in names) + " |")
    print("| --- " * (len(names) + 1) + "|")
    for r in range(args.rounds):
        order = [(r + j) % len(sides) for j in range(len(sides))]
        rate = {names[i]: run(i) for i in order}
        rounds.append(rate)
        print(f"| {r + 1} | " + " | ".join(f"{rate[n]:.1f}" for n in names) + " |", flush=True)
    same = None
    if args.temperature == 0:  # greedy: every side's tokens must be the same (untimed, one pass a side)
        outs, now["side"] = [], None  # (counted apart from the sides' timed passes)
        for i in range(len(sides)):
            speculator.set_adaptive(sides[i] == "adaptive", None if sides[i] == "adaptive" else int(sides[i]))
            outs.append([o.outputs[0].token_ids for g in groups for o in llm.generate(g, sp)])
        same = all(o == outs[0] for o in outs)
        print(f"greedy tokens identical on every side: {same}")
    median = {n: statistics.median(x[n] for x in rounds) for n in names}
    print("median tok/s: " + ", ".join(f"{n} {median[n]:.1f}" for n in names))
    result = {"args": vars(args), "sides": names, "rounds": rounds, "median_tok_s": median, "greedy_same": same,
              "k_per_step": {n: {str(k): c for k, c in sorted(chosen[n].items())} for n in names}}
    fixed = [n for n in names if not n.startswith("adaptive")]
    for a in (n for n in names if n.startswith("adaptive")):
        ratios = {f: [x[a] / x[f] for x in rounds] for f in fixed}
        best = max(fixed, key=median.get)
        result[f"{a} / fixed"] = {f: statistics.median(v) for f, v in ratios.items()}
        result[f"{a} / best fixed"] = {"best": best, "median": statistics.median(ratios[best]),
                                       "min": min(ratios[best]), "max": max(ratios[best])}
        print(f"{a} / each fixed side (median over rounds): "
              + ", ".join(f"{f} {statistics.median(v):.3f}" for f, v in ratios.items()))
        print(f"{a} / the best fixed side ({best}): {statistics.median(ratios[best]):.3f} "
              f"(min {min(ratios[best]):.3f}, max {max(ratios[best]):.3f}) over {len(rounds)} rounds")
    adaptive = [n for n in names if n.startswith("adaptive")]
    for group in (fixed, adaptive):  # each side against the first of its kind (a repeated side: an A/A control)
        for f in group[1:]:
            v = [x[f] / x[group[0]] for x in rounds]
            print(f"{f} / {group[0]}: {statistics.median(v):.3f} (min {min(v):.3f}, max {max(v):.3f})")
    if adaptive and fixed and len(rounds) >= 2:
        # pooled: each round's geometric mean of the adaptive sides over that of the fixed sides; the mean over
        # rounds with a 95% interval (1.96 standard errors)
        v = [statistics.geometric_mean([x[a] for a in adaptive]) / statistics.geometric_mean([x[f] for f in fixed])
             for x in rounds]
        mean, se = statistics.fmean(v), statistics.stdev(v) / len(v) ** 0.5
        result["adaptive / fixed pooled"] = {"median": statistics.median(v), "mean": mean, "ci95": [mean - 1.96 * se,
                                                                                                  mean + 1.96 * se]}
        print(f"adaptive sides / fixed sides, pooled per round: median {statistics.median(v):.4f}, mean {mean:.4f} "
              f"(95% {mean - 1.96 * se:.4f}-{mean + 1.96 * se:.4f}) over {len(v)} rounds")
    for n in names:
        total = sum(chosen[n].values()) or 1
        print(f"{n} k per step: " + ", ".join(f"k={k} {100 * c / total:.0f}%" for k, c in sorted(chosen[n].items())))
    if args.host_times:
        labels = ["_fused_step", "execute_spec", "verify_fused"]
        result["host_us"] = {n: {k: 1e6 * spent[n][k] / calls[n][k] for k in labels if calls[n][k]} for n in names}
        print("| side | " + " | ".join(f"{k} us (calls)" for k in labels) + " |")
        print("| --- " * (len(labels) + 1) + "|")
        for n in names:
            print(f"| {n} | " + " | ".join(f"{1e6 * spent[n][k] / max(calls[n][k], 1):.1f} ({calls[n][k]})"
                                          for k in labels) + " |")
    if args.gc_stats:
        gc.callbacks.remove(on_gc)
        result["gc"] = {n: dict(collected[n]) for n in names}
        for n in names:
            c = collected[n]
            print(f"{n} garbage collections: gen0 {c['gen0']}, gen1 {c['gen1']}, gen2 {c['gen2']}, {c['ms']:.1f} ms")
    if "adaptive" in sides:
        record_adaptive(speculator, result, "adaptive")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    llm.shutdown()


if __name__ == "__main__":
    main()
