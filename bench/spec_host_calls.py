"""Host time of the speculator's own calls per decode step, fixed k against adaptive, with fused steps.

    python bench/spec_host_calls.py [--k 3] [--passes 20] [--only engine._fused_step,speculator._next_k]

Runs `bench/host_overhead.py`'s stand-in executor (no forward: every draft accepted, fused steps as on a
GPU) for a batch of 1 and wraps the engine's and the speculator's calls with timers; prints us per call
and calls per pass for each. What the adaptive mode adds per step is `_next_k`'s difference (measured
rates, the policy's choice, its probes); wrappers add ~0.3-1 us a call, nested ones count in both: inside a
fused step the adaptive mode runs one wrapped call more than fixed k (rates.observe and rates.override against
policy.choose_k), so its row for the step carries one wrapper more. --only wraps just the calls named (one
outer call alone: the two modes' difference without that bias).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_overhead  # noqa: E402

from tpserve import LLM, SamplingParams  # noqa: E402
from tpserve.tools.acceptance import mtp_prompts  # noqa: E402

CALLS = {"speculator": ("_next_k", "fusable", "verify_fused", "_extend_drafts", "_finish", "propose"),
         "rates": ("observe", "override"), "policy": ("begin_step", "choose_k", "observe_acceptance", "observe_step", "observe_draft"),
         "engine": ("_plan", "_fused_step")}


def wrap(llm: LLM, spent: Counter, calls: Counter, only: set[str] | None = None) -> None:
    eng = llm.engine
    owners = {"speculator": eng.speculator, "rates": eng.speculator.rates, "policy": eng.speculator.policy,
              "engine": eng}
    for owner, names in CALLS.items():
        for name in names:
            if only is not None and f"{owner}.{name}" not in only:
                continue
            fn = getattr(owners[owner], name)

            def wrapped(*a, _fn=fn, _name=f"{owner}.{name}", **kw):
                t = time.perf_counter()
                try:
                    return _fn(*a, **kw)
                finally:
                    spent[_name] += time.perf_counter() - t
                    calls[_name] += 1
            setattr(owners[owner], name, wrapped)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--only", default=None, help="comma-separated calls to wrap (owner.name as printed); "
                    "default: all")
    args = ap.parse_args()
    only = None if args.only is None else set(args.only.split(","))
    known = {f"{o}.{n}" for o, ns in CALLS.items() for n in ns}
    if only is not None and not only <= known:
        raise SystemExit(f"--only: unknown calls {sorted(only - known)}; known: {sorted(known)}")
    prompts = [mtp_prompts()[0]]
    sp = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
    settings = {"fixed": {"method": "mtp", "num_speculative_tokens": args.k, "adaptive": False,
                          "truncate_threshold": 0.0},
                "adaptive": {"method": "mtp", "num_speculative_tokens": args.k}}
    engines, results = {}, {}
    for name, spec in settings.items():
        llm = host_overhead.stand_in_llm(spec, args.k, fused=True)
        for _ in range(3):  # warm-up: the adaptive mode's first measurements and probes
            host_overhead.decode_ms(llm, prompts, sp)
        results[name] = [0.0, Counter(), Counter()]
        wrap(llm, results[name][1], results[name][2], only)
        engines[name] = llm
    for i in range(args.passes):  # the engines alternate pass by pass (this machine's speed drifts)
        for name in (list(settings) if i % 2 == 0 else list(settings)[::-1]):
            t = time.perf_counter()
            host_overhead.decode_ms(engines[name], prompts, sp)
            results[name][0] += time.perf_counter() - t
    for llm in engines.values():
        llm.shutdown()
    print(f"| call | fixed k={args.k}: us per call | calls | adaptive: us per call | calls |")
    print("| --- | --- | --- | --- | --- |")
    names = [f"{o}.{n}" for o, ns in CALLS.items() for n in ns if only is None or f"{o}.{n}" in only]
    for n in names:
        row = []
        for name in settings:
            _, spent, calls = results[name]
            row += [f"{1e6 * spent[n] / calls[n]:.1f}" if calls[n] else "-", str(calls[n])]
        print(f"| {n} | " + " | ".join(row) + " |")
    print("| all passes (ms) | " + " | ".join(f"{1e3 * results[n][0]:.1f} | " for n in settings) + "")


if __name__ == "__main__":
    main()
