"""Where a decode step's time goes, phase by phase, with and without speculative decoding.

    python bench/spec_breakdown.py [--batch 1] [--k 3] [--adaptive] [--max-tokens 96] [--device cpu|cuda]
        [--dtype D] [--draft-graph fused|chain|depth] [--steps decode|prefill] [--profile N]

One generate call of --batch requests (the structured prompts of `bench spec`), greedy, after a
warm-up call. Every engine phase is timed around a device synchronize (so GPU work is charged to
the phase that queued it): schedule, plan (host buffers), execute (the model forward: decode or
verify), sample (plain decoding), verify (acceptance on the host), commit (KDA state of the
accepted drafts), draft (the MTP forwards), propose minus draft (the policy and bookkeeping), and
the rest of the step (outputs); a fused step (`--draft-graph fused`) charges its verify, commit and drafts
to execute and its host walk to verify. Steps that hold a prefill chunk are left out (`--steps prefill`: only
they are timed, the draft phase then holding the MTP layer's pass over the prompts). Prints ms per step and
ms per emitted token for each phase; the synchronizes cost a little, so the step total is also
given without them (a second call, untimed phases). `--profile N`: also the N operators that take the most host
time in those steps (torch.profiler, one more call), with their device time.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from tpserve import LLM, SamplingParams
from tpserve.engine import sampler
from tpserve.tools.bench.spec import Step, decode_rate, step_times
from tpserve.tools.acceptance import mtp_prompts


class PhaseTimer:
    """Wraps methods so that each call adds its synchronized wall time to `totals[name]`."""

    def __init__(self, device: str):
        self.totals: dict[str, float] = defaultdict(float)
        self.sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        self.undo: list[tuple[object, str]] = []

    def call(self, name: str, fn, *a, **kw):
        """fn(*a, **kw), its synchronized wall time added to totals[name]."""
        self.sync()
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            self.sync()
            self.totals[name] += time.perf_counter() - t

    def wrap(self, obj, attr: str, name: str) -> None:
        fn = getattr(obj, attr)
        setattr(obj, attr, lambda *a, **kw: self.call(name, fn, *a, **kw))
        self.undo.append((obj, attr))

    def restore(self) -> None:
        for obj, attr in reversed(self.undo):
            if attr in vars(obj):
                delattr(obj, attr)
        self.undo.clear()


def breakdown(llm: LLM, prompts: list[str], sp: SamplingParams, device: str, prefill_steps: bool = False) -> dict:
    """Phases of the decode steps (or the prefill steps) of one generate call. Async scheduling is off meanwhile:
    the timer waits for the device around every phase, so nothing would overlap anyway, and its sampling is not
    `sampler.sample`."""
    eng = llm.engine
    overlap, eng.overlap = eng.overlap, False
    timer = PhaseTimer(device)
    timer.wrap(eng.scheduler, "schedule", "schedule")
    timer.wrap(eng, "_plan", "plan")
    timer.wrap(eng.executor, "execute", "execute")
    timer.wrap(eng.executor, "commit", "commit")
    timer.wrap(eng.executor, "draft", "draft")
    if eng.speculator is not None:
        timer.wrap(eng.executor, "execute_spec", "execute")  # a fused step: verify, commit and drafts
        timer.wrap(eng.speculator, "verify_fused", "verify")
        timer.wrap(eng.speculator, "verify", "verify")
        timer.wrap(eng.speculator, "propose", "propose")
    original_sample = sampler.sample
    sampler.sample = lambda *a, **kw: timer.call("sample", original_sample, *a, **kw)  # a module function
    decode = defaultdict(float)
    steps = tokens = 0
    try:
        with step_times(eng) as timed_steps:
            step = eng.step  # step_times' wrapper: it records the step when it returns

            def step_with_phases():
                nonlocal steps, tokens
                snap = dict(timer.totals)
                out = step()
                last = timed_steps[-1] if timed_steps else Step(0.0, True, 0)
                if last.prefill == prefill_steps:
                    for name, total in timer.totals.items():
                        decode[name] += total - snap.get(name, 0.0)
                    decode["step"] += last.seconds
                    steps, tokens = steps + 1, tokens + last.tokens
                return out
            eng.step = step_with_phases
            llm.generate(prompts, sp)
            eng.step = step  # step_times removes its wrapper on exit
    finally:
        sampler.sample = original_sample
        timer.restore()
        eng.overlap = overlap
    return {"steps": steps, "tokens": tokens, "phases": dict(decode)}


def untimed_ms_per_token(llm: LLM, prompts: list[str], sp: SamplingParams, prefill_steps: bool = False) -> float:
    with step_times(llm.engine) as steps:
        llm.generate(prompts, sp)
    if prefill_steps:
        timed = [s for s in steps if s.prefill]
        return 1e3 * sum(s.seconds for s in timed) / max(1, sum(s.tokens for s in timed))
    rate = decode_rate(steps)
    return 1e3 / rate if rate else float("nan")


def profile_steps(llm: LLM, prompts: list[str], sp: SamplingParams, prefill_steps: bool, top: int) -> str:
    """The operators with the most host time in the first chosen step of one generate call, with their device
    time: the profiler records from the step's schedule (once it shows the step's kind) to the step's end."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    eng = llm.engine
    step, schedule = eng.step, eng.scheduler.schedule
    prof, tables = [None], []

    def chosen_schedule():
        scheduled = schedule()
        if any(not s.decode for s in scheduled) == prefill_steps and not tables and prof[0] is None:
            prof[0] = profile(activities=activities)
            prof[0].__enter__()
        return scheduled

    def chosen_step():
        try:
            return step()
        finally:
            if prof[0] is not None:
                torch.cuda.synchronize() if torch.cuda.is_available() else None
                prof[0].__exit__(None, None, None)
                tables.append(prof[0].key_averages().table(sort_by="cpu_time_total", row_limit=top))
                prof[0] = None
    eng.step, eng.scheduler.schedule = chosen_step, chosen_schedule
    try:
        llm.generate(prompts, sp)
    finally:
        del eng.step, eng.scheduler.schedule
    return tables[0] if tables else "(no such step)"


PHASES = ("schedule", "plan", "execute", "sample", "verify", "commit", "draft", "propose", "step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--adaptive", action="store_true", help="the speculative setting picks k <= --k per step")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--draft-graph", default=None)
    ap.add_argument("--steps", choices=("decode", "prefill"), default="decode", help="which steps to time")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="also the N operators with the most host time")
    args = ap.parse_args()
    prefill_steps = args.steps == "prefill"
    structured = mtp_prompts()
    prompts = [structured[i % len(structured)] for i in range(args.batch)]
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    rows = []
    spec_name = f"adaptive (k<={args.k})" if args.adaptive else f"k={args.k}"
    spec = {"method": "mtp", "num_speculative_tokens": args.k}  # adaptive: bench spec's setting (defaults)
    if not args.adaptive:
        spec.update(adaptive=False, truncate_threshold=0.0)
    for name, spec in (("off", None), (spec_name, spec)):
        kw = {"dtype": args.dtype} if args.dtype else {}
        if args.draft_graph:
            kw["draft_graph"] = args.draft_graph
        llm = LLM(device=args.device, speculative_config=spec, max_num_seqs=max(args.batch, 8),
                  kv_cache_memory=2 * 2**30, **kw)
        llm.generate(prompts, sp)  # warm-up: kernels compiled, graphs replayed once
        res = breakdown(llm, prompts, sp, args.device, prefill_steps)
        res["untimed_ms_per_token"] = untimed_ms_per_token(llm, prompts, sp, prefill_steps)
        if args.profile:
            print(f"{name}: the {args.steps} steps' operators\n" + profile_steps(llm, prompts, sp, prefill_steps,
                                                                                 args.profile))
        rows.append((name, res))
        llm.shutdown()
    print(f"| setting | {args.steps} steps | tokens per step | " + " | ".join(f"{p} ms" for p in PHASES)
          + " | rest ms | ms per token (synced) | ms per token (not synced) |")
    print("| --- " * (len(PHASES) + 6) + "|")
    for name, res in rows:
        ph, n = res["phases"], max(1, res["steps"])
        own = {p: ph.get(p, 0.0) for p in PHASES}
        own["propose"] -= own["draft"]  # drafting runs inside propose
        rest = own["step"] - sum(v for p, v in own.items() if p != "step")
        cells = " | ".join(f"{1e3 * own[p] / n:.3f}" for p in PHASES)
        print(f"| {name} | {res['steps']} | {res['tokens'] / n:.2f} | {cells} | {1e3 * rest / n:.3f} | "
              f"{1e3 * own['step'] / max(1, res['tokens']):.3f} | {res['untimed_ms_per_token']:.3f} |")
    print("(propose ms excludes draft ms; rest = the step minus every timed phase: outputs, bookkeeping)")


if __name__ == "__main__":
    main()
