"""Which device kernels a decode step runs, phase by phase (torch profiler), with and without drafts.

    python bench/decode_profile.py [--model DIR] [--device cuda] [--dtype bfloat16] [--batch 1]
        [--k 3] [--steps 16] [--top 25] [--norm-backend triton|torch] [--moe-route-backend triton|torch]
        [--set KEY=VALUE ...] [--json OUT.json]

For each setting (plain decoding, then speculative decoding with a fixed k), after a warm-up call:
--steps decode steps of --batch structured prompts under the torch profiler, each engine phase
(execute: the forward, decode or verify; commit; draft: the MTP forwards; execute_spec: a fused step, `--draft-graph
fused`: verify, commit and drafts) under its own profiler
session, synchronized at its end, so every device kernel it ran (a graph replay's included) is
charged to it. Prints per phase the kernels per step and
device us per step, and the top kernels by device time with their count per step: what a fused
decode path has to remove. On a CPU there are no device kernels; the ops each phase launches are
counted instead (the same table, CPU op names).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from tpserve import LLM, SamplingParams
from tpserve.tools.acceptance import mtp_prompts

PHASES = (("executor", "execute"), ("executor", "commit"), ("executor", "draft"), ("executor", "execute_spec"))


class PhaseProfiles:
    """Each call of a wrapped phase runs under its own profiler session (synchronized at the end, so
    the kernels of a graph replay are inside it); kernel counts and times add up per phase. Kernels
    replayed from a CUDA graph have no launching CPU op to attribute them to, hence one session per call."""

    def __init__(self, device: bool):
        self.device = device
        self.per = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
        self.wall = defaultdict(float)  # us of each phase's calls, synchronized
        self.span = defaultdict(float)  # us from each call's first kernel start to its last kernel end
        self.undo = []

    def wrap(self, obj, name: str) -> None:
        fn = getattr(obj, name)
        acts = [ProfilerActivity.CUDA] if self.device else [ProfilerActivity.CPU]

        def wrapped(*a, **kw):
            with profile(activities=acts) as prof:
                if self.device:
                    torch.cuda.synchronize()
                t = time.perf_counter()
                out = fn(*a, **kw)
                if self.device:
                    torch.cuda.synchronize()
                self.wall[name] += 1e6 * (time.perf_counter() - t)
            self.add(name, prof)
            return out
        setattr(obj, name, wrapped)
        self.undo.append((obj, name))

    def add(self, phase: str, prof) -> None:
        first, last = float("inf"), 0.0
        for ev in prof.events():
            if self.device:
                if ev.device_type != torch.autograd.DeviceType.CUDA:
                    continue
                slot = self.per[phase][ev.name]
                slot[0] += 1
                slot[1] += ev.time_range.elapsed_us()
                first, last = min(first, ev.time_range.start), max(last, ev.time_range.end)
            elif ev.name.startswith("aten::") and (ev.cpu_parent is None or
                                                   not ev.cpu_parent.name.startswith("aten::")):
                slot = self.per[phase][ev.name]  # top-level ops only (views launch nothing on a GPU)
                slot[0] += 1
                slot[1] += ev.self_cpu_time_total
        if last > first:
            self.span[phase] += last - first

    def restore(self) -> None:
        for obj, name in self.undo:
            delattr(obj, name)

    def table(self, steps: int) -> dict:
        """{phase: {"kernels": n per step, "us": device us per step, "top": [(name, count, us), ...]}}."""
        out = {}
        for phase, names in self.per.items():
            rows = sorted(((n, c / steps, us / steps) for n, (c, us) in names.items()), key=lambda r: -r[2])
            out[phase] = {"kernels": sum(r[1] for r in rows), "us": sum(r[2] for r in rows), "top": rows,
                          "wall_us": self.wall[phase] / steps, "span_us": self.span[phase] / steps}
        return out


def profile_setting(llm: LLM, prompts: list[list[int]], sp: SamplingParams, steps: int) -> dict:
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"prof{i}", p, sp)
    while any(not s.in_decode for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()  # prefills done before the profiled steps
    device = eng.device.type == "cuda"
    phases = PhaseProfiles(device)
    for owner, name in PHASES:
        phases.wrap(getattr(eng, owner), name)
    done = 0
    try:
        while done < steps and eng.has_unfinished():
            eng.step()
            done += 1
    finally:
        phases.restore()
    while eng.has_unfinished():
        eng.step()
    return {"steps": done, "device_kernels": device, "phases": phases.table(max(done, 1))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: the built-in demo model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--norm-backend", default=None, help="triton or torch (default: the engine's auto)")
    ap.add_argument("--moe-route-backend", default=None, help="triton or torch (default: the engine's auto)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="any other engine option (e.g. kda_prep_backend=torch); repeatable")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    structured = mtp_prompts()
    prompts = [structured[i % len(structured)] for i in range(args.batch)]
    sp = SamplingParams(temperature=0, max_tokens=args.steps * (args.k + 1) + 8, ignore_eos=True)
    results = {}
    for name, spec in (("off", None), (f"k={args.k}", {"method": "mtp", "num_speculative_tokens": args.k,
                                                      "adaptive": False})):
        kw = {"dtype": args.dtype} if args.dtype else {}
        for opt in ("norm_backend", "moe_route_backend"):
            if getattr(args, opt):
                kw[opt] = getattr(args, opt)
        kw.update(kv.split("=", 1) for kv in args.set)
        llm = LLM(args.model, device=args.device, speculative_config=spec, max_num_seqs=max(args.batch, 8),
                  kv_cache_memory=2 * 2**30, **kw)
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))  # warm-up
        ids = [llm._tokens(p)[0] for p in prompts]
        res = profile_setting(llm, ids, sp, args.steps)
        llm.shutdown()
        results[name] = res
        unit = "device us" if res["device_kernels"] else "CPU us (ops)"
        print(f"\n## {name}: {res['steps']} decode steps at batch {args.batch}")
        print(f"| phase | kernels per step | {unit} per step | first kernel to last, us | wall us (synced) |\n"
              "| --- | --- | --- | --- | --- |")
        for phase, t in sorted(res["phases"].items(), key=lambda kv: -kv[1]["us"]):
            print(f"| {phase} | {t['kernels']:.1f} | {t['us']:.1f} | {t['span_us']:.1f} | {t['wall_us']:.1f} |")
        for phase, t in sorted(res["phases"].items(), key=lambda kv: -kv[1]["us"]):
            print(f"\n{name} / {phase}: top {args.top} by time\n"
                  f"| kernel | per step | {unit} per step |\n| --- | --- | --- |")
            for kname, count, us in t["top"][:args.top]:
                print(f"| {kname[:90]} | {count:.1f} | {us:.1f} |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
