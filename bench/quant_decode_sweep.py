"""The quantized decode kernels on one GPU by section: the defaults against their floors, and config sweeps around
them to retune a default (each config checked against fp32 math before it is timed).

Floors: bytes / the card's HBM bandwidth (quant_kernels.card_figures): W8A16 12288 x 4096 50.3 MB, W4A16 28.3 MB; MoE
decode (288 experts, top-8, D 4096, I 2048) the bytes of the experts a batch touches, each once. Times: graph replays
over weight copies (4 x L2 in all) or 8 routings in turn (quant_kernels.timed). "engine": the GEMV that
kernels/quant/dispatch.py's LINEAR table picks under the default switches (--quant-gemv-backend cuda), launched
plainly.
  gemv     the Triton GEMVs (`w8a16` / `w4a16`: one format) at 1 and 8 rows: configs around their tile defaults on
           12288 x 4096 (the five best printed), then the best three beside the default on 4096 x 12288
  rows     the Triton one-row kernels (FP8, NVFP4) on both shapes, every config printed beside the default
  mma      gemv_cuda (mma_gemv): its configs on odd shapes against fp32 math, every e4m3 code, a graph replay; then
           both shapes at 8 and 1 rows, the configs beside the engine, the best also at 2 and 4 rows
  mmapdl   the engine's GEMVs at 1, 2, 4, 8 rows, both shapes: launched plainly, each a programmatic dependent of the
           call before (--pdl), and the Triton kernels (--quant-gemv-backend triton); twice in alternation
  m1       nvfp4_m1's one-row NVFP4 GEMV: its configs on odd shapes against fp32 math, a graph replay, then both
           shapes over its configs beside mma_gemv and the Triton kernel
  m1def    the NVFP4 one-row GEMV (the engine's nvfp4_m1, mma_gemv, Triton) on both shapes; the MoE experts
           (nvfp4_m1's defaults, the grouped Triton experts) at 1, 8, 16 and 32 tokens
  m1exp    nvfp4_m1's experts at 1 and 8 tokens: a graph replay; gate|up's config swept (down at its default), then
           down's
  moe      the grouped Triton experts (NVFP4, FP8) at 1 and 8 tokens over tiles, warps and stages; the best one's
           device time by kernel (torch.profiler) and its two GEMM kernels' share of the floor
  prefill  bf16 grouped MoE prefill at 4k / 16k tokens: torch combine and SwiGLU, the engine's Triton ones, the two
           grouped GEMMs alone; the engine form's device time by kernel
bench/m1_experts.py and m1_timeline.py take its experts' weights and routings (_experts_setup, _nvfp4_moe_case).
Usage: PYTHONPATH=src python bench/quant_decode_sweep.py [--sections mmapdl,m1def,moe,prefill] [--out DIR]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_kernels import (BF16_PEAK, HBM, MAX_REL_ERR, ROUTE, copies_for, profile_kernels,  # noqa: E402
                           quantized_experts, rel, run_sections, timed)

SHAPES = ((12288, 4096), (4096, 12288))
# Triton GEMV configs (block_n, block_k, warps, stages, waves (0: no K split), form). Forms: False (FP8: FMAs at one
# row, the per-value decode above), "a" / "b" (the decoded tile as the tensor cores' A operand, 16 rows of W a
# warp, or B), "row" (NVFP4's one-row kernel), "planes" (NVFP4's nibble-planes kernel)
ROW8 = [(bn, bk, nw, 3, wv, False) for bn in (4, 8, 16, 32) for bk in (1024, 2048, 4096) for nw in (4, 8)
        for wv in (0, 2)]
ROW4 = [(bn, bk, nw, 1, wv, "row") for bn in (16, 32) for bk in (256, 512, 1024) for nw in (4, 8) for wv in (0, 4, 8)]
MULTI8 = ([(bn, 128, nw, ns, wv, qt) for bn, nw, qt in ((32, 2, "a"), (64, 4, "a"), (128, 8, "a"), (32, 4, "b"),
                                                        (64, 4, "b")) for ns in (3, 4) for wv in (0, 2, 4)]
          + [(bn, 128, 4, 3, wv, False) for bn in (32, 64) for wv in (0, 4)])
MULTI4 = ([(bn, bk, nw, ns, wv, "planes") for bn, nw in ((32, 2), (64, 4), (128, 8)) for bk in (128, 256)
           for ns in (2, 3) for wv in (0, 2)]
          + [(bn, bk, 4, 3, wv, qt) for bn, bk, qt in ((32, 512, "b"), (64, 256, "a")) for wv in (0, 4)])
ODD = ((1000, 256, 3), (4096, 512, 8), (48, 1024, 1), (12288 + 16, 512, 5))  # (N, K, rows): odd N, K 1-2 chunks


def sweep(configs, make, check, top=5):
    """[(seconds, config)] fastest first, of the configs whose answer is right (relative error <= MAX_REL_ERR): the
    best `top`, then every named form (a str: "default", "engine", ...) beyond them."""
    out = []
    for c in configs:
        try:
            e = check(c)
            if e > MAX_REL_ERR:
                print(f"  {c}: WRONG, rel err {e:.1e}", flush=True)
                continue
            out.append((timed(make(c)), c))
        except Exception as exc:  # noqa: BLE001  (out of registers / shared memory: report, go on)
            print(f"  {c}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}", flush=True)
    out.sort(key=lambda tc: tc[0])
    return out[:top] + [tc for tc in out[top:] if isinstance(tc[1], str)]


def _fp8():
    """(quantize: w -> (packed, dequantized fp32 w), call(x, packed, config or "default"): the Triton W8A16 GEMV,
    weight bytes(n, k))."""
    from tpserve.kernels.quant import ref as qr
    from tpserve.kernels.quant.gemv_triton import w8a16_gemv

    def quantize(w):
        q, s = qr.fp8_block_quantize(w)
        return (q, s), qr.fp8_block_dequantize(q, s)

    def call(x, p, c):
        if c == "default":
            return w8a16_gemv(x, *p, (128, 128))
        bn, bk, nw, ns, wv, qt = c
        return w8a16_gemv(x, *p, (128, 128), block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, waves=wv,
                          qtile=bool(qt), qtile_a=qt != "b")

    return quantize, call, lambda n, k: n * k + (n // 128) * (k // 128) * 4


def _fp4():
    """As _fp8 for NVFP4 (the global scale one per row) and the Triton W4A16 GEMV."""
    from tpserve.kernels.quant import ref as qr
    from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv

    def quantize(w):
        p, bs, s2 = qr.nvfp4_quantize(w)
        return (p, bs, s2.reshape(1).expand(w.shape[0]).contiguous()), qr.nvfp4_dequantize(p, bs, s2)

    def call(x, p, c):
        if c == "default":
            return w4a16_gemv(x, *p)
        bn, bk, nw, ns, wv, form = c
        kind = (dict(row=True) if form == "row" else dict(planes=True) if form == "planes"
                else dict(qtile=True, qtile_a=form != "b", fp32_decode=False))
        return w4a16_gemv(x, *p, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, waves=wv, **kind)

    return quantize, call, lambda n, k: n * k // 2 + n * k // 16


def _engine(fmt: str, quant_gemv: str = "cuda", pdl: bool = False):
    """(x, packed) -> y through the kernel kernels/quant/dispatch.py's LINEAR table picks under these switches, on
    _fp8 / _fp4's packed weights (NVFP4's global scale already one per row: no per-call expand)."""
    from tpserve.kernels.quant import gemv_cuda, nvfp4_m1_cuda
    from tpserve.kernels.quant.dispatch import LinearDispatch
    from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv

    d = LinearDispatch("triton", quant_gemv, pdl)
    if fmt == "fp8":
        return lambda x, p: d.fp8_block(x, *p, (128, 128))
    triton_forms = {"triton_nvfp4_row": dict(row=True), "triton_nvfp4_planes": dict(planes=True),
                    "triton_nvfp4_gemv": dict(row=False, planes=False)}

    def nvfp4(x, p):
        kernel = d.kernel("nvfp4", x, p[0], p[0].shape[1] * 2, p[0].shape[0])
        if kernel == "cuda_nvfp4_m1":
            return nvfp4_m1_cuda.gemv(x, *p)
        if kernel == "cuda_nvfp4_gemv":
            return gemv_cuda.nvfp4_gemv(x, *p, pdl=pdl)
        return w4a16_gemv(x, *p, **triton_forms[kernel])

    return nvfp4


def _weights(quantize, nbytes, n, k):
    """Random [n, k] weights quantized, the copies that rotate over 4 x L2, the dequantized fp32 and the floor (s)."""
    w = torch.randn(n, k, device="cuda") / k**0.5
    packed, wd = quantize(w)
    packs = [packed] + [tuple(t.clone() for t in packed) for _ in range(copies_for(nbytes(n, k)) - 1)]
    return packed, packs, wd, nbytes(n, k) / HBM


def _case(res, key, cfgs, call, x, packed, packs, ref, floor, top=5):
    """Sweep cfgs at one case (checked against ref, then timed over the weight copies), store and print the best
    `top` (res[key]["best"]) and return them as [(seconds, config)]."""
    t0 = time.time()
    best = sweep(cfgs, lambda c: [(lambda p=p: call(x, p, c)) for p in packs], lambda c: rel(call(x, packed, c), ref),
                 top=top)
    res[key] = dict(floor_us=floor * 1e6, best=[(c, t * 1e6) for t, c in best])
    print(f"\n{key} (floor {floor * 1e6:.1f} us; {len(cfgs)} configs, {time.time() - t0:.0f} s)", flush=True)
    for t, c in best:
        print(f"  {t * 1e6:6.1f} us  {100 * floor / t:3.0f}% of floor  {c}", flush=True)
    return best


def _odd_shapes(res, key, quantize, cfgs, run, rows=None) -> None:
    """Every config on the ODD shapes (at `rows` rows, else each shape's) against fp32 math; the worst error."""
    worst = 0.0
    for n, k, m in ODD:
        packed, wd = quantize(torch.randn(n, k, device="cuda") / k**0.5)
        x = torch.randn(rows or m, k, device="cuda").bfloat16()
        ref = x.float() @ wd.T
        for c in cfgs:
            e = rel(run(x, packed, c), ref)
            worst = max(worst, e)
            if e > 4e-3:
                print(f"  {key} {n}x{k} M={x.shape[0]} {c}: WRONG, rel err {e:.1e}", flush=True)
    res[f"{key} odd shapes worst rel err"] = worst
    print(f"{key}: odd shapes, {len(cfgs)} configs: worst rel err against fp32 math {worst:.1e}", flush=True)


def _graph_eq(res, key, fn) -> None:
    """fn() replayed from a CUDA graph against its eager output, bit for bit."""
    eager = fn()
    g, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(g):
        out = fn()
    g.replay()
    torch.cuda.synchronize()
    res[f"{key} graph == eager"] = bool(torch.equal(out, eager))
    print(f"{key}: graph replay == eager {res[f'{key} graph == eager']}", flush=True)


def sec_gemv(res, only=None, every=False):
    """every (the rows section): one row, every config on both shapes, all printed."""
    for name, spec, lists in (("w8a16", _fp8, {1: ROW8, 8: MULTI8}), ("w4a16", _fp4, {1: ROW4, 8: MULTI4})):
        if only and name != only:
            continue
        quantize, call, nbytes = spec()
        for n, k in SHAPES:
            packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
            for m in (1,) if every else (1, 8):
                x = torch.randn(m, k, device="cuda").bfloat16()
                first = f"{name} {SHAPES[0][0]}x{SHAPES[0][1]} M={m}"
                cfgs = (lists[m] if every or (n, k) == SHAPES[0]
                        else [c for c, _ in res[first]["best"] if c != "default"][:3])
                _case(res, f"{name}{' row' * every} {n}x{k} M={m}", ["default"] + cfgs, call, x, packed, packs,
                      x.float() @ wd.T, floor, top=len(cfgs) + 1 if every else 5)


def sec_mma(res):
    from tpserve.kernels.quant import gemv_cuda as mg
    from tpserve.kernels.quant import ref as qr

    for fmt, spec in (("fp8", _fp8), ("nvfp4", _fp4)):
        quantize, _, nbytes = spec()
        gemv = mg.fp8_gemv if fmt == "fp8" else mg.nvfp4_gemv
        cfgs = [mg.Config(fmt, r, sp, d, pf, il) for r, depths in ((1, (2, 4, 6)), (2, (2, 3)))
                for sp in (2, 4, 8) for d in depths for pf in (0, 256) for il in (False, True)]
        _odd_shapes(res, f"mma {fmt}", quantize, cfgs, lambda x, p, c: gemv(x, *p, cfg=c))
        packed, _ = quantize(torch.randn(4096, 4096, device="cuda") / 64)
        x = torch.randn(8, 4096, device="cuda").bfloat16()
        _graph_eq(res, f"mma {fmt}", lambda: gemv(x, *packed))
        engine = _engine(fmt)

        def mcall(x, p, c):
            return engine(x, p) if c == "engine" else gemv(x, *p, cfg=c)

        for n, k in SHAPES:
            packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
            for m in (8, 1):
                x = torch.randn(m, k, device="cuda").bfloat16()
                key = f"mma {fmt} {n}x{k} M={m}"
                best = _case(res, key, ["engine"] + cfgs, mcall, x, packed, packs, x.float() @ wd.T, floor, top=6)
                res[key]["best"] = [(str(c), us) for c, us in res[key]["best"]]
                top = next((c for _, c in best if c != "engine"), None)
                for mm in (2, 4) if top else ():
                    xm = torch.randn(mm, k, device="cuda").bfloat16()
                    t = timed([(lambda p=p: gemv(xm, *p, cfg=top)) for p in packs])
                    res[f"{key[:-4]} M={mm} {top}"] = dict(us=t * 1e6, pct=100 * floor / t)
                    print(f"  M={mm} {top}: {t * 1e6:.1f} us ({100 * floor / t:.0f}%)", flush=True)
    # every e4m3 code (subnormals, zero, +-448; not the NaNs) in one row through the FP8 decode: the sum exact
    codes = torch.arange(256, device="cuda", dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]
    q = codes.view(torch.float8_e4m3fn).repeat(16, 2)[:, :256].contiguous()
    s = torch.ones(1, 2, device="cuda")
    x = torch.ones(1, 256, device="cuda").bfloat16()
    y, ref = mg.fp8_gemv(x, q, s).float(), (x.float() @ qr.fp8_block_dequantize(q, s).T)
    res["mma e4m3 codes sum exact"] = bool(torch.equal(y, ref.bfloat16().float()))
    print(f"mma: every e4m3 code summed: {y[0, 0].item()} (fp32 math {ref[0, 0].item()})", flush=True)


def sec_mmapdl(res):
    print("| format | N x K | M | floor us | plain us (twice) | PDL us (twice) | Triton us (twice) | % floor plain / "
          "PDL (best) | bit for bit |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for fmt, spec in (("fp8", _fp8), ("nvfp4", _fp4)):
        quantize, _, nbytes = spec()
        forms = {"plain": _engine(fmt), "pdl": _engine(fmt, pdl=True), "triton": _engine(fmt, "triton")}
        for n, k in SHAPES:
            packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
            for m in (1, 2, 4, 8):  # (one FP8 row: the Triton row kernel plainly, gemv_cuda under PDL)
                x = torch.randn(m, k, device="cuda").bfloat16()
                same = torch.equal(forms["plain"](x, packed), forms["pdl"](x, packed))
                err = rel(forms["pdl"](x, packed), x.float() @ wd.T)
                times = {f: [] for f in forms}
                for _ in range(2):
                    for f, fn in forms.items():
                        times[f].append(timed([(lambda p=p, fn=fn: fn(x, p)) for p in packs]) * 1e6)
                res[f"mmapdl {fmt} {n}x{k} M={m}"] = dict(floor_us=floor * 1e6, equal=same, rel_err=err,
                                                          **{f"{f}_us": t for f, t in times.items()})
                cols = " | ".join(" / ".join(f"{t:.1f}" for t in times[f]) for f in forms)
                print(f"| {fmt} | {n} x {k} | {m} | {floor * 1e6:.1f} | {cols} | "
                      f"{100 * floor * 1e6 / min(times['plain']):.0f}% / "
                      f"**{100 * floor * 1e6 / min(times['pdl']):.0f}%** | {same} |", flush=True)


def sec_m1(res):
    from tpserve.kernels.quant import gemv_cuda as mg
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    quantize, call, nbytes = _fp4()
    cfgs = [m1.Config(r, sp, st, 256, dec) for r in (1, 2) for sp in (2, 4, 8) for st in (2, 3)
            for dec in ("lut", "shift")]
    _odd_shapes(res, "m1", quantize, cfgs, lambda x, p, c: m1.gemv(x, *p, c), rows=1)
    packed, _ = quantize(torch.randn(4096, 4096, device="cuda") / 64)
    x = torch.randn(1, 4096, device="cuda").bfloat16()
    _graph_eq(res, "m1", lambda: m1.gemv(x, *packed))
    forms = {"triton": lambda x, p: call(x, p, "default"), "mma_gemv": lambda x, p: mg.nvfp4_gemv(x, *p)}

    def dcall(x, p, c):
        return forms[c](x, p) if isinstance(c, str) else m1.gemv(x, *p, c)

    for n, k in SHAPES:
        packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
        x = torch.randn(1, k, device="cuda").bfloat16()
        key = f"m1 dense {n}x{k} M=1"
        _case(res, key, list(forms) + cfgs, dcall, x, packed, packs, x.float() @ wd.T, floor, top=8)
        res[key]["best"] = [(str(c), us) for c, us in res[key]["best"]]


def _experts_setup():
    e, d, i = 288, 4096, 2048
    g = torch.Generator(device="cuda").manual_seed(0)
    gu = torch.randn(e, 2 * i, d, device="cuda", generator=g, dtype=torch.bfloat16) / d**0.5
    dn = torch.randn(e, d, i, device="cuda", generator=g, dtype=torch.bfloat16) / i**0.5
    return quantized_experts(gu, dn), e, d, i


def _nvfp4_moe_case(P, e, d, i, t):
    """8 uniform routings of t tokens (ids, weights, x), the mean experts each touches, the floor (s: those experts'
    NVFP4 bytes once) and the first routing's fp32 reference (kernels.moe's loop on dequantized weights)."""
    from tpserve.kernels.moe import ref as moe
    from tpserve.kernels.quant import ref as qr

    routes = [(torch.stack([torch.randperm(e, device="cuda")[:8] for _ in range(t)]),
               torch.rand(t, 8, device="cuda"), torch.randn(t, d, device="cuda").bfloat16()) for _ in range(8)]
    touched = sum(r[0].unique().numel() for r in routes) / len(routes)
    ids, w, x = routes[0]
    ref = moe.experts_loop_fn(
        x.float(), w, ids, e,
        lambda j: qr.nvfp4_dequantize(P["gp"][j], P["gb"][j], P["g2rows"][j], torch.float32),
        lambda j: qr.nvfp4_dequantize(P["dp"][j], P["db"][j], P["d2"][j], torch.float32), 10.0)
    return routes, touched, touched * 3 * i * d * (0.5 + 1 / 16) / HBM, ref


def sec_m1def(res):
    from tpserve.kernels.quant import gemv_cuda as mg
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1
    from tpserve.kernels.quant.gemm_triton import experts_nvfp4_triton

    quantize, call, nbytes = _fp4()
    forms = {"engine (nvfp4_m1)": _engine("nvfp4"), "mma_gemv": lambda x, p: mg.nvfp4_gemv(x, *p),
             "triton": lambda x, p: call(x, p, "default")}
    print("| N x K | form | us | % floor | rel err |\n| --- | --- | --- | --- | --- |", flush=True)
    for n, k in SHAPES:
        packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
        x = torch.randn(1, k, device="cuda").bfloat16()
        ref = x.float() @ wd.T
        for name, fn in forms.items():
            err = rel(fn(x, packed), ref)
            t = timed([(lambda p=p, fn=fn: fn(x, p)) for p in packs])
            res[f"m1def dense {n}x{k} {name}"] = dict(us=t * 1e6, floor_us=floor * 1e6, rel_err=err)
            print(f"| {n} x {k} | {name} | {t * 1e6:.1f} | {100 * floor / t:.0f}% | {err:.1e} |", flush=True)
    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()
    forms = {"nvfp4_m1 (defaults)": lambda ids, w, x: m1.experts(x, w, ids, P["gp"], P["gb"], P["g2"], P["dp"],
                                                                 P["db"], d2, 10.0),
             "triton (qtile-b)": lambda ids, w, x: experts_nvfp4_triton(x, w, ids, P["gp"], P["gb"], P["g2rows"],
                                                                        P["dp"], P["db"], P["d2rows"], 10.0, ROUTE,
                                                                        qtile=True, qtile_a=False)}
    print("\n| MoE decode nvfp4 | tokens | touched | form | us | floor us | % floor | rel err |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for t in (1, 8, 16, 32):
        routes, touched, floor, ref = _nvfp4_moe_case(P, e, d, i, t)
        for name, fn in forms.items():
            err = rel(fn(*routes[0]), ref)
            tt = timed([(lambda r=r, fn=fn: fn(*r)) for r in routes])
            res[f"m1def moe t={t} {name}"] = dict(us=tt * 1e6, floor_us=floor * 1e6, touched=touched, rel_err=err)
            print(f"| | {t} | {touched:.1f} | {name} | {tt * 1e6:.1f} | {floor * 1e6:.0f} | {100 * floor / tt:.0f}% | "
                  f"{err:.1e} |", flush=True)


def sec_m1exp(res):
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()
    shapes = [m1.Config(r, sp, st, 256, "shift") for r in (1, 2) for sp in (2, 4, 8, 16) for st in (2, 3)]
    for t in (1, 8):
        routes, touched, floor, ref = _nvfp4_moe_case(P, e, d, i, t)

        def run(r, c):
            cg, cd = (None, None) if c == "default" else c
            return m1.experts(r[2], r[1], r[0], P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0, cg, cd)

        _graph_eq(res, f"m1exp t={t}", lambda: run(routes[0], "default"))
        for which in ("gate_up", "down"):
            cfgs = ["default"] + [(c, None) if which == "gate_up" else (None, c) for c in shapes]
            best = sweep(cfgs, lambda c: [(lambda r=r: run(r, c)) for r in routes],
                         lambda c: rel(run(routes[0], c), ref), top=6)
            print(f"\nMoE nvfp4_m1 {t} token(s), {which} swept (floor {floor * 1e6:.0f} us):", flush=True)
            for s_, c in best:
                print(f"  {s_ * 1e6:6.1f} us  {100 * floor / s_:3.0f}% of floor  {c}", flush=True)
            res[f"m1exp t={t} {which}"] = dict(floor_us=floor * 1e6, best=[(str(c), s_ * 1e6) for s_, c in best])


def sec_moe(res):
    from tpserve.kernels.quant.gemm_triton import experts_fp8_triton, experts_nvfp4_triton

    P, e, d, i = _experts_setup()

    def nvfp4(ids, w, x, c, asm=None):
        bn, bk, nw, ns, qt = c
        return experts_nvfp4_triton(x, w, ids, P["gp"], P["gb"], P["g2rows"], P["dp"], P["db"], P["d2rows"], 10.0,
                                    ROUTE, qtile=True, asm=asm, qtile_a=qt != "b", block_n=bn, block_k=bk,
                                    num_warps=nw, num_stages=ns)

    def fp8(ids, w, x, c, asm=None):
        bn, bk, nw, ns, qt = c
        return experts_fp8_triton(x, w, ids, P["gq"], P["gs"], P["dq"], P["ds"], (128, 128), 10.0, ROUTE,
                                  qtile=True, asm=asm, qtile_a=qt != "b", block_n=bn, block_k=bk, num_warps=nw,
                                  num_stages=ns)

    # (block_n, block_k, warps, qtile form) x stages; 8-warp programs: more warps an SM where its shared memory
    # holds one program
    tiles4 = ((32, 256, 4, "b"), (64, 256, 4, "b"), (32, 256, 2, "a"), (64, 256, 4, "a"), (64, 256, 8, "b"),
              (64, 256, 8, "a"), (128, 256, 8, "a"), (64, 128, 8, "b"))
    tiles8 = ((64, 128, 4, "b"), (32, 128, 4, "b"), (64, 128, 4, "a"), (64, 128, 8, "b"), (128, 128, 8, "a"),
              (64, 128, 8, "a"))
    cases = {"nvfp4": (nvfp4, 3 * i * d * (0.5 + 1 / 16), [(*c[:3], ns, c[3]) for c in tiles4 for ns in range(1, 6)]),
             "fp8": (fp8, 3 * i * d * (1 + 4 / 128**2), [(*c[:3], ns, c[3]) for c in tiles8 for ns in range(2, 6)])}
    for t in (1, 8):
        routes = [(torch.stack([torch.randperm(e, device="cuda")[:8] for _ in range(t)]),
                   torch.rand(t, 8, device="cuda"), torch.randn(t, d, device="cuda").bfloat16()) for _ in range(8)]
        touched = sum(r[0].unique().numel() for r in routes) / len(routes)
        for name, (fn, per_expert, configs) in cases.items():
            ref = fn(*routes[0], configs[0], asm=False).float()  # plain Triton decode: the PTX's check
            best = sweep(configs, lambda c: [(lambda r=r: fn(*r, c)) for r in routes],
                         lambda c: rel(fn(*routes[0], c), ref))
            floor = touched * per_expert / HBM
            print(f"\nMoE decode {name} {t} token(s), {touched:.1f} experts touched, floor {floor * 1e6:.0f} us: "
                  f"bn, bk, warps, stages, form", flush=True)
            for tt, c in best:
                print(f"  {tt * 1e6:6.1f} us  {100 * floor / tt:3.0f}% of floor  {c}", flush=True)
            c = best[0][1]
            prof = profile_kernels(lambda: [fn(*r, c) for r in routes], len(routes))
            gemm = sum(us for k, us in prof.items() if "qgate_up" in k or "qdown" in k)
            print(f"  per call, device time by kernel ({c}): "
                  + "; ".join(f"{k} {us:.1f} us" for k, us in prof.items())
                  + f"; the two GEMM kernels {gemm:.1f} us = {100 * floor * 1e6 / gemm:.0f}% of floor", flush=True)
            res[f"moe {name} t={t}"] = dict(touched=touched, floor_us=floor * 1e6,
                                            best=[(c, tt * 1e6) for tt, c in best], kernels_us=prof,
                                            gemm_us=gemm, gemm_pct=100 * floor * 1e6 / gemm)


def sec_prefill(res):
    from tpserve.kernels.linear.act_triton import clamped_swiglu_triton
    from tpserve.kernels.moe import ref as moe

    e, d, i, k = 288, 4096, 2048, 8
    g = torch.Generator(device="cuda").manual_seed(0)
    gu = torch.randn(e, 2 * i, d, device="cuda", generator=g, dtype=torch.bfloat16) / d**0.5
    dn = torch.randn(e, d, i, device="cuda", generator=g, dtype=torch.bfloat16) / i**0.5
    for t in (4096, 16384):
        ids = torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(t)])
        w = torch.rand(t, k, device="cuda")
        x = torch.randn(t, d, device="cuda").bfloat16()
        flops = 2 * t * k * 3 * i * d
        order = torch.argsort(ids.reshape(-1), stable=True)
        offs = torch.cumsum(torch.bincount(ids.reshape(-1), minlength=e), 0).to(torch.int32)
        xs = x[order // k]
        hs = torch.randn(t * k, i, device="cuda").bfloat16()

        def gemms():
            torch.nn.functional.grouped_mm(xs, gu.transpose(1, 2), offs=offs)
            torch.nn.functional.grouped_mm(hs, dn.transpose(1, 2), offs=offs)

        def engine():  # --moe-route-backend triton, --act-backend triton
            return moe.experts_grouped(x, w, ids, gu, dn, 10.0, "triton", clamped_swiglu_triton)

        forms = {"combine torch, act torch": lambda: moe.experts_grouped(x, w, ids, gu, dn, 10.0),
                 "combine triton, act torch": lambda: moe.experts_grouped(x, w, ids, gu, dn, 10.0, "triton"),
                 "combine triton, act triton": engine, "the two grouped_mm alone": gemms}
        a, b = engine().float(), moe.experts_grouped(x, w, ids, gu, dn, 10.0).float()
        print(f"\nMoE prefill bf16, {t} tokens (engine form vs torch: rel diff "
              f"{((a - b).abs().max() / b.abs().max()).item():.1e})", flush=True)
        for name, fn in forms.items():
            tt = timed(fn, reps=3)
            res[f"prefill {t} {name}"] = dict(ms=tt * 1e3, mfu=100 * flops / tt / BF16_PEAK)
            print(f"  {name}: {tt * 1e3:.2f} ms, {flops / tt / 1e12:.0f} TFLOP/s, {100 * flops / tt / BF16_PEAK:.1f}% "
                  "MFU", flush=True)
        prof = profile_kernels(engine, 1, reps=3)
        res[f"prefill {t} kernels_us"] = prof
        print("  by kernel: " + "; ".join(f"{k_} {us / 1e3:.2f} ms" for k_, us in list(prof.items())[:8]), flush=True)


SECTIONS = dict(gemv=sec_gemv, w8a16=lambda r: sec_gemv(r, "w8a16"), w4a16=lambda r: sec_gemv(r, "w4a16"),
                rows=lambda r: sec_gemv(r, every=True), mma=sec_mma, mmapdl=sec_mmapdl, m1=sec_m1, m1def=sec_m1def,
                m1exp=sec_m1exp, moe=sec_moe, prefill=sec_prefill)

if __name__ == "__main__":
    sys.exit(run_sections(SECTIONS, "mmapdl,m1def,moe,prefill", "quant_decode_sweep.json"))
