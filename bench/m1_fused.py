"""The one-token NVFP4 MoE experts in one persistent kernel (kernels/nvfp4_m1_fused.py) against nvfp4_m1.experts
(gate|up, then down_sum under PDL), in one process on the same weights (288 experts, top-8, D 4096, I 2048) and 8
seeded routings taken in turn.

Checks: each form against fp32 math (rel err), the fused kernel twice on one workspace (bit for bit: its counters
reset and its sums keep one order), a CUDA graph replay against eager. Timing: quant_kernels.timed (graph replays of
40 calls), the forms in alternation, `--rounds` times. `--timeline` runs the default fused config once more with
%globaltimer marks per item and prints when gate|up and down items start and end (us from the first item's start),
and the items a block took.

    python bench/m1_fused.py [--configs 16:2:1,12:3:1] [--rounds 3] [--timeline] [--json PATH] [--ncu]

A config is warps:stages:blocks_per_sm[:l2_prefetch[:down_pairs]] (blocks_per_sm 0: as many as fit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_decode_sweep import _experts_setup, _nvfp4_moe_case  # noqa: E402
from quant_kernels import rel, timed  # noqa: E402


def pct(v: list[float], q: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def timeline(run, items_gu: int, n_items: int) -> dict:
    marks = torch.zeros(n_items, 3, dtype=torch.int64, device="cuda")
    run(marks)
    run(marks)  # (the second call's marks: compiled, caches warm)
    torch.cuda.synchronize()
    m = marks.cpu()
    t0 = int(m[:, 0].min())
    start, end = (m[:, 0] - t0).double() / 1e3, (m[:, 1] - t0).double() / 1e3
    warp = m[:, 2] & 0xFFFFFFFF
    out = {}
    for name, sl in (("gate|up", slice(0, items_gu)), ("down", slice(items_gu, n_items))):
        s, e = start[sl].tolist(), end[sl].tolist()
        out[name] = {f"start p{q}": round(pct(s, q / 100), 2) for q in (0, 50, 100)}
        out[name].update({f"end p{q}": round(pct(e, q / 100), 2) for q in (0, 50, 90, 99, 100)})
        out[name]["item us median"] = round(statistics.median([b - a for a, b in zip(s, e)]), 2)
    per_warp = torch.bincount(warp).tolist()
    per_warp = [c for c in per_warp if c]
    out["items a block (min / median / max)"] = (min(per_warp), statistics.median(per_warp), max(per_warp))
    out["blocks with items"] = len(per_warp)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="16:2:1:256:2,12:3:1:256:2,8:4:1:256:2,16:2:1:0:2,8:2:1:256:2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeline", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--ncu", action="store_true", help="only run the first config twice, then nvfp4_m1 twice, plainly "
                    "(for Nsight Compute: ncu -k regex:nvfp4_m1 ...)")
    args = ap.parse_args()
    from tpserve.kernels import nvfp4_m1 as m1
    from tpserve.kernels import nvfp4_m1_fused as m1f

    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()
    torch.manual_seed(1)
    routes, touched, floor, ref = _nvfp4_moe_case(P, e, d, i, 1)
    ws = m1f.Workspace(d, i, torch.device("cuda"))
    cfgs = [m1f.Config(*map(int, c.split(":"))) for c in args.configs.split(",")]

    def run(r, f, marks=None):
        ids, w, x = r
        if f == "m1":
            return m1.experts(x, w, ids, P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0)
        return m1f.experts(x, w, ids, P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0, ws, f, marks)

    if args.ncu:
        for f in (cfgs[0], cfgs[0], "m1", "m1"):
            run(routes[0], f)
        torch.cuda.synchronize()
        return
    forms = {"nvfp4_m1 (gate|up, down_sum)": "m1", **{f"fused {c}": c for c in cfgs}}
    res: dict = {"floor_us": floor * 1e6, "touched": touched, "forms": {}}
    base = run(routes[0], "m1")
    for name, f in forms.items():
        out = run(routes[0], f)
        row = dict(rel_err=rel(out, ref), vs_m1=rel(out, base))
        if f != "m1":
            row["repeat_bit_for_bit"] = all(torch.equal(run(r, f), run(r, f)) for r in routes)
            graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
            with torch.cuda.stream(stream), torch.cuda.graph(graph):
                g_out = run(routes[0], f)
            graph.replay()
            torch.cuda.synchronize()
            row["graph_eq_eager"] = bool(torch.equal(g_out, out))
        res["forms"][name] = row
        print(f"{name}: {row}", flush=True)
    times = {k: [] for k in forms}
    for _ in range(args.rounds):
        for name, f in forms.items():
            times[name].append(timed([(lambda r=r, f=f: run(r, f)) for r in routes], reps=40) * 1e6)
    print(f"\nMoE layer, 1 token, {touched:.1f} experts touched, floor {floor * 1e6:.1f} us\n"
          "| form | us (each round) | % of floor (best) | rel err vs fp32 |\n| --- | --- | --- | --- |", flush=True)
    for name in forms:
        res["forms"][name]["us"] = times[name]
        print(f"| {name} | {' / '.join(f'{v:.1f}' for v in times[name])} | "
              f"{100 * floor * 1e6 / min(times[name]):.0f}% | {res['forms'][name]['rel_err']:.1e} |", flush=True)
    if args.timeline:
        items_gu = 8 * i // 16
        n_items = m1f.items_of(cfgs[0], d, i, 8)
        tl = timeline(lambda marks: run(routes[0], cfgs[0], marks), items_gu, n_items)
        res["timeline"] = tl
        print(f"\ntimeline ({cfgs[0]}), us from the first item's start:", flush=True)
        for k, v in tl.items():
            print(f"  {k}: {v}", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
