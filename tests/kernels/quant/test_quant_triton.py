"""W8A16 / W4A16 GEMMs and the grouped quantized-expert kernels (Triton's CPU interpreter) against
dequantized fp32 math. The kernels dequantize each tile to exactly the reference's fp32 values and
accumulate in fp32 ("ieee" dots for fp32 inputs), or (FP8 whose scale block covers the K tile:
block 128 with 128-wide tiles, per-channel, the expert case of block 64) multiply the exact e4m3
values and scale the fp32 partial product; either way the only differences are summation order:
relative error (max |diff| / max |ref|) below 1e-5 in fp32. In fp16 the dequantized tile is rounded
to fp16 (2^-11 relative) before the dot: < 5e-3 of the output's scale. (bf16 is checked on the GPU
run, bench/quant_kernels.py: Triton's interpreter mishandles bf16 dots.)"""

import pytest
import torch

from tpserve.kernels.moe import ref as moe
from tpserve.kernels.quant import ref as qr
from tpserve.kernels.registry import resolve

from interpreted import run_interpreted


def test_gemms_match_dequantized_math():
    """The kernels where they apply: "dispatch" (the kernel kernels/quant/dispatch.py's table picks on a CUDA
    device with Triton: the GEMVs up to 16 rows where their tiles fit the scale blocks, the tiled kernel
    otherwise), "tiled", and the GEMVs forced with each of their tile shapes."""
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.quant import dispatch, ref as qr
        from tpserve.kernels.quant.gemm_triton import w8a16_gemm, w4a16_gemm
        from tpserve.kernels.quant.gemv_triton import w8a16_gemv
        from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv
        from tpserve.kernels.registry import resolve
        dispatch.on_triton = lambda x: True  # (the interpreter runs the kernels on CPU tensors)
        lin = resolve().linear
        res = {}
        g = torch.Generator().manual_seed(0)
        def err(y, ref):
            return ((y.double() - ref).abs().max() / ref.abs().max()).item()
        for m, n, k, block, dtype in [(1, 96, 256, (128, 128), torch.float32), (5, 200, 160, (16, 32), torch.float32),
                                      (3, 64, 512, (128, 128), torch.float16), (40, 72, 96, (32, 32), torch.float32),
                                      (16, 40, 512, (128, 128), torch.float32), (1, 33, 768, (128, 128), torch.float16),
                                      (1, 48, 1024, (128, 128), torch.float32),  # M = 1 default: 512-wide K
                                      (1, 12, 4096, (128, 128), torch.float32),  # 4096-wide, 4 rows a program
                                      (1, 16, 8192, (128, 128), torch.float32)]:  # K >= 8192: 4096-wide, 8 rows
            # the forced tile shapes up to K = 1024 (their loops: several K tiles, split or not); the longer
            # rows are there for the defaults' K tiles
            forced = k <= 1024
            w = torch.randn(n, k, generator=g) / k**0.5
            x = torch.randn(m, k, generator=g).to(dtype)
            q, s = qr.fp8_block_quantize(w, block)
            ref = x.double() @ qr.fp8_block_dequantize(q, s, block).double().T
            if m <= 16:
                res[f"fp8 dispatch {m}x{n}x{k} {block} {dtype}"] = err(lin.fp8_block(x, q, s, block), ref)
            res[f"fp8 tiled {m}x{n}x{k} {block} {dtype}"] = err(w8a16_gemm(x, q, s, block), ref)
            if forced and block == (128, 128) and m <= 16:
                for bn, bk in ((16, 128), (32, 64)):
                    res[f"fp8 gemv {bn}x{bk} {m}x{n}x{k} {dtype}"] = err(
                        w8a16_gemv(x, q, s, block, block_n=bn, block_k=bk, qtile=False), ref)
                    if dtype == torch.float32:  # fp8_tile as the MMA's A / B operand, K split or not
                        for waves, qa in ((4, True), (0, True), (0, False)):
                            res[f"fp8 gemv qtile a={qa} {bn}x{bk} waves={waves} {m}x{n}x{k} {dtype}"] = err(
                                w8a16_gemv(x, q, s, block, block_n=bn, block_k=bk, waves=waves, qtile=True,
                                           qtile_a=qa), ref)
            if block == (128, 128) and m <= 16:  # the defaults (one row: wide K tiles; more: qtile as B)
                res[f"fp8 gemv default {m}x{n}x{k} {dtype}"] = err(w8a16_gemv(x, q, s, block), ref)
            if forced and block == (128, 128) and m == 1:  # one row: K tiles over several scale blocks, the prefetch
                for bk in (128, 256, 512):
                    for pf, waves in ((False, 0), (True, 0), (True, 4)):
                        if k % bk == 0:
                            res[f"fp8 gemv row {bk} prefetch={pf} waves={waves} {n}x{k} {dtype}"] = err(
                                w8a16_gemv(x, q, s, block, block_n=16, block_k=bk, prefetch=pf, waves=waves), ref)
            qc, sc = qr.fp8_channel_quantize(w)
            ref = x.double() @ qr.fp8_channel_dequantize(qc, sc).double().T
            res[f"fp8-channel {m}x{n}x{k} {dtype}"] = err(w8a16_gemm(x, qc, sc[:, None], (1, k)), ref)
            if m <= 16:
                res[f"fp8-channel dispatch {m}x{n}x{k} {dtype}"] = err(lin.fp8_channel(x, qc, sc), ref)
            p, bs, s2 = qr.nvfp4_quantize(w)
            ref = x.double() @ qr.nvfp4_dequantize(p, bs, s2).double().T
            s2r = s2.reshape(1).expand(n).contiguous()
            res[f"nvfp4 tiled {m}x{n}x{k} {dtype}"] = err(w4a16_gemm(x, p, bs, s2r), ref)
            if m <= 16:
                res[f"nvfp4 dispatch {m}x{n}x{k} {dtype}"] = err(lin.nvfp4(x, p, bs, s2), ref)
            if forced and m <= 16 and k % 256 == 0:
                for bn, bk in ((16, 128), (32, 256)):
                    for d32 in (False, True):
                        res[f"nvfp4 gemv {bn}x{bk} d32={d32} {m}x{n}x{k} {dtype}"] = err(
                            w4a16_gemv(x, p, bs, s2r, block_n=bn, block_k=bk, fp32_decode=d32, row=False), ref)
                    if dtype == torch.float32:  # nvfp4_tile as the MMA's A / B operand, K split or not
                        for waves, qa in ((4, True), (0, True), (0, False)):
                            res[f"nvfp4 gemv qtile a={qa} {bn}x{bk} waves={waves} {m}x{n}x{k} {dtype}"] = err(
                                w4a16_gemv(x, p, bs, s2r, block_n=bn, block_k=bk, waves=waves, qtile=True,
                                           qtile_a=qa), ref)
                    if dtype == torch.float32:  # the nibble planes as the MMA's operand, K split or not
                        for waves in (0, 4):
                            res[f"nvfp4 gemv planes {bn}x{bk} waves={waves} {m}x{n}x{k} {dtype}"] = err(
                                w4a16_gemv(x, p, bs, s2r, block_n=bn, block_k=bk, waves=waves, planes=True), ref)
                    if m == 1:  # the one-row kernel (nvfp4_codes to float16 or bf16, FMAs), K split or not
                        for waves, f16 in ((0, True), (4, True), (0, False)):
                            res[f"nvfp4 gemv row {bn}x{bk} waves={waves} f16={f16} {n}x{k} {dtype}"] = err(
                                w4a16_gemv(x, p, bs, s2r, block_n=bn, block_k=bk, waves=waves, row=True,
                                           row_f16=f16), ref)
            if m <= 16 and k % 256 == 0:  # the defaults (one row: the one-row kernel)
                res[f"nvfp4 gemv default {m}x{n}x{k} {dtype}"] = err(w4a16_gemv(x, p, bs, s2r), ref)
        print(json.dumps(res))
    """)
    assert sum("gemv" in name for name in out) >= 12 and sum("gemv row 512" in name for name in out) >= 3
    assert sum("nvfp4 gemv qtile" in name for name in out) >= 12 and sum("fp8 gemv qtile" in name for name in out) >= 12
    assert sum("nvfp4 gemv row" in name for name in out) >= 12
    assert sum("nvfp4 gemv planes" in name for name in out) >= 12
    assert sum("nvfp4 gemv default" in name for name in out) >= 4
    assert sum("dispatch" in name for name in out) >= 24
    for name, err in out.items():
        assert err < (5e-3 if "float16" in name else 1e-5), (name, err)


def test_fp8_gemv_rejects_a_k_tile_across_scale_blocks_except_one_row():
    pytest.importorskip("triton")
    from tpserve.kernels.quant.gemv_triton import w8a16_gemv

    q = torch.zeros(32, 512, dtype=torch.float8_e4m3fn)
    s = torch.ones(1, 4)
    for m, bk in ((2, 256), (1, 96)):
        with pytest.raises(ValueError, match="block_k"):
            w8a16_gemv(torch.zeros(m, 512), q, s, (128, 128), block_k=bk)


def test_w4a16_gemv_rejects_wrong_kernel_arguments():
    pytest.importorskip("triton")
    from tpserve.kernels.quant.gemv_nvfp4_triton import w4a16_gemv

    w = torch.zeros(16, 256, dtype=torch.uint8)
    bs = torch.ones(16, 32).to(torch.float8_e4m3fn)
    s2 = torch.ones(16)
    with pytest.raises(ValueError, match="row: the one-row kernel takes one row of x, got 2"):
        w4a16_gemv(torch.zeros(2, 512), w, bs, s2, row=True)
    with pytest.raises(ValueError, match="row / qtile / planes"):
        w4a16_gemv(torch.zeros(1, 512), w, bs, s2, row=True, qtile=True)
    with pytest.raises(ValueError, match="row / qtile / planes"):
        w4a16_gemv(torch.zeros(1, 512), w, bs, s2, planes=True, qtile=True)
    with pytest.raises(ValueError, match="planes: takes a bf16 or float32 x, got torch.float16"):
        w4a16_gemv(torch.zeros(1, 512, dtype=torch.float16), w, bs, s2, planes=True)
    with pytest.raises(ValueError, match=r"x: quantized GEMV takes \[M <= 16, K\], got \(17, 512\)"):
        w4a16_gemv(torch.zeros(17, 512), w, bs, s2)  # the planes kernel's default would drop rows 16 and on
    with pytest.raises(ValueError, match="block_k: the planes kernel takes a multiple of 64, got 32"):
        w4a16_gemv(torch.zeros(1, 512), w, bs, s2, planes=True, block_k=32)


def test_w4a16_planes_kernel_on_tiled_weights_equals_row_major():
    """nvfp4_tiled only moves bytes: the planes kernel on tiled weights gives the row-major run's output bit for
    bit with one K split (the same sums in the same order), and matches fp32 math with a split too."""
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.quant import ref as qr
        from tpserve.kernels.quant.gemv_nvfp4_triton import nvfp4_tiled, w4a16_gemv
        g = torch.Generator().manual_seed(1)
        n, k, res = 128, 512, {}
        w = torch.randn(n, k, generator=g) / k**0.5
        p, bs, s2 = qr.nvfp4_quantize(w)
        s2r = s2.reshape(1).expand(n).contiguous()
        for m in (1, 3):
            x = torch.randn(m, k, generator=g)
            ref = x.double() @ qr.nvfp4_dequantize(p, bs, s2).double().T
            for bn, bk in ((64, 256), (16, 128)):
                tw, ts = nvfp4_tiled(p, bs, bn, bk)
                kw = dict(block_n=bn, block_k=bk, planes=True)
                a = w4a16_gemv(x, p, bs, s2r, waves=0, **kw)
                b = w4a16_gemv(x, tw, ts, s2r, tiled=True, waves=0, **kw)
                c = w4a16_gemv(x, tw, ts, s2r, tiled=True, waves=4, **kw)
                res[f"{m} {bn}x{bk}"] = [bool(torch.equal(a, b)),
                                         ((c.double() - ref).abs().max() / ref.abs().max()).item()]
        print(json.dumps(res))
    """)
    assert len(out) == 4
    for name, (equal, err) in out.items():
        assert equal and err < 1e-5, (name, equal, err)


def test_w4a16_tiled_weights_need_the_planes_kernel_at_their_tiles():
    pytest.importorskip("triton")
    from tpserve.kernels.quant.gemv_nvfp4_triton import nvfp4_tiled, w4a16_gemv

    w = torch.zeros(128, 256, dtype=torch.uint8)
    bs = torch.ones(128, 32).to(torch.float8_e4m3fn)
    tw, ts = nvfp4_tiled(w, bs, 64, 256)
    assert tw.shape == (2, 2, 64, 64) and ts.shape == (2, 2, 64, 16)
    with pytest.raises(ValueError, match=r"tiled: .* got \(2, 2, 64, 64\) for \(64, 128\)"):
        w4a16_gemv(torch.zeros(1, 512), tw, ts, torch.ones(128), planes=True, tiled=True, block_n=64, block_k=128)
    with pytest.raises(ValueError, match="planes=False"):
        w4a16_gemv(torch.zeros(1, 512), tw, ts, torch.ones(128), planes=False, tiled=True, block_n=64, block_k=256)
    with pytest.raises(ValueError, match=r"nvfp4_tiled: N 128 and K 512 must be whole \(48, 256\) tiles"):
        nvfp4_tiled(w, bs, 48, 256)


def test_grouped_quantized_experts_match_the_reference_loop():
    out = run_interpreted("""
        import json, torch
        from types import SimpleNamespace

        from tpserve.kernels.quant import ref as qr
        from tpserve.kernels.quant.gemm_triton import experts_fp8_triton, experts_nvfp4_triton
        from tpserve.kernels.registry import resolve
        loop = resolve().experts  # (moe torch: the loop over dequantized experts)
        res = {}
        for t, k, e, d, i, block in [(1, 2, 6, 64, 32, (16, 16)), (9, 3, 5, 96, 48, (16, 32)),
                                     (5, 2, 4, 128, 64, (16, 64))]:
            g = torch.Generator().manual_seed(t)
            ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
            weights = torch.rand(t, k, generator=g)
            x = torch.randn(t, d, generator=g)
            gu = torch.randn(e, 2 * i, d, generator=g) / d**0.5
            dn = torch.randn(e, d, i, generator=g) / i**0.5
            limit = 1.5
            # fp8: gate and up quantized separately (their scale rows stacked), as the loader fills them
            qg = [qr.fp8_block_quantize(gu[x_, :i], block) for x_ in range(e)]
            qu = [qr.fp8_block_quantize(gu[x_, i:], block) for x_ in range(e)]
            qd = [qr.fp8_block_quantize(dn[x_], block) for x_ in range(e)]
            gq = torch.stack([torch.cat([a[0], b[0]]) for a, b in zip(qg, qu)])
            gs = torch.stack([torch.cat([a[1], b[1]]) for a, b in zip(qg, qu)])
            dq, ds = torch.stack([a[0] for a in qd]), torch.stack([a[1] for a in qd])
            want = loop.fp8(x, weights, ids, gq, gs, dq, ds, block, limit)
            for qtile, qa in ((False, True), (True, True), (True, False)):  # per element; qtile.fp8_tile as A / B
                got = experts_fp8_triton(x, weights, ids, gq, gs, dq, ds, block, limit, qtile=qtile, qtile_a=qa)
                res[f"fp8 t{t} qtile={qtile} a={qa}"] = ((got - want).abs().max() / want.abs().max()).item()
            # nvfp4: per-(expert, projection) global scales
            pg = [qr.nvfp4_quantize(gu[x_, :i]) for x_ in range(e)]
            pu = [qr.nvfp4_quantize(gu[x_, i:]) for x_ in range(e)]
            pd = [qr.nvfp4_quantize(dn[x_]) for x_ in range(e)]
            layer = SimpleNamespace(
                gate_up_proj=torch.stack([torch.cat([a[0], b[0]]) for a, b in zip(pg, pu)]),
                gate_up_bscale=torch.stack([torch.cat([a[1], b[1]]) for a, b in zip(pg, pu)]),
                gate_up_scale2=torch.stack([torch.stack([a[2], b[2]]) for a, b in zip(pg, pu)]),
                down_proj=torch.stack([a[0] for a in pd]), down_bscale=torch.stack([a[1] for a in pd]),
                down_scale2=torch.stack([a[2].reshape(1) for a in pd]))
            want = loop.nvfp4(x, weights, ids, layer, limit)
            row2 = layer.gate_up_scale2.repeat_interleave(i, dim=1)
            for qtile, qa in ((False, True), (True, True), (True, False)):
                got = experts_nvfp4_triton(x, weights, ids, layer.gate_up_proj, layer.gate_up_bscale, row2,
                                           layer.down_proj, layer.down_bscale,
                                           layer.down_scale2.expand(-1, d).contiguous(), limit, qtile=qtile,
                                           qtile_a=qa)
                res[f"nvfp4 t{t} qtile={qtile} a={qa}"] = ((got - want).abs().max() / want.abs().max()).item()
        print(json.dumps(res))
    """)
    assert len(out) == 18
    for name, err in out.items():
        assert err < 1e-5, (name, err)


@pytest.mark.parametrize("t", [1, 37])
def test_grouped_mm_equals_loop(t):
    """bf16 experts through torch grouped_mm (no loop) against the loop, on CPU; both accumulate each
    product in fp32 and round once per GEMM, so they differ by bf16 rounding of the intermediates."""
    e, d, i, k = 6, 64, 32, 3
    g = torch.Generator().manual_seed(t)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    weights = torch.rand(t, k, generator=g)
    x = torch.randn(t, d, generator=g).bfloat16()
    gu = (torch.randn(e, 2 * i, d, generator=g) / d**0.5).bfloat16()
    dn = (torch.randn(e, d, i, generator=g) / i**0.5).bfloat16()
    want = moe.experts_loop(x.float(), weights, ids, gu.float(), dn.float(), 1.5)
    got = moe.experts_grouped(x, weights, ids, gu, dn, 1.5).float()
    assert ((got - want).abs().max() / want.abs().max()).item() < 2e-2


def test_reference_linear_paths_equal_dequantized_matmul():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(40, 64, generator=g)
    x = torch.randn(3, 64, generator=g)
    q, s = qr.fp8_block_quantize(w, (16, 16))
    lin = resolve().linear
    torch.testing.assert_close(lin.fp8_block(x, q, s, (16, 16)), x @ qr.fp8_block_dequantize(q, s, (16, 16)).T)
    p, bs, s2 = qr.nvfp4_quantize(w)
    torch.testing.assert_close(lin.nvfp4(x, p, bs, s2), x @ qr.nvfp4_dequantize(p, bs, s2).T)
