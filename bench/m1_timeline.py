"""Where nvfp4_m1's one-token MoE experts spend their time: each block's start, the end of its prologue (up to
the block-wide sync before the K loop: the first W stages issued and x staged) and the end of its K loop, read
from %globaltimer in copies of the gate|up and down kernels built with those reads added (kernels/nvfp4_m1.py's
source, patched here; the kernels the engine runs are untouched), and the SM each block ran on. The experts run
as `experts` runs them (gate|up, then down as its programmatic dependent on sm_90+), 8 routings in turn in one
CUDA graph; the last replay's timelines are summarised per kernel (all times in us from the first gate|up
block's start of that routing).

    python bench/m1_timeline.py [--tokens 1 8] [--down-stages N] [--down-cap N] [--json PATH] [--raw PATH]

`--ncu` instead runs the plain experts a few times for Nsight Compute (`ncu -k regex:nvfp4_m1 ...`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_decode_sweep import _experts_setup, _nvfp4_moe_case  # noqa: E402

MARKS = 4  # per block: start, prologue done, K loop done, SM id


def patched(cfg, mode: str, h_shift: bool = False) -> tuple[str, str]:
    """nvfp4_m1's source of (cfg, mode) with the timeline reads added; raises where a patch point moved."""
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    text, name = m1.source(cfg, mode, h_shift)
    name2 = name + "_timeline"
    edits = [
        (f"NAME {name}\n", f"NAME {name2}\n"),
        ("double limit_d) {", "double limit_d, unsigned long long* __restrict__ tl) {\n"
         "  unsigned long long tm0, tm1, tm2; unsigned smid;\n"
         "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(tm0));"),
        ("tab[lane] = make_uint4(FP4_HI0, FP4_HI1, FP4_LO0, FP4_LO1);\n  __syncthreads();",
         "tab[lane] = make_uint4(FP4_HI0, FP4_HI1, FP4_LO0, FP4_LO1);\n  __syncthreads();\n"
         "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(tm1));"),
        ("asm volatile(\"cp.async.wait_group 0;\");\n",
         "asm volatile(\"cp.async.wait_group 0;\");\n"
         "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(tm2));\n"
         "  asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(smid));\n"
         "  if (threadIdx.x == 0) { unsigned long long* o = tl + 4 * (blockIdx.y * gridDim.x + blockIdx.x);\n"
         "    o[0] = tm0; o[1] = tm1; o[2] = tm2; o[3] = smid; }\n"),
    ]
    for old, new in edits:
        if text.count(old) != 1:
            raise RuntimeError(f"patch point not found once in {name}: {old[:40]!r}")
        text = text.replace(old, new)
    return text, name2


class Experts:
    """nvfp4_m1.experts at one or more tokens with the default configs, down summing choices at one token, its
    kernels the patched copies; `tl` holds each kernel's block marks."""

    def __init__(self, P, d2, t: int, e: int, d: int, i: int, down_stages: int = 0, down_cap: int = 0):
        from torch.cuda import _compile_kernel

        from tpserve.kernels.launch import ex_cuda as launch_ex
        from tpserve.kernels.quant import nvfp4_m1_cuda as m1

        self.P, self.d2, self.t, self.e, self.d, self.i = P, d2, t, e, d, i
        self.sum = t == 1
        self.down_mode = "down_sum" if self.sum else "down"
        self.cg = m1.default_config("gate_up", i, 8 * t)
        self.cd = m1.default_config(self.down_mode, d, 8 * t)
        if down_stages:
            self.cd = dataclasses.replace(self.cd, stages=down_stages)
        cc = "".join(map(str, torch.cuda.get_device_capability()))
        # (gate|up writing h as a "shift" down kernel reads it, as `experts` launches them)
        self.kg = _compile_kernel(*patched(self.cg, "gate_up", self.cd.decode == "shift"), compute_capability=cc)
        self.kd = _compile_kernel(*patched(self.cd, self.down_mode), compute_capability=cc)
        self.sg, self.sd = self.cg.smem(2, d), self.cd.smem(1, i, 8 if self.sum else 1)
        launch_ex.reserve_smem(self.kg, self.sg)
        launch_ex.reserve_smem(self.kd, self.sd)
        if down_cap:
            self.sd = launch_ex.cap_blocks(self.kd, torch.cuda.current_device(), self.sd, down_cap)
        self.grid_g = (-(-i // (16 * self.cg.rows)), 8 * t, 1)
        self.grid_d = (-(-d // (16 * self.cd.rows)), t if self.sum else 8 * t, 1)
        self.pdl = launch_ex.supported(torch.device("cuda"))

    def buffers(self):
        ng, nd = self.grid_g[0] * self.grid_g[1], self.grid_d[0] * self.grid_d[1]
        return (torch.zeros(ng, MARKS, dtype=torch.int64, device="cuda"),
                torch.zeros(nd, MARKS, dtype=torch.int64, device="cuda"))

    def __call__(self, route, tls):
        from tpserve.kernels.launch import ex_cuda as launch_ex
        from tpserve.kernels.quant import gemv_cuda as mg

        ids, w, x = route
        P, t, e = self.P, self.t, self.e
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        wf = w.reshape(-1).float().contiguous()
        h = torch.empty(8 * t, self.i, dtype=torch.bfloat16, device="cuda")
        y = torch.empty(t if self.sum else 8 * t, self.d, dtype=torch.bfloat16 if self.sum else torch.float32,
                        device="cuda")
        gu = [mg._aligned(P["gp"], 16), P["gb"].view(torch.uint8), P["g2"].float().contiguous(),
              mg._aligned(x, 16).view(torch.int16), flat, P["g2"], h.view(torch.int16), self.i, self.d, 8, e, 10.0,
              tls[0]]
        dn = [mg._aligned(P["dp"], 16), P["db"].view(torch.uint8), self.d2, h.view(torch.int16), flat, wf,
              y.view(torch.int16) if self.sum else y, self.d, self.i, 8, e, 10.0, tls[1]]
        self.kg(grid=self.grid_g, block=(32 * self.cg.splits, 1, 1), shared_mem=self.sg, args=gu)
        if self.pdl:
            launch_ex.launch_pdl(self.kd, self.grid_d, (32 * self.cd.splits, 1, 1), self.sd, dn)
        else:
            self.kd(grid=self.grid_d, block=(32 * self.cd.splits, 1, 1), shared_mem=self.sd, args=dn)
        return y


def pct(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def summarise(tg: torch.Tensor, td: torch.Tensor) -> dict:
    """Per kernel, in us from gate|up's first block start: starts (first / median / last), prologue after start
    (median / max), the K loop (median / max), block ends (first / median / last), blocks per SM (max)."""
    t0 = int(tg[:, 0].min())
    out = {}
    for name, tl in (("gate_up", tg), ("down", td)):
        rows = [[(int(a) - t0) / 1e3, (int(b) - t0) / 1e3, (int(c) - t0) / 1e3, int(s)] for a, b, c, s in tl.tolist()]
        start = [r[0] for r in rows]
        staged = [r[1] - r[0] for r in rows]
        loop = [r[2] - r[1] for r in rows]
        end = [r[2] for r in rows]
        per_sm: dict = {}
        for r in rows:
            per_sm[r[3]] = per_sm.get(r[3], 0) + 1
        out[name] = dict(blocks=len(rows), sms=len(per_sm), max_blocks_per_sm=max(per_sm.values()),
                         start=[min(start), statistics.median(start), max(start)],
                         staged=[statistics.median(staged), max(staged)],
                         loop=[min(loop), statistics.median(loop), max(loop)],
                         end=[min(end), statistics.median(end), pct(end, 0.9), max(end)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--json", default=None)
    ap.add_argument("--raw", default=None, help="torch.save every block's marks here ({tokens: [(gate_up, down)]})")
    ap.add_argument("--down-stages", type=int, default=0, help="the down kernel's stages (0: its default)")
    ap.add_argument("--down-cap", type=int, default=0, help="blocks of the down kernel an SM may hold (0: no cap)")
    ap.add_argument("--ncu", action="store_true", help="run the plain experts 4 times (for ncu) and stop")
    args = ap.parse_args()
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()
    if args.ncu:
        for t in args.tokens:
            routes = _nvfp4_moe_case(P, e, d, i, t)[0]
            for r in routes[:4]:
                m1.experts(r[2], r[1], r[0], P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0)
        torch.cuda.synchronize()
        return
    res, raw = {}, {}
    for t in args.tokens:
        routes, touched, floor, ref = _nvfp4_moe_case(P, e, d, i, t)
        ex = Experts(P, d2, t, e, d, i, args.down_stages, args.down_cap)
        tls = [ex.buffers() for _ in routes]
        y = ex(routes[0], tls[0]).float()
        base = m1.experts(routes[0][2], routes[0][1], routes[0][0], P["gp"], P["gb"], P["g2"], P["dp"], P["db"],
                          d2, 10.0).float()
        if ex.sum:
            same = torch.equal(y, base)
        else:
            same = True  # (down per pair writes fp32 rows; the combine is not in this copy)
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.cuda.graph(graph):
            for r, tl in zip(routes, tls):
                ex(r, tl)
        for _ in range(20):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        per = start.elapsed_time(end) / 20 / len(routes) * 1e3
        sums = [summarise(*tl) for tl in tls]
        raw[t] = [(a.cpu(), b.cpu()) for a, b in tls]
        res[t] = dict(touched=touched, floor_us=floor * 1e6, graph_us_per_layer=per, same_as_experts=same,
                      routings=sums, down_start_after_gate_up_start=[])
        print(f"\n{t} token(s): {touched:.1f} experts touched, floor {floor * 1e6:.1f} us; the patched pair in a graph "
              f"{per:.1f} us a layer ({100 * floor * 1e6 / per:.0f}%); down's output == experts' {same}")
        print("| routing | kernel | blocks (SMs, max a SM) | starts first / med / last | prologue med / max | "
              "K loop min / med / max | ends first / med / p90 / last |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for j, s in enumerate(sums):
            for k, v in s.items():
                f = lambda xs: " / ".join(f"{a:.1f}" for a in xs)  # noqa: E731
                print(f"| {j} | {k} | {v['blocks']} ({v['sms']}, {v['max_blocks_per_sm']}) | {f(v['start'])} | "
                      f"{f(v['staged'])} | {f(v['loop'])} | {f(v['end'])} |")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if args.raw:
        torch.save(raw, args.raw)


if __name__ == "__main__":
    main()
