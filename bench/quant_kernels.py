"""Quantized GEMM and MoE kernels on one GPU: accuracy against dequantized fp32 math and time.

Floors: bytes / the card's HBM bandwidth, FLOPs / its dense bf16 peak (card_figures). Sections (each its table):
  w8a16   fp8 block-128 W8A16 at M 1/8/16: the tiled split-K kernel and the decode GEMV
          (kernels/quant_gemv.py, best of a config sweep: tiles, warps, K split or not), vs the FP8
          weight-streaming floor and vs cuBLAS bf16 on the same shape (whose floor is twice as many bytes)
  w4a16   nvfp4 W4A16 at M 1/8/16, tiled vs GEMV (the float32-bits decode or nvfp4_tile's packed
          decode on the tensor cores), vs its 4-bit floor; nvfp4_tile's PTX against plain Triton
  w8a8    torch._scaled_mm blockwise (sm90) at M 4096, vs bf16 matmul; relative error
  moe     decode: grouped nvfp4 / fp8 / bf16 experts at 1/8 tokens (288 experts, top-8, D 4096, I 2048;
          best of a tile sweep; 8 routings in turn) vs the floor of the experts touched;
          prefill: bf16 grouped_mm at 16k tokens (TFLOP/s, MFU)
Times: CUDA-graph replays of 20 calls after warm-up, median of 5 (eager if capture fails); the calls
rotate over weight copies (4 x L2 in all) or routings, so no call reads weights cached by the last.
Usage: PYTHONPATH=src python bench/quant_kernels.py [--out DIR] [--sections w8a16,w4a16,w8a8,moe]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def card_figures() -> tuple[float | None, float | None]:
    """(HBM bytes/s, dense bf16 FLOP/s) of this process's CUDA card: the floors' divisors, its spec by its name or
    TPSERVE_BENCH_HBM_TBPS / TPSERVE_BENCH_PEAK_TFLOPS (tools/bench/model.device_peaks); (None, None) without CUDA."""
    if not torch.cuda.is_available():
        return None, None
    from tpserve.tools.bench.model import device_peaks

    peaks = device_peaks("cuda")
    if not (peaks["hbm_bytes_per_s"] and peaks["bf16_flops"]):
        raise SystemExit(f"no floor figures for {peaks['card']}: set TPSERVE_BENCH_HBM_TBPS, TPSERVE_BENCH_PEAK_TFLOPS")
    return peaks["hbm_bytes_per_s"], peaks["bf16_flops"]


HBM, BF16_PEAK = card_figures()

ROUTE = "triton"  # the MoE's expert-sorted layout and combine as the engine builds them on CUDA


def timed(fn, reps: int = 20) -> float:
    """Seconds per call; fn: one zero-argument call, or a list of them taken in turn (calls on
    different weight copies, so that no call finds its weights in the 50 MB L2 from the one before)."""
    fns = fn if isinstance(fn, list) else [fn]
    reps = max(reps, len(fns))

    def each():
        for r in range(reps):
            fns[r % len(fns)]()

    for f in fns:
        f()
    torch.cuda.synchronize()
    runner = None
    try:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g):
                each()
        runner = g.replay
    except Exception:  # noqa: BLE001  (some paths cannot be captured: time them eagerly)
        runner = each
    out = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        runner()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / 1e3 / reps)
    return statistics.median(out)


def profile_kernels(fn, calls_per_fn: int, reps: int = 10) -> dict:
    """Mean device microseconds per call by kernel name (torch.profiler, eager launches)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out: dict = {}
    for ev in p.key_averages():
        us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if ev.device_type.name == "CUDA" and us:
            out[ev.key[:40]] = out.get(ev.key[:40], 0.0) + us / (reps * calls_per_fn)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


L2_BYTES = 50 * 2**20  # H100 / H200


def copies_for(nbytes: int) -> int:
    """Weight copies to rotate through so that their total is at least 4 x L2."""
    return max(1, -(-4 * L2_BYTES // nbytes))


def rel(y, ref) -> float:
    return ((y.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


# (block_n, block_k, warps, waves, qtile): FMAs at M = 1 / X @ W^T, or qtile.fp8_tile on the tensor cores,
# "a": the tile as their A operand (16 rows of W per warp), "b": as B
GEMV_FP8 = ([(bn, 128, nw, wv, False) for bn in (32, 64) for nw in (4, 8) for wv in (4, 0)]
            + [(bn, 128, nw, wv, "a") for bn, nw in ((64, 4), (128, 8), (32, 2), (16, 1)) for wv in (4, 0)]
            + [(bn, 128, 4, wv, "b") for bn in (32, 64) for wv in (4, 0)])
# (block_n, block_k, warps, fp32 decode, qtile, waves): the float32-bits decode (M = 1 only) and the
# per-element form against nvfp4_tile's packed decode on the tensor cores; waves 0 = no K split
GEMV_FP4 = ([(16, 512, 4, True, False, 4), (32, 512, 4, True, False, 4), (32, 256, 4, False, False, 4)]
            + [(bn, bk, nw, False, "a", wv) for bn, bk, nw in ((64, 256, 4), (64, 512, 4), (128, 256, 8),
                                                                (128, 128, 8), (32, 512, 2), (16, 512, 1), (32, 256, 2))
               for wv in (4, 0)]  # nvfp4_tile as the MMA's A: 16 rows of W per warp (fewer decode tiles twice)
            + [(bn, bk, 4, False, "b", wv) for bn, bk in ((32, 512), (64, 256)) for wv in (4, 0)])  # as B
# A config counts only if its output is right: bf16 output rounding is at most 2^-8 of the largest
# output and fp32 summation adds little, so a correct kernel stays below 1e-2 (measured 1.6e-3 to
# 3.8e-3); a group-dot NVFP4 variant that was fastest at M = 16 gave 1.9 on the H200 (right in
# Triton's interpreter) and was removed.
MAX_REL_ERR = 1e-2


def _best(configs, make, check=None):
    """(seconds, config) of the fastest config; make(config) -> a zero-argument call. A config that
    fails to compile or run (e.g. out of registers), or whose output `check(config)` (its relative
    error) puts above MAX_REL_ERR, is reported and skipped."""
    out = []
    for c in configs:
        try:
            if check is not None and (e := check(c)) > MAX_REL_ERR:
                print(f"  config {c}: WRONG, rel err {e:.1e}", flush=True)
                continue
            out.append((timed(make(c)), c))
        except Exception as exc:  # noqa: BLE001
            print(f"  config {c}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", flush=True)
    return min(out)


def _gemv_rows(res, key, title, shapes, quantize, floor_bytes, old, gemv, configs, extra=None):
    """One table: per shape and M the tiled split-K kernel (best of 3 tiles), the decode GEMV (best of
    `configs`) and its error against fp32 math on the dequantized weight. Every timed call reads its
    own copy of the weight (copies_for: 4 x L2 in all), as a model's layers do."""
    print(f"\n| {title} | M | tiled us | GEMV us | floor us | GEMV % floor | GEMV / tiled | best GEMV config | "
          f"{'cuBLAS bf16 us | ' if extra else ''}rel err |")
    print("| --- " * (9 + bool(extra)) + "|")
    for n, k in shapes:
        w = torch.randn(n, k, device="cuda") / k**0.5
        packed, wd = quantize(w)
        nc = copies_for(floor_bytes(n, k))
        packs = [packed] + [tuple(t.clone() for t in packed) for _ in range(nc - 1)]
        floor = floor_bytes(n, k) / HBM
        for m in (1, 8, 16):
            x = torch.randn(m, k, device="cuda").bfloat16()
            ref = x.float() @ wd.T
            t_old, _ = _best([(32, 128), (64, 128), (64, 256)],
                             lambda c: [(lambda p=p: old(x, p, block_n=c[0], block_k=c[1])) for p in packs],
                             check=lambda c: rel(old(x, packed, block_n=c[0], block_k=c[1]), ref))
            t_new, cfg = _best([c for c in configs if m == 1 or not (len(c) == 6 and c[3])],
                               lambda c: [(lambda p=p: gemv(x, p, *c)) for p in packs],
                               check=lambda c: rel(gemv(x, packed, *c), ref))
            err = rel(gemv(x, packed, *cfg), ref)
            row = dict(n=n, k=k, m=m, tiled_us=t_old * 1e6, us=t_new * 1e6, floor_us=floor * 1e6,
                       pct=100 * floor / t_new, config=cfg, rel_err=err, weight_copies=nc)
            cols = ""
            if extra:
                wbs = [extra(wd)] + [extra(wd).clone() for _ in range(max(1, nc // 2) - 1)]  # bf16: twice the bytes
                row["cublas_bf16_us"] = timed([(lambda wb=wb: torch.nn.functional.linear(x, wb)) for wb in wbs]) * 1e6
                cols = f"{row['cublas_bf16_us']:.1f} | "
            res.setdefault(key, []).append(row)
            print(f"| {n}x{k} | {m} | {row['tiled_us']:.1f} | {row['us']:.1f} | {row['floor_us']:.1f} | "
                  f"{row['pct']:.0f}% | {t_new / t_old:.2f} | {cfg} | {cols}{err:.1e} |", flush=True)


SHAPES = ((12288, 4096), (4096, 12288))


def sec_w8a16(res):
    from tpserve.kernels.quant import ref as qr
    from tpserve.kernels.quant.gemv_triton import w8a16_gemv
    from tpserve.kernels.quant.gemm_triton import w8a16_gemm

    def quantize(w):
        q, s = qr.fp8_block_quantize(w)
        return (q, s), qr.fp8_block_dequantize(q, s)

    _gemv_rows(res, "w8a16", "W8A16 fp8 block 128", SHAPES, quantize, lambda n, k: n * k + (n // 128) * (k // 128) * 4,
               lambda x, p, **t: w8a16_gemm(x, *p, (128, 128), kernel="tiled", **t),
               lambda x, p, bn, bk, nw, wv, qt: w8a16_gemv(x, *p, (128, 128), block_n=bn, block_k=bk, num_warps=nw,
                                                           waves=wv, qtile=bool(qt), qtile_a=qt != "b"),
               GEMV_FP8, extra=lambda wd: wd.bfloat16())
    p = quantize(torch.randn(4096, 4096, device="cuda") / 64)[0]
    for m in (1, 8):  # qtile.fp8_tile's PTX decode against the same bits in plain Triton
        x = torch.randn(m, 4096, device="cuda").bfloat16()
        same = torch.equal(w8a16_gemv(x, *p, (128, 128), qtile=True),
                           w8a16_gemv(x, *p, (128, 128), qtile=True, asm=False))
        res.setdefault("w8a16_asm_equals_portable", []).append(dict(m=m, equal=bool(same)))
        print(f"  M = {m}: fp8 PTX decode == plain Triton decode: {same}", flush=True)


def sec_w4a16(res):
    from tpserve.kernels.quant import ref as qr
    from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv
    from tpserve.kernels.quant.gemm_triton import w4a16_gemm

    def quantize(w):
        p, bs, s2 = qr.nvfp4_quantize(w)
        return (p, bs, s2.reshape(1).expand(w.shape[0]).contiguous()), qr.nvfp4_dequantize(p, bs, s2)

    _gemv_rows(res, "w4a16", "W4A16 nvfp4", SHAPES, quantize, lambda n, k: n * k // 2 + n * k // 16,
               lambda x, p, **t: w4a16_gemm(x, *p, kernel="tiled", **t),
               lambda x, p, bn, bk, nw, d32, qt, wv: w4a16_gemv(x, *p, block_n=bn, block_k=bk, num_warps=nw,
                                                                fp32_decode=d32, qtile=bool(qt), qtile_a=qt != "b",
                                                                waves=wv),
               GEMV_FP4)
    p = quantize(torch.randn(4096, 4096, device="cuda") / 64)[0]
    for m in (1, 8):  # nvfp4_tile's PTX decode against the same bits in plain Triton
        x = torch.randn(m, 4096, device="cuda").bfloat16()
        same = torch.equal(w4a16_gemv(x, *p, qtile=True), w4a16_gemv(x, *p, qtile=True, asm=False))
        res.setdefault("w4a16_asm_equals_portable", []).append(dict(m=m, equal=bool(same)))
        print(f"  M = {m}: nvfp4 PTX decode == plain Triton decode: {same}", flush=True)


def sec_w8a8(res):
    from tpserve.kernels.quant import ref as qr
    from tpserve.kernels.quant.ref import w8a8_block_scaled_mm

    print("\n| W8A8 scaled_mm blockwise | M x N x K | us | TFLOP/s | bf16 matmul us | speedup | rel err |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m, n, k in ((4096, 12288, 4096), (16384, 4096, 12288)):
        w = torch.randn(n, k, device="cuda") / k**0.5
        q, s = qr.fp8_block_quantize(w)
        wb = qr.fp8_block_dequantize(q, s).bfloat16()
        x = torch.randn(m, k, device="cuda").bfloat16()
        ref = x.float() @ qr.fp8_block_dequantize(q, s).T
        t = timed(lambda: w8a8_block_scaled_mm(x, q, s), reps=5)
        tb = timed(lambda: x @ wb.T, reps=5)
        err = rel(w8a8_block_scaled_mm(x, q, s), ref)
        row = dict(m=m, n=n, k=k, us=t * 1e6, tflops=2 * m * n * k / t / 1e12, bf16_us=tb * 1e6, rel_err=err)
        res.setdefault("w8a8", []).append(row)
        print(f"| {m}x{n}x{k} | {t * 1e6:.0f} | {row['tflops']:.0f} | {tb * 1e6:.0f} | {tb / t:.2f}x | {err:.1e} |")


def quantized_experts(gu: torch.Tensor, dn: torch.Tensor) -> dict:
    """NVFP4 (one global scale per expert x projection, like ModelOpt) and FP8 block-128 copies of bf16 experts
    gu [E, 2I, D] / dn [E, D, I], expert by expert; g2rows / d2rows: the NVFP4 global scale of every row."""
    from tpserve.kernels.quant import ref as qr

    i, d = dn.shape[2], dn.shape[1]
    P = {n: [] for n in ("gp", "gb", "g2", "dp", "db", "d2", "gq", "gs", "dq", "ds")}
    for x_ in range(gu.shape[0]):
        a, b = qr.nvfp4_quantize(gu[x_, :i]), qr.nvfp4_quantize(gu[x_, i:])
        c = qr.nvfp4_quantize(dn[x_])
        P["gp"].append(torch.cat([a[0], b[0]])); P["gb"].append(torch.cat([a[1], b[1]]))
        P["g2"].append(torch.stack([a[2], b[2]])); P["dp"].append(c[0]); P["db"].append(c[1]); P["d2"].append(c[2])
        fa, fb, fc = qr.fp8_block_quantize(gu[x_, :i]), qr.fp8_block_quantize(gu[x_, i:]), qr.fp8_block_quantize(dn[x_])
        P["gq"].append(torch.cat([fa[0], fb[0]])); P["gs"].append(torch.cat([fa[1], fb[1]]))
        P["dq"].append(fc[0]); P["ds"].append(fc[1])
    P = {n: torch.stack(v) for n, v in P.items()}
    P["g2rows"] = P["g2"].repeat_interleave(i, dim=1).contiguous()
    P["d2rows"] = P["d2"][:, None].expand(-1, d).contiguous()
    return P


def sec_moe(res):
    from tpserve.kernels.moe import ref as moe
    from tpserve.kernels.quant import ref as qr
    from tpserve.kernels.moe.grouped_triton import experts_triton
    from tpserve.kernels.quant.gemm_triton import experts_fp8_triton, experts_nvfp4_triton

    e, d, i, k = 288, 4096, 2048, 8
    g = torch.Generator(device="cuda").manual_seed(0)
    gu = torch.randn(e, 2 * i, d, device="cuda", generator=g, dtype=torch.bfloat16) / d**0.5
    dn = torch.randn(e, d, i, device="cuda", generator=g, dtype=torch.bfloat16) / i**0.5
    P = quantized_experts(gu, dn)
    g2rows, d2rows = P["g2rows"], P["d2rows"]
    print("\n| MoE decode (288 experts, top-8) | tokens | experts touched (mean) | us | floor us | % floor | "
          "best config | rel err vs fp32 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for t in (1, 8):
        # 8 routings taken in turn: the touched experts (113 MB at 1 token in nvfp4) change every call
        routes = [(torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(t)]),
                   torch.rand(t, k, device="cuda"), torch.randn(t, d, device="cuda").bfloat16()) for _ in range(8)]
        touched = sum(r[0].unique().numel() for r in routes) / len(routes)
        ids0, w0, x0 = routes[0]
        per = 3 * i * d

        def nvfp4(ids, w, x, cfg, asm=None):
            bn, bk, nw, qt = cfg
            return experts_nvfp4_triton(x, w, ids, P["gp"], P["gb"], g2rows, P["dp"], P["db"], d2rows, 10.0,
                                        ROUTE, qtile=bool(qt), asm=asm, qtile_a=qt != "b", block_n=bn, block_k=bk,
                                        num_warps=nw)

        def fp8(ids, w, x, cfg, asm=None):
            bn, bk, nw, qt = cfg
            return experts_fp8_triton(x, w, ids, P["gq"], P["gs"], P["dq"], P["ds"], (128, 128), 10.0, ROUTE,
                                      qtile=bool(qt), asm=asm, qtile_a=qt != "b", block_n=bn, block_k=bk,
                                      num_warps=nw)

        def bf16(ids, w, x, cfg):
            return experts_triton(x, w, ids, gu, dn, 10.0, block_n=cfg[0], block_k=cfg[1], route_backend=ROUTE)

        cases = {
            "nvfp4": (nvfp4, per * (0.5 + 1 / 16),
                      # (block_n, block_k, warps, qtile): the per-element decode first, then qtile.py's as
                      # the MMA's A operand ("a": 16 rows of W per warp, fewer decode each tile twice) or B
                      [(64, 64, 4, False)] + [(bn, bk, nw, "a") for bn, bk, nw in
                                              ((64, 256, 4), (64, 128, 4), (64, 512, 4), (128, 128, 8),
                                               (128, 256, 8), (32, 256, 2))]
                      + [(32, 256, 4, "b"), (64, 256, 4, "b")],
                      lambda ex: (qr.nvfp4_dequantize(P["gp"][ex], P["gb"][ex], g2rows[ex]),
                                  qr.nvfp4_dequantize(P["dp"][ex], P["db"][ex], d2rows[ex]))),
            "fp8": (fp8, per * (1 + 4 / 128**2), [(64, 64, 4, False), (64, 128, 4, False)]
                    + [(bn, bk, nw, "a") for bn, bk, nw in ((64, 128, 4), (64, 64, 4), (128, 128, 8), (32, 128, 2))]
                    + [(64, 128, 4, "b")],
                    lambda ex: (torch.cat([qr.fp8_block_dequantize(P["gq"][ex, :i], P["gs"][ex, :16]),
                                           qr.fp8_block_dequantize(P["gq"][ex, i:], P["gs"][ex, 16:])]),
                                qr.fp8_block_dequantize(P["dq"][ex], P["ds"][ex]))),
            "bf16": (bf16, per * 2, [(64, 64), (64, 128)], lambda ex: (gu[ex].float(), dn[ex].float())),
        }
        for name, (fn, bytes_per_expert, configs, deq) in cases.items():
            ref = moe.experts_loop_fn(x0.float(), w0, ids0, e, lambda ex: deq(ex)[0], lambda ex: deq(ex)[1], 10.0)
            tt, cfg = _best(configs, lambda c: [(lambda r=r: fn(*r, c)) for r in routes],
                            check=lambda c: rel(fn(ids0, w0, x0, c), ref))
            err = rel(fn(ids0, w0, x0, cfg), ref)
            floor = touched * bytes_per_expert / HBM
            row = dict(kind=name, tokens=t, touched=touched, us=tt * 1e6, floor_us=floor * 1e6, pct=100 * floor / tt,
                       rel_err=err, config=cfg)
            if name != "bf16" and cfg[3]:  # qtile's PTX decode against the same bits in plain Triton
                b_cfgs = [c for c in configs if c[3] == "b"]  # and the tile as B
                t_b, c_b = _best(b_cfgs, lambda c: [(lambda r=r: fn(*r, c)) for r in routes],
                                 check=lambda c: rel(fn(ids0, w0, x0, c), ref))
                row["b_operand_us"], row["b_operand_config"] = t_b * 1e6, c_b
                row["asm_equals_portable"] = bool(torch.equal(fn(ids0, w0, x0, cfg), fn(ids0, w0, x0, cfg, False)))
                t_old, _ = _best(configs[:1], lambda c: [(lambda r=r: fn(*r, c)) for r in routes])
                row["per_element_us"] = t_old * 1e6
            res.setdefault("moe_decode", []).append(row)
            print(f"| {name} | {t} | {touched:.1f} | {tt * 1e6:.0f} | {floor * 1e6:.0f} | {row['pct']:.0f}% | {cfg} | "
                  f"{err:.1e} |", flush=True)
            if "asm_equals_portable" in row:
                print(f"  {name} PTX decode == plain Triton decode: {row['asm_equals_portable']}; per-element decode "
                      f"(the old path) {row['per_element_us']:.0f} us; tile as B {row['b_operand_us']:.0f} us "
                      f"{row['b_operand_config']}", flush=True)
    print("\n| MoE prefill bf16 grouped_mm | tokens | ms | TFLOP/s | MFU |")
    print("| --- | --- | --- | --- | --- |")
    for t in (4096, 16384):
        ids = torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(t)])
        w = torch.rand(t, k, device="cuda")
        x = torch.randn(t, d, device="cuda").bfloat16()
        tt = timed(lambda: moe.experts_grouped(x, w, ids, gu, dn, 10.0), reps=3)
        flops = 2 * t * k * 3 * i * d
        row = dict(tokens=t, ms=tt * 1e3, tflops=flops / tt / 1e12, mfu=100 * flops / tt / BF16_PEAK)
        res.setdefault("moe_prefill", []).append(row)
        print(f"| grouped_mm | {t} | {tt * 1e3:.2f} | {row['tflops']:.0f} | {row['mfu']:.0f}% |")


def run_sections(sections: dict, default: str, json_name: str) -> int:
    """The command line of a sectioned GPU bench: --sections (names in `sections`, run in order, a failing one
    reported and skipped) and --out DIR (the results as DIR/json_name, rewritten after every section)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, metavar="DIR", help="write the results to DIR/" + json_name)
    ap.add_argument("--sections", default=default, help=f"comma-separated, of: {', '.join(sections)}")
    args = ap.parse_args()
    unknown = [s for s in args.sections.split(",") if s not in sections]
    if unknown:
        ap.error(f"--sections: unknown {', '.join(unknown)}; the sections: {', '.join(sections)}")
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    res: dict = {}
    for name in args.sections.split(","):
        t0 = time.time()
        try:
            sections[name](res)
        except Exception as exc:  # noqa: BLE001  (report and go on to the next section)
            import traceback

            traceback.print_exc()
            res[f"{name}_error"] = repr(exc)
        print(f"[{name}: {time.time() - t0:.0f} s]", flush=True)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / json_name).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_sections(dict(moe=sec_moe, w8a16=sec_w8a16, w4a16=sec_w4a16, w8a8=sec_w8a8), "moe,w8a16,w4a16,w8a8",
                          "quant_kernels.json"))
