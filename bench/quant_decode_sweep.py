"""Where the quantized decode kernels lose time: wide sweeps (pipeline depth, prefetch, wide FP8 K tiles) and a
per-kernel profile of the grouped MoE decode, on one GPU.

Floors (bytes / the card's HBM bandwidth, quant_kernels.card_figures): W8A16 12288 x 4096 50.3 MB, W4A16 28.3 MB;
MoE decode (288 experts, top-8, D 4096, I 2048) the touched experts' bytes. bench/quant_kernels.py swept tiles and
warps with Triton's default three pipeline stages; the FP8 GEMV at one row (FMAs, no dot) is not software-pipelined
at all (its loads feed no dot: no LDGSTS in its sm_90 SASS), so each program waits a whole memory latency per K
tile. Sections:
  gemv     W8A16 / W4A16 at M = 1 and 8 on 12288 x 4096 (every config checked against fp32 math first, then timed
           with weight copies rotated, 4 x L2 in all); the five best per case, then the best three on 4096 x 12288
  moe      grouped NVFP4 / FP8 experts at 1 and 8 tokens over num_stages, then the best config's per-kernel device
           times (torch.profiler: routing, gate / up, down, combine) and the GEMM kernels' share of the floor
  prefill  bf16 grouped MoE prefill at 4k / 16k tokens: as timed before, as the engine runs it, the GEMMs alone
  fp8det   the FP8 GEMV's qtile at M = 8: PTX against plain Triton with one K split and with fp32 atomics (split K),
           plain against plain, and each one's error against fp32 math (PTX != plain was once seen at M = 8)
  w4one    W4A16 at one row, 12288 x 4096: tiles, warps, stages and K splits of qtile A / B and the one-row kernel,
           every config printed
  rows     the one-row kernels (NVFP4 and FP8) on both shapes, every config printed
  w8def    W8A16 at one row, both shapes: the default beside the configs it takes and the earlier defaults
  w4def    W4A16 at one row: the default beside the earlier best and default, K splits of the one-row kernel on
           4096 x 12288, and its PTX decode against plain Triton bit for bit
  w8split  W8A16 at 8 rows: qtile B's K splits, the GEMV kernel's device time alone against the fill and cast
  w4planes W4A16 through the nibble-planes kernel at 1, 8 and 16 rows, both shapes, beside the defaults; PTX == plain
  w4tiled  W4A16: the planes kernel on tiled weights against row-major; the one-row kernel with whole-row K tiles
  mma      W8A16 and W4A16 through kernels/mma_gemv.py (CUDA via NVRTC, mma.sync fed from registers) at 1-8 rows,
           both shapes, every config beside the Triton default; odd shapes checked against fp32 math; graph
           replays equal to eager calls
  mma2     the same at 8 rows around mma's best (interleaved K chunks): warps a block, row tiles a warp
  mma3     the defaults beside more warps a block and a deeper pipeline at 8 rows
  mma4     the defaults beside 16-warp blocks held two to an SM (min_blocks) and other min_blocks
  mmadef   w8a16_gemv / w4a16_gemv's defaults against the Triton kernels (mma=False), 1-8 rows, both shapes
  m1       kernels/nvfp4_m1.py: the one-row NVFP4 GEMV (odd shapes against fp32 math, a graph replay, then both
           shapes over its configs beside mma_gemv's and Triton's) and the MoE experts at 1 and 8 tokens (against
           fp32 math, then over configs beside the Triton experts; device time by kernel for the best)
  m1def    the defaults: the NVFP4 GEMV at one row (nvfp4_m1) beside mma_gemv and Triton, both shapes; the MoE
           experts (nvfp4_m1 defaults) beside the Triton experts at 1, 8, 16 and 32 tokens
  m1exp    nvfp4_m1's experts at 1 and 8 tokens: gate|up's config swept with down's default, then down's
  m1sum    nvfp4_m1's experts with down summing a token's choices (down_sum) against down per pair + combine, at
           1, 2 and 8 tokens, down_sum's config swept; kernels profiled
  mmasmem  mma_gemv with W through shared memory (cp.async) against register loads: bit for bit, then both shapes
           at 1, 2, 4, 8 rows over smem configs beside the defaults
  m1pdl    nvfp4_m1's experts with down as a programmatic dependent launch of gate|up against a plain launch
  m1x      nvfp4_m1's experts at 1, 2, 8, 32 tokens (seeded routings): the defaults beside another tree's nvfp4_m1
           (M1X_BASE: its file) loaded in the same process
  m1cfg    nvfp4_m1's experts at 1, 2, 8 tokens, gate|up with two row tiles of each part a warp against the default
  m1par    nvfp4_m1's gate|up and down_sum kernels alone, in sequence, and on two streams with no dependency (a
           bound on what overlapping them could give), 1 and 8 tokens
  mmapdl   w8a16_gemv / w4a16_gemv at 1, 2, 4, 8 rows, both shapes: calls in a graph (weight copies in turn)
           launched plainly against each a programmatic dependent of the call before (its first W chunks load
           while that one finishes); bit for bit, each form timed twice in alternation
  mmacap   mma_gemv's defaults with a cap on the blocks an SM holds (Config.max_blocks) against none, plain and as
           PDL chains, 1, 2, 8 rows, both formats and shapes
Usage: PYTHONPATH=src python bench/quant_decode_sweep.py [--sections fp8det,moe,gemv] [--out DIR]
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_kernels import (BF16_PEAK, HBM, MAX_REL_ERR, ROUTE, copies_for, quantized_experts, rel,  # noqa: E402
                           run_sections, timed)


def sweep(configs, make, check, top=5):
    """[(seconds, config)] sorted, for the configs whose answer is right (relative error <= MAX_REL_ERR)."""
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
    return out[:top] + [tc for tc in out[top:] if tc[1] == "default"]  # the default config's time, always


def _fp8():
    from tpserve.kernels.quant import ref as qr
    from tpserve.kernels.quant.gemv_triton import w8a16_gemv

    def quantize(w):
        q, s = qr.fp8_block_quantize(w)
        return (q, s), qr.fp8_block_dequantize(q, s)

    def call(x, p, c):
        if c == "default":
            return w8a16_gemv(x, *p, (128, 128))
        bn, bk, nw, ns, wv, qt, pf = c
        return w8a16_gemv(x, *p, (128, 128), block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, waves=wv,
                          qtile=bool(qt), qtile_a=qt != "b", prefetch=pf)

    # (block_n, block_k, warps, stages, waves, qtile, prefetch)
    row = ([(bn, bk, 4, 3, 0, False, pf) for bn in (16, 32, 64) for bk in (128, 256, 512) for pf in (False, True)]
           + [(64, bk, 8, 3, 0, False, pf) for bk in (256, 512) for pf in (False, True)]
           + [(32, 128, 4, 3, 4, False, False)]  # an earlier best at M = 1: split K, 4 waves
           # and around 16 x 512 on 4 warps, no prefetch: narrower and wider
           + [(bn, bk, nw, 3, wv, False, False) for bn, bk, nw in ((8, 512, 2), (8, 1024, 4), (16, 1024, 4),
                                                                    (16, 512, 2), (16, 512, 8), (16, 2048, 8),
                                                                    (32, 1024, 8))
              for wv in (0, 2)])
    tiles = [(bn, 128, nw, ns, 0, qt, False) for (bn, nw, qt) in ((64, 4, "a"), (32, 2, "a"), (64, 4, "b"),
                                                                   (32, 4, "b"), (128, 8, "a"))
             for ns in (2, 3, 4, 5, 6)]
    per_value = [(bn, 128, 4, 3, wv, False, False) for bn in (32, 64) for wv in (0, 2, 4)]  # M > 1 without qtile
    split = [(32, 128, 4, 4, wv, "b", False) for wv in (1, 2, 4)] + [(64, 128, 4, 4, wv, "b", False) for wv in (2, 4)]
    # one pipeline stage (no shared-memory ring for W: more programs per SM), and 8-warp programs
    one_stage = [(bn, 128, nw, ns, wv, qt, False) for (bn, nw, qt) in ((32, 4, "b"), (64, 4, "b"), (64, 4, "a"),
                                                                        (128, 8, "a"), (64, 8, "b"))
                 for ns, wv in ((1, 0), (1, 2), (4, 2))]
    return quantize, call, {1: ["default"] + row + tiles[:10],
                            8: ["default"] + one_stage + tiles + [(64, 128, 4, 3, 2, "b", False)] + per_value
                            + split}, \
        lambda n, k: n * k + (n // 128) * (k // 128) * 4


def _fp4():
    from tpserve.kernels.quant import ref as qr
    from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv

    def quantize(w):
        p, bs, s2 = qr.nvfp4_quantize(w)
        return (p, bs, s2.reshape(1).expand(w.shape[0]).contiguous()), qr.nvfp4_dequantize(p, bs, s2)

    def call(x, p, c):
        bn, bk, nw, ns, wv, qt, _ = (None,) * 7 if c == "default" else c
        if c == "default":
            return w4a16_gemv(x, *p)
        if qt == "planes":  # the nibble-planes kernel (any M, the decode in the MMA's register operand)
            return w4a16_gemv(x, *p, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, waves=wv, planes=True)
        if qt in ("row", "row-bf16"):  # the one-row kernel: nvfp4_codes (float16 or bf16), FMAs, no dot
            return w4a16_gemv(x, *p, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, waves=wv, row=True,
                              row_f16=qt == "row")
        return w4a16_gemv(x, *p, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, waves=wv, qtile=bool(qt),
                          qtile_a=qt != "b", fp32_decode=False)

    # (block_n, block_k, warps, stages, waves, qtile form or "row", _); the earlier best first
    tiles = [(32, 512, 4, 3, 0, "b", False), (64, 256, 4, 3, 0, "a", False)]
    # one pipeline stage: no shared-memory ring for W, so more programs fit an SM (a 64 x 256 A-form program
    # with three stages takes 74 KB and runs one warp per scheduler); more warps per program
    tiles += [(bn, bk, nw, ns, wv, qt, False) for (bn, bk, nw, qt) in ((32, 512, 4, "b"), (64, 256, 4, "a"),
                                                                       (16, 512, 1, "a"), (16, 256, 2, "a"),
                                                                       (128, 256, 8, "a"), (64, 512, 8, "b"))
              for ns, wv in ((1, 0), (1, 2), (2, 0))]
    row = [(bn, bk, nw, 1, wv, "row", False) for bn, bk in ((8, 1024), (16, 512), (16, 1024), (32, 512), (32, 256),
                                                             (64, 256), (64, 128))
           for nw in (4, 8) for wv in (0, 2)]
    return quantize, call, {1: tiles + row, 8: tiles}, lambda n, k: n * k // 2 + n * k // 16


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
    print(f"\n{key} (floor {floor * 1e6:.1f} us; {len(cfgs)} configs, {time.time() - t0:.0f} s): bn, bk, warps, "
          f"stages, waves, form, prefetch", flush=True)
    for t, c in best:
        print(f"  {t * 1e6:6.1f} us  {100 * floor / t:3.0f}% of floor  {c}", flush=True)
    return best


def sec_gemv(res, only=None):
    for name, spec in (("w8a16", _fp8), ("w4a16", _fp4)):
        if only and name != only:
            continue
        quantize, call, configs, nbytes = spec()
        for n, k in ((12288, 4096), (4096, 12288)):
            packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
            for m in (1, 8):
                if f"{name} 12288x4096 M={m}" not in res and n != 12288:
                    continue
                x = torch.randn(m, k, device="cuda").bfloat16()
                cfgs = (configs[m] if n == 12288 or name == "w8a16"
                        else [c for c, _ in res[f"{name} 12288x4096 M={m}"]["best"][:3]])
                _case(res, f"{name} {n}x{k} M={m}", cfgs, call, x, packed, packs, x.float() @ wd.T, floor)


def sec_w4one(res):
    """W4A16 at one row, 12288 x 4096, every config's time printed: the grid and occupancy sweep after Nsight
    Compute showed the NVFP4 GEMVs at 2.7 (one-row kernel, qtile B) and 1.6 (qtile A) active warps per scheduler
    against the FP8 one-row kernel's 9.4: smaller tiles, 8 warps, one pipeline
    stage (no shared-memory ring, so more programs fit an SM) and K splits."""
    cfgs = ([(64, bk, 4, ns, wv, "a", False) for bk in (64, 128, 256) for ns in (1, 2) for wv in (0, 2, 4, 8)]
            + [(128, bk, 8, ns, wv, "a", False) for bk in (128, 256) for ns in (1, 2) for wv in (0, 2, 4)]
            + [(bn, bk, nw, 1, wv, "row", False) for bn in (8, 16, 32) for bk in (256, 512, 1024) for nw in (4, 8)
               for wv in (0, 2, 4)]
            + [(bn, bk, nw, 1, wv, "row-bf16", False) for bn, bk, nw in ((16, 512, 8), (32, 512, 4), (8, 1024, 8))
               for wv in (0, 2)]
            + [(32, 512, 4, 3, 0, "b", False)] + [(16, 256, 4, ns, wv, "b", False) for ns in (1, 2) for wv in (0, 4)])
    _all_configs(res, "w4a16 one row", _fp4, ((12288, 4096),), cfgs)


def sec_w4def(res):
    """W4A16 at one row, both shapes: the default (the one-row kernel, float16 decode) beside the eighteenth
    session's best (qtile B) and its default (the float32-bits decode); and the one-row kernel's PTX decode
    against the same bits in plain Triton (float16 and bf16), bit for bit."""
    from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv

    quantize, _, _, nbytes = _fp4()
    for n, k in ((12288, 4096), (4096, 12288)):
        packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
        x = torch.randn(1, k, device="cuda").bfloat16()
        ref = x.float() @ wd.T
        forms = {"default (one-row kernel, float16 decode, K split below 4 waves)": {},
                 "qtile B 32 x 512, 3 stages (18th session's best)": dict(qtile=True, qtile_a=False, block_n=32,
                                                                           block_k=512, waves=0, num_stages=3),
                 "float32-bits decode (18th session's default)": dict(row=False)}
        for name, kw in forms.items():
            t = timed([(lambda p=p: w4a16_gemv(x, *p, **kw)) for p in packs])
            e = rel(w4a16_gemv(x, *packed, **kw), ref)
            res[f"w4def {n}x{k} {name}"] = dict(us=t * 1e6, pct=100 * floor / t, rel_err=e)
            print(f"  w4a16 {n}x{k} M=1 {name}: {t * 1e6:.1f} us, {100 * floor / t:.0f}% of {floor * 1e6:.1f} us, "
                  f"rel err {e:.1e}", flush=True)
        if n == 4096:  # K splits for the one-row kernel where its row tiles alone are too few programs
            for bn, bk in ((16, 512), (32, 512), (16, 1024)):
                for wv in (0, 2, 4, 8):
                    t = timed([(lambda p=p: w4a16_gemv(x, *p, row=True, block_n=bn, block_k=bk, waves=wv))
                               for p in packs])
                    res[f"w4def {n}x{k} row {bn}x{bk} waves={wv}"] = dict(us=t * 1e6, pct=100 * floor / t)
                    print(f"  one-row kernel {bn} x {bk} waves {wv}: {t * 1e6:.1f} us, {100 * floor / t:.0f}%",
                          flush=True)
        for f16 in (True, False):
            a = w4a16_gemv(x, *packed, row=True, row_f16=f16)
            b = w4a16_gemv(x, *packed, row=True, row_f16=f16, asm=False)
            res[f"w4def {n}x{k} row f16={f16} ptx_eq_plain"] = bool(torch.equal(a, b))
            print(f"  one-row kernel f16={f16}: PTX == plain Triton {torch.equal(a, b)} ({int((a != b).sum())} "
                  f"differ)", flush=True)


def sec_w4planes(res):
    """W4A16 through the nibble-planes kernel (kernels/quant_gemv._nvfp4_planes_kernel): 72
    wgmma configs (rows 64 on 4 warps or 128 on 8, K tiles 128-512, 2-4 stages, K split over 0-8 waves) and 72
    mma.sync ones (16-64 rows on 1-4 warps) at 12288 x 4096, one row; the best five then at 8 and 16 rows and on
    4096 x 12288, each case beside the default there (one row: the one-row kernel; more: the per-value decode); and
    its PTX decode against plain Triton, bit for bit (one K split)."""
    from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv

    quantize, call, _, nbytes = _fp4()
    cfgs = [(bn, bk, nw, ns, wv, "planes", False) for bn, nw in ((64, 4), (128, 8)) for bk in (128, 256, 512)
            for ns in (2, 3, 4) for wv in (0, 2, 4, 8)]
    # fewer than 4 warps a 64-row tile: Triton takes mma.sync (no wgmma, whose register operand makes it wait
    # after every dot: ~20 us at any grid size)
    cfgs += [(bn, bk, nw, ns, wv, "planes", False) for bn, nw in ((16, 1), (16, 2), (32, 1), (32, 2), (32, 4), (64, 2))
             for bk in (128, 256) for ns in (2, 3) for wv in (0, 2, 4)]
    for n, k in ((12288, 4096), (4096, 12288)):
        packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
        for m in (1, 8, 16):
            x = torch.randn(m, k, device="cuda").bfloat16()
            best = _case(res, f"w4planes {n}x{k} M={m}", cfgs + ["default"], call, x, packed, packs,
                         x.float() @ wd.T, floor)
            cfgs = [c for _, c in best if c != "default"][:5]
            a = w4a16_gemv(x, *packed, planes=True, waves=0)  # one K split: no atomics, a fixed order
            b = w4a16_gemv(x, *packed, planes=True, waves=0, asm=False)
            res[f"w4planes {n}x{k} M={m} ptx_eq_plain"] = bool(torch.equal(a, b))
            print(f"  planes kernel {n}x{k} M={m}: PTX == plain Triton {torch.equal(a, b)} "
                  f"({int((a != b).sum())} differ)", flush=True)


def sec_w4tiled(res):
    """Is the NVFP4 GEMVs' common ~17-20 us (whatever their instruction count, 4.1-6.7 a weight) DRAM locality? Their
    steps read 16-256 contiguous bytes a row (the FP8 one-row kernel at 84% reads 4 KB): the planes kernel on tiled
    weights (quant_gemv.nvfp4_tiled: each step one contiguous chunk) against the same configs on row-major weights,
    and the one-row kernel with whole-row K tiles (0.5-2 KB a row), every config printed."""
    from tpserve.kernels.quant.gemv_nvfp4_triton import nvfp4_tiled, w4a16_gemv

    quantize, call, _, nbytes = _fp4()
    planes = [(64, 256, 4, 3, 0), (64, 256, 4, 3, 2), (64, 512, 4, 3, 2), (128, 256, 8, 3, 0), (32, 256, 1, 3, 0),
              (32, 256, 1, 3, 2), (16, 256, 1, 3, 2), (32, 128, 1, 2, 2)]
    rows = [(bn, bk, nw, 1, wv, "row", False) for bn in (2, 4, 8) for bk in (1024, 2048, 4096) for nw in (4, 8)
            for wv in (0, 2)]
    for n, k, ms in ((12288, 4096, (1, 8)), (4096, 12288, (1,))):
        packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
        for m in ms:
            x = torch.randn(m, k, device="cuda").bfloat16()
            ref = x.float() @ wd.T
            for bn, bk, nw, ns, wv in planes:
                kw = dict(block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, waves=wv, planes=True)
                tiled = [nvfp4_tiled(p[0], p[1], bn, bk) + (p[2],) for p in packs]
                e_row, e_tiled = rel(w4a16_gemv(x, *packed, **kw), ref), rel(w4a16_gemv(x, *tiled[0], tiled=True,
                                                                                       **kw), ref)
                t_row = timed([(lambda p=p: w4a16_gemv(x, *p, **kw)) for p in packs])
                t_tiled = timed([(lambda p=p: w4a16_gemv(x, *p, tiled=True, **kw)) for p in tiled])
                del tiled
                res[f"w4tiled {n}x{k} M={m} planes {(bn, bk, nw, ns, wv)}"] = dict(
                    row_major_us=t_row * 1e6, tiled_us=t_tiled * 1e6, rel_err=[e_row, e_tiled])
                print(f"  {n}x{k} M={m} planes {(bn, bk, nw, ns, wv)}: row-major {t_row * 1e6:.1f} us "
                      f"({100 * floor / t_row:.0f}%), tiled {t_tiled * 1e6:.1f} us ({100 * floor / t_tiled:.0f}%); "
                      f"rel err {e_row:.1e} / {e_tiled:.1e}{'  WRONG' if max(e_row, e_tiled) > MAX_REL_ERR else ''}",
                      flush=True)
            if m == 1:
                _case(res, f"w4tiled one-row kernel, whole-row K tiles {n}x{k}", rows + ["default"], call, x, packed,
                      packs, ref, floor, top=len(rows) + 1)


def _all_configs(res, name, spec, shapes, cfgs, m=1):
    """Every config of `cfgs` on each shape, at m rows, its time printed (fastest first)."""
    quantize, call, _, nbytes = spec()
    for n, k in shapes:
        packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
        x = torch.randn(m, k, device="cuda").bfloat16()
        _case(res, f"{name} {n}x{k} M={m}", cfgs, call, x, packed, packs, x.float() @ wd.T, floor, top=len(cfgs))


def sec_rows(res):
    """The one-row kernels on both shapes, every config printed: NVFP4 (the float16 decode) and FP8 (wider K tiles
    and fewer rows per program for 4096 x 12288)."""
    shapes = ((12288, 4096), (4096, 12288))
    row4 = [(bn, bk, nw, 1, wv, "row", False) for bn in (16, 32) for bk in (256, 512, 1024) for nw in (4, 8)
            for wv in (0, 4, 8)]
    row8 = ["default"] + [(bn, bk, nw, 3, wv, False, False) for bn in (4, 8, 16, 32) for bk in (1024, 2048, 4096)
                          for nw in (4, 8) for wv in (0, 2)]
    _all_configs(res, "w4a16 row", _fp4, shapes, row4)
    _all_configs(res, "w8a16 row", _fp8, shapes, row8)


def sec_w8def(res):
    """W8A16 at one row, both shapes: the default (4096-wide K tiles where K allows) beside the configs it takes."""
    _all_configs(res, "w8a16 default", _fp8, ((12288, 4096), (4096, 12288)),
                 ["default", (4, 4096, 8, 3, 2, False, False), (8, 4096, 4, 3, 2, False, False),
                  (16, 512, 8, 3, 2, False, False), (16, 2048, 8, 3, 0, False, False)])


def sec_w8split(res):
    """W8A16 at 8 rows, both shapes: qtile B with its K split over 0-8 waves of programs, each kernel's device time
    (torch.profiler over the rotated weight copies): the GEMV kernel alone against the zero fill and the fp32 -> bf16
    cast a split adds. Nsight Compute saw the unsplit 384-program grid at 2.7 warps per scheduler; if the split kernel
    alone nears the 80% goal (14.6 us), an in-kernel reduction (no fill, no cast launch) is worth building."""
    quantize, call, _, nbytes = _fp8()
    for n, k in ((12288, 4096), (4096, 12288)):
        packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
        x = torch.randn(8, k, device="cuda").bfloat16()
        for c in [(bn, 128, 4, 4, wv, "b", False) for bn in (32, 64) for wv in (0, 2, 4, 8)]:
            e = rel(call(x, packed, c), x.float() @ wd.T)
            t = timed([(lambda p=p: call(x, p, c)) for p in packs])
            prof = profile_kernels(lambda: [call(x, p, c) for p in packs], len(packs))
            gemv = sum(us for name, us in prof.items() if "gemv" in name)
            res[f"w8split {n}x{k} {c}"] = dict(us=t * 1e6, kernels_us=prof, gemv_us=gemv, rel_err=e)
            print(f"  w8a16 {n}x{k} M=8 {c}: {t * 1e6:.1f} us ({100 * floor / t:.0f}%), the GEMV kernel alone "
                  f"{gemv:.1f} us ({100 * floor / (gemv * 1e-6):.0f}%); by kernel: "
                  + "; ".join(f"{name} {us:.1f}" for name, us in prof.items()), flush=True)


def _mma_run(fmt: str, x, packed, cfg):
    """kernels/mma_gemv.py's GEMV of `fmt` on packed weights (as _fp8 / _fp4 quantize them), at config cfg."""
    from tpserve.kernels.quant import gemv_cuda as mg

    return mg.fp8_gemv(x, *packed, cfg=cfg) if fmt == "fp8" else mg.nvfp4_gemv(x, *packed, cfg=cfg)


def sec_mma(res):
    """W8A16 and W4A16 at 1-8 rows through kernels/mma_gemv.py: first odd shapes (N not a multiple of 16, K one or
    two chunks, more warps than chunks) for every config against fp32 math, every e4m3 code through the FP8 decode,
    a graph replay against the eager call, then both shapes timed with the Triton default beside them (printed as
    "default": w8a16_gemv's / w4a16_gemv's default, which may itself be this kernel where it is the default)."""
    from tpserve.kernels.quant import gemv_cuda as mg
    from tpserve.kernels.quant import ref as qr

    def configs(fmt):
        return [mg.Config(fmt, r, sp, d, pf, il) for r, depths in ((1, (2, 4, 6)), (2, (2, 3)))
                for sp in (2, 4, 8) for d in depths for pf in (0, 256) for il in (False, True)]

    for fmt, spec in (("fp8", _fp8), ("nvfp4", _fp4)):
        quantize, call, _, nbytes = spec()
        cfgs, worst = configs(fmt), 0.0
        for n, k, m in ((1000, 256, 3), (4096, 512, 8), (48, 1024, 1), (12288 + 16, 512, 5)):
            packed, wd = quantize(torch.randn(n, k, device="cuda") / k**0.5)
            x = torch.randn(m, k, device="cuda").bfloat16()
            ref = x.float() @ wd.T
            for c in cfgs:
                e = rel(_mma_run(fmt, x, packed, c), ref)
                worst = max(worst, e)
                if e > 4e-3:
                    print(f"  mma {fmt} {n}x{k} M={m} {c}: WRONG, rel err {e:.1e}", flush=True)
        res[f"mma {fmt} odd shapes worst rel err"] = worst
        print(f"mma {fmt}: odd shapes, {len(cfgs)} configs: worst rel err against fp32 math {worst:.1e}", flush=True)
        # a CUDA-graph replay gives the eager call's output, bit for bit (the launch goes to the capturing stream)
        packed, _ = quantize(torch.randn(4096, 4096, device="cuda") / 64)
        x = torch.randn(8, 4096, device="cuda").bfloat16()
        eager = _mma_run(fmt, x, packed, None)
        g, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.cuda.graph(g):
            out = _mma_run(fmt, x, packed, None)
        g.replay()
        torch.cuda.synchronize()
        res[f"mma {fmt} graph == eager"] = bool(torch.equal(out, eager))
        print(f"mma {fmt}: graph replay == eager: {res[f'mma {fmt} graph == eager']}", flush=True)

        def mcall(x, p, c):
            return call(x, p, "default") if c == "default" else _mma_run(fmt, x, p, c)

        for n, k in ((12288, 4096), (4096, 12288)):
            packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
            for m in (8, 1):
                x = torch.randn(m, k, device="cuda").bfloat16()
                key = f"mma {fmt} {n}x{k} M={m}"
                best = _case(res, key, ["default"] + cfgs, mcall, x, packed, packs, x.float() @ wd.T, floor, top=6)
                res[key]["best"] = [(str(c), us) for c, us in res[key]["best"]]
                top = next(c for _, c in best if c != "default")
                for mm in (2, 4):
                    xm = torch.randn(mm, k, device="cuda").bfloat16()
                    t = timed([(lambda p=p: _mma_run(fmt, xm, p, top)) for p in packs])
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


def _mma_sweep(res, tag: str, configs, top: int | None = None) -> None:
    """Both formats and shapes at 8 rows: configs(fmt, n, k) -> the kernels/mma_gemv.py configs to time beside the
    GEMV's default (each checked against fp32 math first); the best `top` (default all) into res[f"{tag} ..."]."""
    for fmt, spec in (("fp8", _fp8), ("nvfp4", _fp4)):
        quantize, call, _, nbytes = spec()

        def mcall(x, p, c, fmt=fmt, call=call):
            return call(x, p, "default") if c == "default" else _mma_run(fmt, x, p, c)

        for n, k in ((12288, 4096), (4096, 12288)):
            cfgs = configs(fmt, n, k)
            packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
            x = torch.randn(8, k, device="cuda").bfloat16()
            key = f"{tag} {fmt} {n}x{k} M=8"
            _case(res, key, ["default"] + cfgs, mcall, x, packed, packs, x.float() @ wd.T, floor,
                  top=top or len(cfgs) + 1)
            res[key]["best"] = [(str(c), us) for c, us in res[key]["best"]]


def sec_mma2(res):
    """kernels/mma_gemv.py at 8 rows, around the first sweep's best (interleaved K chunks): more warps a block
    (the interleave width), two to four row tiles a warp, both formats. (The driver's smallest shared-memory carveout,
    for more L1 to hold x, measured slower or level everywhere and was removed.)"""
    from tpserve.kernels.quant import gemv_cuda as mg

    fp8 = [mg.Config("fp8", r, sp, d, pf, True) for r in (1, 2) for sp in (4, 6, 8, 10, 12, 16) for d in (2, 3)
           for pf in (0, 256)]
    fp4 = [mg.Config("nvfp4", r, sp, 2, 256, True) for r in (2, 3, 4) for sp in (2, 4, 8)]
    _mma_sweep(res, "mma2", lambda fmt, n, k: fp8 if fmt == "fp8" else fp4, top=8)


def sec_mma3(res):
    """kernels/mma_gemv.py at 8 rows: the defaults beside more warps a block and a deeper pipeline, both formats and
    shapes. (Asking a chunk's x into L1 with its W loads, `prefetch.global.L1`, measured 1.2-1.4x slower everywhere
    and was removed.)"""
    from tpserve.kernels.quant import gemv_cuda as mg

    def configs(fmt, n, k):
        base = mg.default_config(fmt, n, k)
        return [dataclasses.replace(base, depth=d, splits=sp) for d in (2, 3)
                for sp in ((4, 6) if base.rows == 2 else (8, 12, 16))]

    _mma_sweep(res, "mma3", configs)


def sec_mma4(res):
    """kernels/mma_gemv.py at 8 rows: the defaults beside 16 warps a block with two blocks held per SM
    (`min_blocks`: ptxas caps the registers at 64, so every block of 4096 x 12288 is resident at once and a block
    reads 2 KB of each row together), and other configs held to more blocks per SM."""
    from tpserve.kernels.quant import gemv_cuda as mg

    def configs(fmt, n, k):
        base = mg.default_config(fmt, n, k)
        alts = [dict(splits=16, min_blocks=2), dict(splits=12, min_blocks=2), dict(splits=16, min_blocks=2, rows=1)]
        if base.rows == 2:
            alts += [dict(splits=8, min_blocks=3), dict(min_blocks=3), dict(min_blocks=4)]
        return list(dict.fromkeys(dataclasses.replace(base, **a) for a in alts))

    _mma_sweep(res, "mma4", configs)


def sec_mmadef(res):
    """The GEMVs' defaults as they stand (w8a16_gemv / w4a16_gemv: kernels/mma_gemv.py where it is the default)
    against the Triton kernels they replaced (mma=False), 1-8 rows, both shapes, in one run."""
    from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv
    from tpserve.kernels.quant.gemv_triton import w8a16_gemv

    forms = {"fp8": (_fp8, lambda x, p, mma: w8a16_gemv(x, *p, (128, 128), mma=mma)),
             "nvfp4": (_fp4, lambda x, p, mma: w4a16_gemv(x, *p, mma=mma))}
    print("| format | N x K | M | default us (% floor) | Triton (mma=False) us (% floor) | Triton / default |\n"
          "| --- | --- | --- | --- | --- | --- |", flush=True)
    for fmt, (spec, fn) in forms.items():
        quantize, _, _, nbytes = spec()
        for n, k in ((12288, 4096), (4096, 12288)):
            packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
            for m in (1, 2, 4, 8):
                x = torch.randn(m, k, device="cuda").bfloat16()
                ref = x.float() @ wd.T
                errs = [rel(fn(x, packed, mma), ref) for mma in (None, False)]
                t = [timed([(lambda p=p, mma=mma: fn(x, p, mma)) for p in packs]) for mma in (None, False)]
                res[f"mmadef {fmt} {n}x{k} M={m}"] = dict(default_us=t[0] * 1e6, triton_us=t[1] * 1e6,
                                                          floor_us=floor * 1e6, rel_err=errs)
                print(f"| {fmt} | {n} x {k} | {m} | {t[0] * 1e6:.1f} ({100 * floor / t[0]:.0f}%) | "
                      f"{t[1] * 1e6:.1f} ({100 * floor / t[1]:.0f}%) | {t[1] / t[0]:.2f} |", flush=True)


def _experts_setup():
    e, d, i = 288, 4096, 2048
    g = torch.Generator(device="cuda").manual_seed(0)
    gu = torch.randn(e, 2 * i, d, device="cuda", generator=g, dtype=torch.bfloat16) / d**0.5
    dn = torch.randn(e, d, i, device="cuda", generator=g, dtype=torch.bfloat16) / i**0.5
    return quantized_experts(gu, dn), e, d, i


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

    # (block_n, block_k, warps, stages, qtile form)
    cases = {"nvfp4": (nvfp4, 3 * i * d * (0.5 + 1 / 16),
                       [(bn, bk, nw, ns, qt) for (bn, bk, nw, qt) in ((32, 256, 4, "b"), (64, 256, 4, "b"),
                                                                      (32, 256, 2, "a"), (64, 256, 4, "a"),
                                                                      # more warps per program: at one token a
                                                                      # 64 x 256 program on 4 warps is alone on
                                                                      # its SM (shared memory), one warp per
                                                                      # scheduler (40% of the floor)
                                                                      (64, 256, 8, "b"), (64, 256, 8, "a"),
                                                                      (128, 256, 8, "a"), (64, 128, 8, "b"))
                        for ns in (1, 2, 3, 4, 5)]),
             "fp8": (fp8, 3 * i * d * (1 + 4 / 128**2),
                     [(bn, 128, nw, ns, qt) for (bn, nw, qt) in ((64, 4, "b"), (32, 4, "b"), (64, 4, "a"),
                                                                 (64, 8, "b"), (128, 8, "a"), (64, 8, "a"))
                      for ns in (2, 3, 4, 5)])}
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


def sec_fp8det(res):
    from tpserve.kernels.quant import ref as qr
    from tpserve.kernels.quant.gemv_triton import w8a16_gemv

    w = torch.randn(4096, 4096, device="cuda") / 64
    q, s = qr.fp8_block_quantize(w)
    wd = qr.fp8_block_dequantize(q, s)
    for m, waves, qa in itertools.product((1, 8), (4, 0), (True, False)):
        x = torch.randn(m, 4096, device="cuda").bfloat16()
        ref = x.float() @ wd.T

        def f(asm):
            return w8a16_gemv(x, q, s, (128, 128), qtile=True, asm=asm, waves=waves, qtile_a=qa)
        a, b, b2 = f(None), f(False), f(False)
        row = dict(m=m, waves=waves, qtile_a=qa, ptx_eq_plain=bool(torch.equal(a, b)),
                   plain_eq_plain=bool(torch.equal(b, b2)), ptx_err=rel(a, ref), plain_err=rel(b, ref),
                   differing=int((a != b).sum()))
        res.setdefault("fp8det", []).append(row)
        print(f"  fp8 GEMV qtile M={m} waves={waves} A={qa}: PTX == plain {row['ptx_eq_plain']} ({row['differing']} "
              f"differ), plain == plain {row['plain_eq_plain']}, rel err PTX {row['ptx_err']:.2e} plain "
              f"{row['plain_err']:.2e}", flush=True)


def sec_prefill(res):
    """bf16 MoE prefill (grouped_mm) at 4k / 16k tokens: experts_grouped as bench/quant_kernels.py timed it (torch
    combine and SwiGLU) and as the engine runs it on CUDA (Triton combine; SwiGLU as --act-backend says), the two
    grouped GEMMs alone on pre-sorted rows, and the engine form's device time by kernel."""
    from tpserve.kernels.moe import ref as moe

    e, d, i, k = 288, 4096, 2048, 8
    g = torch.Generator(device="cuda").manual_seed(0)
    gu = torch.randn(e, 2 * i, d, device="cuda", generator=g, dtype=torch.bfloat16) / d**0.5
    dn = torch.randn(e, d, i, device="cuda", generator=g, dtype=torch.bfloat16) / i**0.5
    peak = BF16_PEAK
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

        forms = {"combine torch, act torch": lambda: moe.experts_grouped(x, w, ids, gu, dn, 10.0),
                 "combine triton, act torch": lambda: moe.experts_grouped(x, w, ids, gu, dn, 10.0, "triton"),
                 "combine triton, act triton": lambda: moe.experts_grouped(x, w, ids, gu, dn, 10.0, "triton",
                                                                           "triton"),
                 "the two grouped_mm alone": gemms}
        a = moe.experts_grouped(x, w, ids, gu, dn, 10.0, "triton", "triton").float()
        b = moe.experts_grouped(x, w, ids, gu, dn, 10.0).float()
        print(f"\nMoE prefill bf16, {t} tokens (act triton vs torch: rel diff "
              f"{((a - b).abs().max() / b.abs().max()).item():.1e})", flush=True)
        for name, fn in forms.items():
            tt = timed(fn, reps=3)
            res[f"prefill {t} {name}"] = dict(ms=tt * 1e3, mfu=100 * flops / tt / peak)
            print(f"  {name}: {tt * 1e3:.2f} ms, {flops / tt / 1e12:.0f} TFLOP/s, {100 * flops / tt / peak:.1f}% MFU",
                  flush=True)
        prof = profile_kernels(forms["combine triton, act triton"], 1, reps=3)
        res[f"prefill {t} kernels_us"] = prof
        print("  by kernel: " + "; ".join(f"{k_} {us / 1e3:.2f} ms" for k_, us in list(prof.items())[:8]), flush=True)


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


def sec_m1(res):
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1
    from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv
    from tpserve.kernels.quant.gemm_triton import experts_nvfp4_triton

    quantize, _, _, nbytes = _fp4()
    cfgs = [m1.Config(r, sp, st, 256, dec) for r in (1, 2) for sp in (2, 4, 8) for st in (2, 3)
            for dec in ("lut", "shift")]
    worst = 0.0
    for n, k in ((1000, 256), (4096, 512), (48, 1024), (12288 + 16, 512)):
        packed, wd = quantize(torch.randn(n, k, device="cuda") / k**0.5)
        x = torch.randn(1, k, device="cuda").bfloat16()
        ref = x.float() @ wd.T
        for c in cfgs:
            e = rel(m1.gemv(x, *packed, c), ref)
            worst = max(worst, e)
            if e > 4e-3:
                print(f"  m1 {n}x{k} {c}: WRONG, rel err {e:.1e}", flush=True)
    res["m1 odd shapes worst rel err"] = worst
    print(f"m1 dense: odd shapes, {len(cfgs)} configs: worst rel err against fp32 math {worst:.1e}", flush=True)
    packed, _ = quantize(torch.randn(4096, 4096, device="cuda") / 64)
    x = torch.randn(1, 4096, device="cuda").bfloat16()
    eager = m1.gemv(x, *packed, m1.Config(decode="shift"))
    g, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(g):
        out = m1.gemv(x, *packed, m1.Config(decode="shift"))
    g.replay()
    torch.cuda.synchronize()
    res["m1 graph == eager"] = bool(torch.equal(out, eager))
    print(f"m1 dense: graph replay == eager {res['m1 graph == eager']}", flush=True)

    def dcall(x, p, c):
        if c == "triton":
            return w4a16_gemv(x, *p, mma=False)
        if c == "mma_gemv":
            return w4a16_gemv(x, *p)
        return m1.gemv(x, *p, c)

    for n, k in ((12288, 4096), (4096, 12288)):
        packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
        x = torch.randn(1, k, device="cuda").bfloat16()
        key = f"m1 dense {n}x{k} M=1"
        _case(res, key, ["triton", "mma_gemv"] + cfgs, dcall, x, packed, packs, x.float() @ wd.T, floor, top=8)
        for c in ("triton", "mma_gemv"):
            t = timed([(lambda p=p, c=c: dcall(x, p, c)) for p in packs])
            res[key][c] = t * 1e6
            print(f"  {c}: {t * 1e6:.1f} us ({100 * floor / t:.0f}%)", flush=True)
        res[key]["best"] = [(str(c), us) for c, us in res[key]["best"]]

    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()

    def triton_experts(ids, w, x):  # the engine's default form (--quant-decode-backend auto: qtile-b)
        return experts_nvfp4_triton(x, w, ids, P["gp"], P["gb"], P["g2rows"], P["dp"], P["db"], P["d2rows"], 10.0,
                                    ROUTE, qtile=True, qtile_a=False)

    def m1_experts(ids, w, x, c):
        return m1.experts(x, w, ids, P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0, c[0], c[1])

    ecfgs = [(m1.Config(r, sp, st, 256, dec), m1.Config(r2, sp2, st, 256, dec))
             for r, sp in ((1, 2), (1, 4), (1, 8)) for r2, sp2 in ((1, 4), (2, 4)) for dec in ("lut", "shift")
             for st in ((3,) if dec == "lut" else (2, 3, 4))]
    for t in (1, 8):
        routes, touched, floor, ref = _nvfp4_moe_case(P, e, d, i, t)
        err_t = rel(triton_experts(*routes[0]), ref)
        best = sweep(["triton"] + ecfgs,
                     lambda c: [(lambda r=r: triton_experts(*r) if c == "triton" else m1_experts(*r, c))
                                for r in routes],
                     lambda c: rel(triton_experts(*routes[0]) if c == "triton" else m1_experts(*routes[0], c), ref),
                     top=8)
        tt = timed([(lambda r=r: triton_experts(*r)) for r in routes])
        print(f"\nMoE decode nvfp4 {t} token(s), {touched:.1f} experts touched, floor {floor * 1e6:.0f} us; Triton "
              f"{tt * 1e6:.1f} us ({100 * floor / tt:.0f}%, rel err {err_t:.1e}); m1 (gate_up cfg, down cfg):",
              flush=True)
        for s_, c in best:
            print(f"  {s_ * 1e6:6.1f} us  {100 * floor / s_:3.0f}% of floor  {c}", flush=True)
        c = next((c for _, c in best if c != "triton"), None)
        if c is None:
            continue
        gr, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.cuda.graph(gr):
            out = m1_experts(*routes[0], c)
        gr.replay()
        torch.cuda.synchronize()
        same = bool(torch.equal(out, m1_experts(*routes[0], c)))
        prof = profile_kernels(lambda: [m1_experts(*r, c) for r in routes], len(routes))
        gemm = sum(us for k_, us in prof.items() if "nvfp4_m1" in k_)
        print(f"  graph == eager {same}; per call, device time by kernel ({c}): "
              + "; ".join(f"{k_} {us:.1f} us" for k_, us in prof.items())
              + f"; the two GEMV kernels {gemm:.1f} us = {100 * floor * 1e6 / gemm:.0f}% of floor", flush=True)
        res[f"m1 moe t={t}"] = dict(touched=touched, floor_us=floor * 1e6, triton_us=tt * 1e6, triton_err=err_t,
                                    best=[(str(c_), s_ * 1e6) for s_, c_ in best], kernels_us=prof, gemm_us=gemm,
                                    graph_eq=same)


def sec_m1def(res):
    """The defaults as they stand: the NVFP4 GEMV at one row (w4a16_gemv: nvfp4_m1) beside mma_gemv's and Triton's,
    both shapes; the MoE experts (quant_ops.experts_nvfp4's choice: nvfp4_m1 up to M1_MAX_TOKENS) beside the Triton
    experts at 1, 8, 16 and 32 tokens (8 routings in turn), each checked against fp32 math."""
    from tpserve.kernels.quant import gemv_cuda as mg
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1
    from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv
    from tpserve.kernels.quant.gemm_triton import experts_nvfp4_triton

    quantize, _, _, nbytes = _fp4()
    forms = {"default (nvfp4_m1)": lambda x, p: w4a16_gemv(x, *p), "mma_gemv": lambda x, p: mg.nvfp4_gemv(x, *p),
             "triton": lambda x, p: w4a16_gemv(x, *p, mma=False)}
    print("| N x K | form | us | % floor | rel err |\n| --- | --- | --- | --- | --- |", flush=True)
    for n, k in ((12288, 4096), (4096, 12288)):
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
    """nvfp4_m1's experts at 1 and 8 tokens: the gate|up config swept with down at its default, then down's with
    gate|up at its default (whole MoE layer timed, 8 routings in turn; each config against fp32 math first). (Gate|up's
    blocks asking L2 for their pair's down weights measured 1.16-1.21x slower at 1, 2 and 8 tokens and were removed.)"""
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()
    shapes = [m1.Config(r, sp, st, 256, "shift") for r in (1, 2) for sp in (2, 4, 8, 16) for st in (2, 3)]
    for t in (1, 8):
        routes, touched, floor, ref = _nvfp4_moe_case(P, e, d, i, t)

        def run(r, c):
            return m1.experts(r[2], r[1], r[0], P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0, *c)

        for which in ("gate_up", "down"):
            cfgs = ["default"] + [(c, None) if which == "gate_up" else (None, c) for c in shapes]
            call = lambda r, c: run(r, (None, None) if c == "default" else c)  # noqa: E731
            best = sweep(cfgs, lambda c: [(lambda r=r: call(r, c)) for r in routes],
                         lambda c: rel(call(routes[0], c), ref), top=6)
            print(f"\nMoE nvfp4_m1 {t} token(s), {which} swept (floor {floor * 1e6:.0f} us):", flush=True)
            for s_, c in best:
                print(f"  {s_ * 1e6:6.1f} us  {100 * floor / s_:3.0f}% of floor  {c}", flush=True)
            res[f"m1exp t={t} {which}"] = dict(floor_us=floor * 1e6, best=[(str(c), s_ * 1e6) for s_, c in best])


def sec_m1sum(res):
    """nvfp4_m1's experts with the down kernel summing a token's choices ("down_sum": a block a row tile and token,
    its warps taking the (choice, chunk) items in turn; no fp32 rows, no combine kernel) against down per pair +
    route_triton.combine_choices, at 1, 2 and 8 tokens; down_sum's config swept (whole MoE layer timed, 8 routings
    in turn, each form against fp32 math first), then the best's kernels profiled."""
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()
    shapes = [m1.Config(r, sp, st, 256, "shift") for r in (1, 2) for sp in (4, 8, 16) for st in (2, 3)]
    for t in (1, 2, 8):
        routes, touched, floor, ref = _nvfp4_moe_case(P, e, d, i, t)

        def run(r, c):
            if c == "per pair + combine":
                return m1.experts(r[2], r[1], r[0], P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0,
                                  sum_choices=False)
            return m1.experts(r[2], r[1], r[0], P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0, None,
                              None if c == "down_sum default" else c, sum_choices=True)

        best = sweep(["per pair + combine", "down_sum default"] + shapes,
                     lambda c: [(lambda r=r: run(r, c)) for r in routes], lambda c: rel(run(routes[0], c), ref),
                     top=8)
        print(f"\nMoE nvfp4_m1 {t} token(s), {touched:.1f} experts touched, floor {floor * 1e6:.0f} us:", flush=True)
        for s_, c in best:
            print(f"  {s_ * 1e6:6.1f} us  {100 * floor / s_:3.0f}% of floor  {c}", flush=True)
        res[f"m1sum t={t}"] = dict(floor_us=floor * 1e6, touched=touched,
                                   best=[(str(c), s_ * 1e6) for s_, c in best])
        for c in ("per pair + combine", best[0][1]):
            prof = profile_kernels(lambda c=c: [run(r, c) for r in routes], len(routes))
            print(f"  kernels ({c}): " + "; ".join(f"{k_} {us:.1f} us" for k_, us in prof.items()), flush=True)
            res[f"m1sum t={t} kernels {c}"] = prof


def sec_m1par(res):
    """What a gate|up -> down overlap could win at 1 and 8 tokens: nvfp4_m1's gate|up kernel alone, down_sum alone,
    the two in sequence (the experts without their allocations), and the two on two streams at once with no
    dependency (a wrong answer: only a bound on what overlapping their fill and drain could give). Graph replays,
    8 routings in turn."""
    from tpserve.kernels.quant import gemv_cuda as mg
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()
    cg, cd = m1.default_config("gate_up", i), m1.default_config("down_sum", d)
    side = torch.cuda.Stream()
    for t in (1, 8):
        routes, touched, floor, _ = _nvfp4_moe_case(P, e, d, i, t)
        bufs = [(r, r[0].reshape(-1).contiguous(), r[1].reshape(-1).float().contiguous(),
                 torch.zeros(t * 8, i, dtype=torch.bfloat16, device="cuda"),
                 torch.empty(t, d, dtype=torch.bfloat16, device="cuda")) for r in routes]

        def gate_up(b):
            r, flat, _, h, _ = b
            m1._launch(cg, "gate_up", (i // 16, t * 8), mg._aligned(P["gp"], 16), P["gb"].view(torch.uint8),
                       P["g2"], r[2].view(torch.int16), flat, None, h.view(torch.int16), i, d, 8, e, 10.0,
                       h_shift=cd.decode == "shift")  # (h as down reads it)

        def down(b):
            _, flat, wt, h, y = b
            m1._launch(cd, "down_sum", (d // 16, t), mg._aligned(P["dp"], 16), P["db"].view(torch.uint8), d2,
                       h.view(torch.int16), flat, wt, y.view(torch.int16), d, i, 8, e)

        def both(b):
            gate_up(b)
            down(b)

        def concurrent(b):
            side.wait_stream(torch.cuda.current_stream())
            gate_up(b)
            with torch.cuda.stream(side):
                down(b)
            torch.cuda.current_stream().wait_stream(side)

        print(f"\nnvfp4_m1 experts, {t} token(s), floor {floor * 1e6:.0f} us (gate|up {floor * 2e6 / 3:.1f}, down "
              f"{floor * 1e6 / 3:.1f}):", flush=True)
        for name, fn in (("gate_up alone", gate_up), ("down_sum alone", down), ("sequential", both),
                         ("concurrent (no dependency)", concurrent)):
            tt = timed([(lambda b=b, fn=fn: fn(b)) for b in bufs])
            res[f"m1par t={t} {name}"] = tt * 1e6
            print(f"  {name}: {tt * 1e6:.1f} us", flush=True)


def sec_mmasmem(res):
    """kernels/mma_gemv.py with W staged through shared memory (Config.stage "smem": cp.async into a ring of depth
    chunks a warp) against its register loads: odd shapes bit for bit against the same config's "regs" form, then
    both shapes at 1 and 8 rows (and the best at 2 and 4) over smem configs (and two 16-warp regs configs), beside
    w8a16_gemv's / w4a16_gemv's default ("default") and mma_gemv's default config ("mma regs")."""
    from tpserve.kernels.quant import gemv_cuda as mg

    def configs(fmt):  # (16 warps: Nsight Compute found 4096 x 12288's 256 blocks of 8 warps
        # holding ~15 warps an SM, the grid too small to fill it: 16 warps fit twice an SM only from shared memory)
        return [mg.Config(fmt, r, sp, d, 256, True, 0, "smem") for r in (1, 2) for sp in (2, 4, 8, 16)
                for d in (2, 3, 4, 6)] + [mg.Config(fmt, 1, 16, d, 256, True) for d in (2, 3)]

    for fmt, spec in (("fp8", _fp8), ("nvfp4", _fp4)):
        quantize, call, _, nbytes = spec()
        limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
        cfgs, same = [c for c in configs(fmt) if c.smem_bytes <= limit], True
        for n, k, m in ((1000, 256, 3), (4096, 512, 8), (48, 1024, 1), (12288 + 16, 512, 5)):
            packed, _ = quantize(torch.randn(n, k, device="cuda") / k**0.5)
            x = torch.randn(m, k, device="cuda").bfloat16()
            for c in cfgs:
                a = _mma_run(fmt, x, packed, c)
                b = _mma_run(fmt, x, packed, dataclasses.replace(c, stage="regs"))  # (a regs config: itself)
                if not torch.equal(a, b):
                    same = False
                    print(f"  mma {fmt} {n}x{k} M={m} {c}: smem != regs", flush=True)
        res[f"mmasmem {fmt} odd shapes smem == regs"] = same
        print(f"mma {fmt}: odd shapes, {len(cfgs)} smem configs bit for bit the regs form: {same}", flush=True)

        def mcall(x, p, c):
            if c == "default":
                return call(x, p, "default")
            return _mma_run(fmt, x, p, None if c == "mma regs" else c)

        for n, k in ((12288, 4096), (4096, 12288)):
            packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
            for m in (1, 8):
                x = torch.randn(m, k, device="cuda").bfloat16()
                key = f"mmasmem {fmt} {n}x{k} M={m}"
                best = _case(res, key, ["default", "mma regs"] + cfgs, mcall, x, packed, packs, x.float() @ wd.T,
                             floor, top=6)
                res[key]["best"] = [(str(c), us) for c, us in res[key]["best"]]
                for name in ("default", "mma regs"):
                    if all(c != name for _, c in best):
                        t = timed([(lambda p=p, name=name: mcall(x, p, name)) for p in packs])
                        res[key][name] = t * 1e6
                        print(f"  {name}: {t * 1e6:.1f} us ({100 * floor / t:.0f}%)", flush=True)
                top = next(c for _, c in best if c not in ("default", "mma regs"))
                for mm in (2, 4):
                    xm = torch.randn(mm, k, device="cuda").bfloat16()
                    for c in (top, "mma regs", "default"):
                        t = timed([(lambda p=p, c=c: mcall(xm, p, c)) for p in packs])
                        res[f"{key[:-4]} M={mm} {c}"] = dict(us=t * 1e6, pct=100 * floor / t)
                        print(f"  M={mm} {c}: {t * 1e6:.1f} us ({100 * floor / t:.0f}%)", flush=True)


def sec_m1pdl(res):
    """nvfp4_m1's experts with down launched as a programmatic dependent of gate|up (kernels/launch_ex.py) against a
    plain launch, at 1, 2 and 8 tokens (defaults otherwise; whole MoE layer timed from a CUDA graph, 8 routings in
    turn, each form checked bit for bit against the other first), each form timed twice in alternation."""
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()
    for t in (1, 2, 8):
        routes, touched, floor, ref = _nvfp4_moe_case(P, e, d, i, t)

        def run(r, pdl):
            return m1.experts(r[2], r[1], r[0], P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0, pdl=pdl)

        same = all(torch.equal(run(r, True), run(r, False)) for r in routes)
        err = rel(run(routes[0], True), ref)
        times = {pdl: [] for pdl in (False, True)}
        for _ in range(2):
            for pdl in (False, True):
                times[pdl].append(timed([(lambda r=r, pdl=pdl: run(r, pdl)) for r in routes]) * 1e6)
        res[f"m1pdl t={t}"] = dict(floor_us=floor * 1e6, same=same, rel_err=err, plain_us=times[False],
                                   pdl_us=times[True])
        print(f"MoE nvfp4_m1 {t} token(s), floor {floor * 1e6:.0f} us: plain launch "
              f"{' / '.join(f'{v:.1f}' for v in times[False])} us, PDL {' / '.join(f'{v:.1f}' for v in times[True])}"
              f" us ({100 * floor * 1e6 / min(times[True]):.0f}% at best); PDL == plain bit for bit: {same}; rel err "
              f"{err:.1e}", flush=True)


def sec_m1x(res):
    """nvfp4_m1's experts at 1, 2, 8 and 32 tokens (routings seeded), the defaults beside another tree's nvfp4_m1 loaded
    in the same process where M1X_BASE names its file (e.g. .base_src/src/tpserve/kernels/nvfp4_m1.py): an A/B whose
    two sides share the process, the weights and the routings (timings of one form moved by ~8% between processes).
    Each form checked against fp32 math, then timed three times in alternation (graph replays of 40 calls, 8
    routings in turn)."""
    import importlib.util
    import os

    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    mods = {"": m1}
    if os.environ.get("M1X_BASE"):
        spec = importlib.util.spec_from_file_location("nvfp4_m1_base", os.environ["M1X_BASE"])
        mods["base "] = sys.modules["nvfp4_m1_base"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mods["base "])
    _m1_alternate(res, "m1x", {f"{name}default": (mod, None, None, {}) for name, mod in mods.items()}, (1, 2, 8, 32))


def _m1_alternate(res, tag: str, forms: dict, tokens) -> None:
    """The experts at each token count (routings seeded), every form (name -> (nvfp4_m1 module, gate|up config, down
    config, more keywords)) checked against fp32 math, then timed three times in alternation (graph replays of 40
    calls, 8 routings in turn)."""
    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()
    for t in tokens:
        torch.manual_seed(t)
        routes, touched, floor, ref = _nvfp4_moe_case(P, e, d, i, t)

        def run(r, f):
            mod, cg, cd, kw = f
            return mod.experts(r[2], r[1], r[0], P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0, cg, cd, **kw)

        errs = {k: rel(run(routes[0], f), ref) for k, f in forms.items()}
        times = {k: [] for k in forms}
        for _ in range(3):
            for k, f in forms.items():
                times[k].append(timed([(lambda r=r, f=f: run(r, f)) for r in routes], reps=40) * 1e6)
        print(f"\nMoE nvfp4_m1 {t} token(s), {touched:.1f} experts touched, floor {floor * 1e6:.1f} us:", flush=True)
        for k in forms:
            print(f"  {k}: {' / '.join(f'{v:.1f}' for v in times[k])} us ({100 * floor * 1e6 / min(times[k]):.0f}% at "
                  f"best), rel err {errs[k]:.1e}", flush=True)
        res[f"{tag} t={t}"] = dict(floor_us=floor * 1e6, touched=touched, us=times, rel_err=errs)


def m1_forms_run(tag: str, forms: dict, tokens_text: str, json_path: str | None, error) -> None:
    """For the small m1 scripts (bench/m1_experts.py): --tokens parsed (error(message) where
    it is not a list of positive integers), `_m1_alternate` over the forms, the results written to json_path."""
    try:
        tokens = [int(t) for t in tokens_text.split(",") if t.strip()]
    except ValueError:
        tokens = []
    if not tokens or any(t < 1 for t in tokens):
        error(f"--tokens: positive integers, comma-separated, got {tokens_text!r}")
    if not torch.cuda.is_available():
        error("needs a CUDA GPU (the nvfp4_m1 kernels)")
    res: dict = {}
    _m1_alternate(res, tag, forms, tokens)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=1)


def sec_m1cfg(res):
    """nvfp4_m1's experts at 1, 2 and 8 tokens with gate|up's config varied (two row tiles of each part a warp: half
    the blocks, so half the reads of x, whose few L2 lines every block reads at once), down at its default: each
    form against fp32 math, then timed three times in alternation (graph replays of 40 calls, 8 routings in turn)."""
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    rows2 = m1.Config(rows=2, splits=2)
    _m1_alternate(res, "m1cfg", {"default": (m1, None, None, {}), "gate|up rows 2": (m1, rows2, None, {}),
                                 "gate|up rows 2, L2 128": (m1, dataclasses.replace(rows2, l2_prefetch=128), None, {})},
                  (1, 2, 8))


def sec_mmapdl(res):
    """w8a16_gemv / w4a16_gemv's defaults launched plainly against as programmatic dependents (mma_gemv at 2-8 rows;
    at one row NVFP4's nvfp4_m1 both times, FP8's Triton row kernel plainly and mma_gemv under PDL, so not bit for
    bit there): a run of calls captured in one graph (quant_kernels.timed: the weight copies in turn, so no call
    finds its W in L2), each call's kernel a dependent of the one before where PDL is on. The floor is one call's
    weight bytes / the card's HBM bandwidth."""
    from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv
    from tpserve.kernels.quant.gemv_triton import w8a16_gemv

    forms = {"fp8": (_fp8, lambda x, p, pdl: w8a16_gemv(x, *p, (128, 128), pdl=pdl)),
             "nvfp4": (_fp4, lambda x, p, pdl: w4a16_gemv(x, *p, pdl=pdl))}
    print("| format | N x K | M | floor us | plain us (twice) | PDL us (twice) | % floor plain / PDL (best) | "
          "bit for bit |\n| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for fmt, (spec, fn) in forms.items():
        quantize, _, _, nbytes = spec()
        for n, k in ((12288, 4096), (4096, 12288)):
            packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
            for m in (1, 2, 4, 8):  # (one FP8 row: the Triton row kernel plainly, mma_gemv under PDL)
                x = torch.randn(m, k, device="cuda").bfloat16()
                same = torch.equal(fn(x, packed, False), fn(x, packed, True))
                err = rel(fn(x, packed, True), x.float() @ wd.T)
                times = {False: [], True: []}
                for _ in range(2):
                    for pdl in (False, True):
                        times[pdl].append(timed([(lambda p=p, pdl=pdl: fn(x, p, pdl)) for p in packs]))
                best = {pdl: min(t) for pdl, t in times.items()}
                res[f"mmapdl {fmt} {n}x{k} M={m}"] = dict(plain_us=[t * 1e6 for t in times[False]],
                                                          pdl_us=[t * 1e6 for t in times[True]],
                                                          floor_us=floor * 1e6, equal=same, rel_err=err)
                print(f"| {fmt} | {n} x {k} | {m} | {floor * 1e6:.1f} | "
                      f"{' / '.join(f'{t * 1e6:.1f}' for t in times[False])} | "
                      f"{' / '.join(f'{t * 1e6:.1f}' for t in times[True])} | {100 * floor / best[False]:.0f}% / "
                      f"**{100 * floor / best[True]:.0f}%** | {same} |", flush=True)


def sec_mmacap(res):
    """mma_gemv's default configs with Config.max_blocks (a cap on the blocks an SM holds, through unused shared
    memory: launch_ex.capped_smem) against none, each launched plainly and as programmatic dependents (mmapdl's
    chain), 1, 2 and 8 rows, both formats and shapes, each form twice in alternation; the driver's occupancy for
    each cap printed (cap 0 under PDL means launch_ex.one_wave_cap)."""
    import ctypes

    from tpserve.kernels.launch import ex_cuda as launch_ex
    from tpserve.kernels.quant import gemv_cuda as mg

    props = torch.cuda.get_device_properties(0)
    print(f"shared memory an SM: {getattr(props, 'shared_memory_per_multiprocessor', '?')}", flush=True)
    lib = torch.cuda._utils._get_gpu_runtime_library()
    print("| format | N x K | M | max_blocks (blocks an SM) | plain us (twice) | PDL us (twice) | PDL % floor | "
          "bit for bit |\n| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for fmt, spec in (("fp8", _fp8), ("nvfp4", _fp4)):
        quantize, _, _, nbytes = spec()
        for n, k in ((12288, 4096), (4096, 12288)):
            packed, packs, wd, floor = _weights(quantize, nbytes, n, k)
            base = mg.default_config(fmt, n, k)
            for m in (1, 2, 8):
                x = torch.randn(m, k, device="cuda").bfloat16()
                want = _mma_run(fmt, x, packed, base)
                for cap in (0, 2, 3, 4):
                    cfg = dataclasses.replace(base, max_blocks=cap)

                    def fn(p, pdl, cfg=cfg):
                        return (mg.fp8_gemv(x, *p, cfg=cfg, pdl=pdl) if fmt == "fp8"
                                else mg.nvfp4_gemv(x, *p, cfg=cfg, pdl=pdl))

                    same = torch.equal(fn(packed, True), want) and torch.equal(fn(packed, False), want)
                    occ = ctypes.c_int(0)
                    kern = mg._kernel(cfg, "".join(map(str, torch.cuda.get_device_capability())), 0, True)
                    smem = launch_ex.cap_blocks(kern, 0, cfg.smem_bytes, cap) if cap else cfg.smem_bytes
                    lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(occ), kern.func, 32 * cfg.splits,
                                                                    smem)
                    times = {False: [], True: []}
                    for _ in range(2):
                        for pdl in (False, True):
                            times[pdl].append(timed([(lambda p=p, pdl=pdl: fn(p, pdl)) for p in packs]) * 1e6)
                    res[f"mmacap {fmt} {n}x{k} M={m} cap={cap}"] = dict(plain_us=times[False], pdl_us=times[True],
                                                                       floor_us=floor * 1e6, same=same,
                                                                       blocks_per_sm=occ.value)
                    print(f"| {fmt} | {n} x {k} | {m} | {cap} ({occ.value}) | "
                          f"{' / '.join(f'{t:.1f}' for t in times[False])} | "
                          f"{' / '.join(f'{t:.1f}' for t in times[True])} | "
                          f"{100 * floor * 1e6 / min(times[True]):.0f}% | {same} |", flush=True)


if __name__ == "__main__":
    sys.exit(run_sections(dict(m1=sec_m1, m1def=sec_m1def, m1exp=sec_m1exp, m1sum=sec_m1sum, m1par=sec_m1par,
                               m1pdl=sec_m1pdl, m1x=sec_m1x, m1cfg=sec_m1cfg, mmasmem=sec_mmasmem,
                               mmapdl=sec_mmapdl, mmacap=sec_mmacap,
                               fp8det=sec_fp8det,
                               moe=sec_moe,
                               prefill=sec_prefill, gemv=sec_gemv,
                               w8a16=lambda r: sec_gemv(r, "w8a16"),
                               w4a16=lambda r: sec_gemv(r, "w4a16"), w4one=sec_w4one, w4def=sec_w4def,
                               w4planes=sec_w4planes, w4tiled=sec_w4tiled, rows=sec_rows, mma=sec_mma, mma2=sec_mma2,
                               mma3=sec_mma3, mma4=sec_mma4, mmadef=sec_mmadef, w8def=sec_w8def, w8split=sec_w8split),
                          "fp8det,moe,gemv",
                          "quant_decode_sweep.json"))
