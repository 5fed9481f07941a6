"""Where the device sits idle in a profiled step, and what the host is doing meanwhile: reads a Chrome trace of
torch.profiler (with_stack on, e.g. `bench/prefix_ttft.py --profile 20 --trace t.json`) and prints the wall span,
the device's busy time, its idle gaps, the idle time by the innermost tpserve (else any Python) frame running on
the host then, and the CUDA runtime calls by host time.

    python bench/trace_gaps.py trace.json [--top 25] [--frame-filter tpserve/]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def analyse(events: list[dict], frame_filter: str, step_us: float = 5.0) -> dict:
    dev = _merge([(e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") in DEVICE_CATS])
    host = [e for e in events if e.get("cat") in ("cpu_op", "python_function", "cuda_runtime", "cuda_driver")]
    if not host:
        raise SystemExit("no host events in the trace")
    t0 = min(e["ts"] for e in host)
    t1 = max(e["ts"] + e.get("dur", 0) for e in host + [{"ts": b} for _, b in dev])
    busy = sum(b - a for a, b in dev)
    gaps, prev = [], t0
    for a, b in dev:
        if a > prev:
            gaps.append((prev, a))
        prev = max(prev, b)
    if t1 > prev:
        gaps.append((prev, t1))
    frames = sorted(((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
                     if e.get("cat") == "python_function"), key=lambda f: f[0])
    mine = [f for f in frames if frame_filter in f[2]] or frames
    starts = [f[0] for f in mine]
    idle_by: collections.Counter = collections.Counter()
    for a, b in gaps:
        t = a + step_us / 2
        while t < b:
            i = bisect.bisect_right(starts, t) - 1
            name = "(no frame)"
            while i >= 0:  # the covering frame that started last: the innermost
                s, e, n = mine[i]
                if e >= t:
                    name = n
                    break
                i -= 1
            idle_by[name] += min(step_us, b - t + step_us / 2)
            t += step_us
    runtime: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            runtime[e["name"]][0] += 1
            runtime[e["name"]][1] += e.get("dur", 0)
    return {"wall_us": t1 - t0, "busy_us": busy, "gaps": gaps, "idle_by": idle_by, "runtime": runtime}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--frame-filter", default="tpserve/")
    args = ap.parse_args()
    with open(args.trace) as f:
        data = json.load(f)
    r = analyse(data["traceEvents"] if isinstance(data, dict) else data, args.frame_filter)
    idle = r["wall_us"] - r["busy_us"]
    big = [g for g in r["gaps"] if g[1] - g[0] >= 20]
    print(f"wall {r['wall_us'] / 1e3:.2f} ms, device busy {r['busy_us'] / 1e3:.2f} ms, idle {idle / 1e3:.2f} ms "
          f"({len(r['gaps'])} gaps, {len(big)} of 20 us or more, those {sum(b - a for a, b in big) / 1e3:.2f} ms)")
    print(f"\n| device idle, ms | host frame (innermost) |\n| --- | --- |")
    for name, us in r["idle_by"].most_common(args.top):
        print(f"| {us / 1e3:.2f} | {name[:110]} |")
    print(f"\n| runtime call | calls | host ms |\n| --- | --- | --- |")
    for name, (n, us) in sorted(r["runtime"].items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"| {name} | {n} | {us / 1e3:.2f} |")


if __name__ == "__main__":
    main()
