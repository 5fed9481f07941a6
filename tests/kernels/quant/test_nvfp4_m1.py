"""kernels/quant/nvfp4_m1_cuda.py: the one-row NVFP4 GEMV's lane arithmetic emulated on the CPU (scale groups
in the MMA's columns, the 2^60 tables, the e4m3 scales at 2^-120), against the dequantized float64 product; the kernels
themselves run on a GPU (the last tests, skipped without one; BENCHMARKS.md has the H200 checks)."""

import pytest
import torch

from tpserve.kernels.quant import gemv_cuda as mg
from tpserve.kernels.quant import nvfp4_m1_cuda as m1
from tpserve.kernels.quant import nvfp4_m1_source_cuda as m1s
from tpserve.kernels.launch import ex_cuda as launch_ex
from tpserve.kernels.quant import ref as qr

from lanes import bf16, decode_fp4, mma16816, prmt2  # noqa: E402


def _words(row: torch.Tensor, start: int) -> list[int]:
    """Four little-endian 32-bit words of 16 bytes of a uint8 row."""
    b = row[start:start + 16].tolist()
    return [b[4 * i] | b[4 * i + 1] << 8 | b[4 * i + 2] << 16 | b[4 * i + 3] << 24 for i in range(4)]


def _pairs(x: torch.Tensor) -> list[list[float]]:
    return [x[2 * i:2 * i + 2].tolist() for i in range(len(x) // 2)]


def _scales2(u: int, shift: bool) -> tuple[float, float]:
    v = ((prmt2(u, u, mg.SEL_LO) << mg.DECODE_SHIFT) & 0xFFFFFFFF) & mg.DECODE_MASK
    f = 2.0**120 if shift else 1.0  # ("shift": the pair times 2^120 in bf16, exact)
    return bf16(v & 0xFFFF) * f, bf16(v >> 16) * f


def decode_fp4_shift(w: int) -> list[int]:
    """nvfp4_m1's decode_fp4_shift: pair j = codes (j, j + 4), each value * 2^-126."""
    m = 0xFFFFFFFF
    return [((w << 12) & 0x80008000) | ((w << 6) & 0x01C001C0), ((w << 8) & 0x80008000) | ((w << 2) & 0x01C001C0),
            ((w << 4) & 0x80008000 & m) | ((w >> 2) & 0x01C001C0), (w & 0x80008000) | ((w >> 6) & 0x01C001C0)]


def _emulate(x: torch.Tensor, codes: torch.Tensor, bscale: torch.Tensor, s2: torch.Tensor,
             decode: str) -> torch.Tensor:
    """What the dense kernel computes, lane by lane: x [K] (bf16 values), codes uint8 [N, K/2], bscale e4m3 bits
    uint8 [N, K/16], s2 [N] -> y [N] float64 (before the bf16 output rounding)."""
    n, k = codes.shape[0], 2 * codes.shape[1]
    t = mg.fp4_tables(m1.TABLE_LOG2)
    shift = decode == "shift"
    regs = (lambda word: decode_fp4_shift(word)) if shift else (lambda word: decode_fp4(word, t))
    dec = lambda word: [[bf16(r & 0xFFFF), bf16(r >> 16)] for r in regs(word)]  # noqa: E731
    if shift:  # x staged as the decode pairs it, (j, j + 4) of each 8, times 2^66
        x = x.view(-1, 2, 4).transpose(1, 2).reshape(-1) * 2.0**m1.SHIFT_X_LOG2
    zeros = [[0.0, 0.0]] * 8
    y = torch.zeros(n, dtype=torch.float64)
    for row0 in range(0, n, 16):
        acc = torch.zeros(32, 2, dtype=torch.float64)
        for kb in range(k // 256):
            for h in range(2):
                a_regs, b_regs, scales = [[None] * 32 for _ in range(8)], [[None] * 32 for _ in range(8)], []
                for lane in range(32):
                    g, c = divmod(lane, 4)
                    lo, hi = min(row0 + g, n - 1), min(row0 + g + 8, n - 1)
                    at = 128 * kb + 64 * h + 16 * c
                    wl, wh = _words(codes[lo], at), _words(codes[hi], at)
                    k0 = 256 * kb + 128 * h + 32 * c
                    for q in range(4):  # word q: codes 8q..8q+7 of group 2c + q // 2; x where g is that group
                        ga, gb = dec(wl[q]), dec(wh[q])
                        xp = _pairs(x[k0 + 8 * q:k0 + 8 * q + 8]) if g == 2 * c + q // 2 else zeros
                        a_regs[2 * q][lane], b_regs[2 * q][lane] = (ga[0], gb[0], ga[1], gb[1]), (xp[0], xp[1])
                        a_regs[2 * q + 1][lane], b_regs[2 * q + 1][lane] = (ga[2], gb[2], ga[3], gb[3]), (xp[2], xp[3])
                    su = [bscale[r, 16 * kb + 8 * h + 2 * c].item() | bscale[r, 16 * kb + 8 * h + 2 * c + 1].item() << 8
                          for r in (lo, hi)]
                    scales.append(_scales2(su[0], shift) + _scales2(su[1], shift))
                d = sum(mma16816(a_regs[i], b_regs[i], torch.float64) for i in range(8))
                for lane in range(32):
                    g, c = divmod(lane, 4)
                    f0, f1, f2, f3 = scales[lane]
                    acc[lane, 0] += d[g, 2 * c] * f0 + d[g, 2 * c + 1] * f1
                    acc[lane, 1] += d[g + 8, 2 * c] * f2 + d[g + 8, 2 * c + 1] * f3
        rows = acc.view(8, 4, 2).sum(1)  # lanes (g, 0..3) -> rows g (column 0) and g + 8 (column 1)
        for i in range(2):
            for g in range(8):
                if row0 + g + 8 * i < n:
                    y[row0 + g + 8 * i] = rows[g, i] * s2[row0 + g + 8 * i].item() * 2.0**m1.TABLE_LOG2
    return y


@pytest.mark.parametrize("decode", ["lut", "shift"])
def test_lane_emulation_matches_dequantized_math(decode):
    """Rows past N (the clamp), two 256-wide chunks, random codes and scales that include e4m3 subnormals."""
    gen = torch.Generator().manual_seed(0)
    n, k = 40, 512
    codes = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    sbits = torch.randint(0, 0x7F, (n, k // 16), generator=gen, dtype=torch.uint8)  # positive, no NaN
    sbits[:, :4] = torch.randint(1, 8, (n, 4), generator=gen, dtype=torch.uint8)  # subnormal e4m3 scales
    s2 = torch.rand(n, generator=gen, dtype=torch.float64) + 0.5
    x = torch.randn(k, generator=gen).bfloat16().double()
    ref = qr.nvfp4_dequantize(codes, sbits.view(torch.float8_e4m3fn), torch.ones(n), torch.float64)
    ref = (ref @ x) * s2
    got = _emulate(x, codes, sbits, s2, decode)
    # float64 sums of exact products in another order
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12 * ref.abs().max().item())


def test_tables_are_e2m1_times_2_pow_60():
    t = mg.fp4_tables(m1.TABLE_LOG2)
    values = [bf16(r) for w in (0x76543210,) for reg in decode_fp4(w, t) for r in (reg & 0xFFFF, reg >> 16)]
    assert values == [v * 2.0**60 for v in mg.E2M1]
    w = 0xFEDCBA98  # codes 8..15 (negative) in nibbles 0..7; pair j = codes (j, j + 4)
    shifted = [bf16(r) for reg in decode_fp4_shift(w) for r in (reg & 0xFFFF, reg >> 16)]
    codes = [8, 12, 9, 13, 10, 14, 11, 15]
    assert shifted == [-v * 2.0**m1.SHIFT_W_LOG2 for v in (mg.E2M1[c - 8] for c in codes)]
    assert m1.SHIFT_W_LOG2 + m1.SHIFT_X_LOG2 == -m1.TABLE_LOG2
    assert mg.fp4_tables(0) == mg.FP4_TABLES
    assert "1152921504606846976.0f" in m1s._SOURCE and 2.0**m1.TABLE_LOG2 == 1152921504606846976.0


def test_config_and_shape_errors_name_the_field():
    with pytest.raises(ValueError, match="Config.stages"):
        m1.Config(stages=1)
    with pytest.raises(ValueError, match="Config.rows"):
        m1.Config(rows=True)
    with pytest.raises(ValueError, match="l2_prefetch"):
        m1.Config(l2_prefetch=32)
    text, name = m1.source(m1.Config(rows=2), "gate_up")
    assert "#define R 4\n" in text and "#define PARTS 2\n" in text and name in text
    text, name = m1.source(m1.Config(), "gate_up", h_shift=True)
    assert "#define H_SHIFT 1\n" in text and "#define X_IN_ORDER 0\n" in text and name.endswith("_hs")
    text = m1.source(m1.Config(), "down_sum", h_shift=True)[0]
    assert "#define H_SHIFT 0\n" in text and "#define X_IN_ORDER 1\n" in text
    assert "#define X_IN_ORDER 0\n" in m1.source(m1.Config(decode="lut"), "down")[0]
    assert m1.Config(rows=2, splits=4, stages=4).smem(2, 4096) == 4 * 4 * 4 * 2304 + 8192 + 32
    with pytest.raises(ValueError, match="Config.decode"):
        m1.Config(decode="int")
    p, bs, s2 = qr.nvfp4_quantize(torch.randn(32, 256))
    with pytest.raises(ValueError, match="x: must be one bf16 CUDA row"):
        m1.gemv(torch.randn(1, 256).bfloat16(), p, bs, s2.expand(32))
    gu = torch.zeros(2, 512, 128, dtype=torch.uint8)
    with pytest.raises(ValueError, match="x: must be bf16 CUDA"):
        m1.experts(torch.randn(1, 256), torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.long), gu, *[None] * 6)
    with pytest.raises(ValueError, match="x, weights: must have ids' 2 tokens"):
        m1.experts(torch.randn(1, 256).bfloat16(), torch.ones(2, 1), torch.zeros(2, 1, dtype=torch.long), gu,
                   *[None] * 6)
    with pytest.raises(ValueError, match="sum_choices: takes at most 16 choices"):
        m1.experts(torch.randn(1, 256).bfloat16(), torch.ones(1, 17), torch.zeros(1, 17, dtype=torch.long), gu,
                   *[None] * 6, sum_choices=True)
    assert m1.Config(splits=2).smem(1, 2048, 8) == 2 * 2 * 2304 + 8 * 4096 + 32
    assert launch_ex.supported(torch.device("cpu")) is False
    with pytest.raises(ValueError, match="args: tensors must be on a CUDA device"):
        launch_ex.launch_pdl(None, (1, 1, 1), (32, 1, 1), 0, [torch.zeros(1)])
    with pytest.raises(TypeError, match="args: tensors, ints and floats only"):
        launch_ex.launch_pdl(None, (1, 1, 1), (32, 1, 1), 0, ["x"])
    with pytest.raises(ValueError, match="ids: at most 65535"):
        m1.experts(torch.randn(8192, 256).bfloat16(), torch.ones(8192, 8), torch.zeros(8192, 8, dtype=torch.long),
                   gu, *[None] * 6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernels need a GPU")
@pytest.mark.parametrize("decode", ["lut", "shift"])
def test_gpu_gemv_and_experts_match_fp32_math(decode):
    """("shift" decodes the 0.5 codes, an eighth of them, to bf16 subnormals: were they flushed, the error would be
    far above the bound.)"""
    torch.manual_seed(0)
    cfg = m1.Config(decode=decode)
    for n, k in ((1000, 256), (4096, 512), (48, 1024)):
        w = torch.randn(n, k, device="cuda") / k**0.5
        p, bs, s2 = qr.nvfp4_quantize(w)
        x = torch.randn(1, k, device="cuda").bfloat16()
        ref = x.float() @ qr.nvfp4_dequantize(p, bs, s2, torch.float32).T
        y = m1.gemv(x, p, bs, s2.reshape(1).expand(n).contiguous(), cfg).float()
        # bf16 output rounding (2^-9 of each value) plus fp32 sums in another order
        assert ((y - ref).abs().max() / ref.abs().max()).item() < 4e-3
    p = torch.full((64, 128), 0x11, dtype=torch.uint8, device="cuda")  # every code 0.5
    bs = torch.ones(64, 16, device="cuda").to(torch.float8_e4m3fn)
    x = torch.ones(1, 256, device="cuda").bfloat16()
    assert torch.equal(m1.gemv(x, p, bs, torch.ones(64, device="cuda"), cfg).float(),
                       torch.full((1, 64), 128.0, device="cuda"))
    from tpserve.kernels.moe import ref as moe_ops

    e, d, i, t, top_k = 16, 512, 256, 3, 4
    gu = torch.randn(e, 2 * i, d, device="cuda") / d**0.5
    dn = torch.randn(e, d, i, device="cuda") / i**0.5
    q = [qr.nvfp4_quantize(gu[j]) for j in range(e)]
    r = [qr.nvfp4_quantize(dn[j]) for j in range(e)]
    gup, gbs = torch.stack([a for a, _, _ in q]), torch.stack([b for _, b, _ in q])
    gs2 = torch.stack([c.reshape(1).expand(2) for _, _, c in q]).contiguous()
    dnp, dbs, ds2 = torch.stack([a for a, _, _ in r]), torch.stack([b for _, b, _ in r]), torch.stack(
        [c.reshape(1) for _, _, c in r])
    x = torch.randn(t, d, device="cuda").bfloat16()
    ids = torch.randint(0, e, (t, top_k), device="cuda")
    ids[0, 1] = -1  # a choice outside [0, E): contributes zeros
    weights = torch.rand(t, top_k, device="cuda")
    keep = ids >= 0
    ref = moe_ops.experts_loop_fn(
        x.float(), weights * keep, ids.clamp(min=0), e,
        lambda j: qr.nvfp4_dequantize(gup[j], gbs[j], gs2[j, :1], torch.float32),
        lambda j: qr.nvfp4_dequantize(dnp[j], dbs[j], ds2[j], torch.float32), 7.0)
    for sum_choices in (False, True):  # down per pair + combine_choices; down summing a token's choices
        for cd in (cfg, m1.Config(rows=2, splits=3, decode=decode)):  # (3 warps: items a warp takes differ)
            got = m1.experts(x, weights, ids, gup, gbs, gs2, dnp, dbs, ds2, 7.0, cfg, cd, sum_choices, pdl=False)
            assert ((got.float() - ref).abs().max() / ref.abs().max()).item() < 1e-2, (sum_choices, cd)
            if launch_ex.supported(x.device):  # down as gate|up's programmatic dependent: the same kernels, bit for bit
                assert torch.equal(m1.experts(x, weights, ids, gup, gbs, gs2, dnp, dbs, ds2, 7.0, cfg, cd,
                                              sum_choices, pdl=True), got)
    other = m1.Config(decode="lut" if decode == "shift" else "shift")  # gate|up and down of different decodes
    for cg, cd in ((other, cfg), (cfg, other)):  # (h as the down kernel's decode takes it)
        got = m1.experts(x, weights, ids, gup, gbs, gs2, dnp, dbs, ds2, 7.0, cg, cd)
        assert ((got.float() - ref).abs().max() / ref.abs().max()).item() < 1e-2, (cg, cd)
    if launch_ex.supported(x.device):  # captured in a CUDA graph (a programmatic edge), replayed
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.cuda.graph(graph):
            out = m1.experts(x[:1], weights[:1], ids[:1], gup, gbs, gs2, dnp, dbs, ds2, 7.0, cfg, cfg, pdl=True)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, m1.experts(x[:1], weights[:1], ids[:1], gup, gbs, gs2, dnp, dbs, ds2, 7.0, cfg, cfg,
                                           pdl=False))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernels need a GPU")
def test_gpu_engine_experts_take_m1_under_cuda_backend_and_agree_with_triton():
    """The engine's NVFP4 MoE (Ops.experts.nvfp4): --quant-gemv-backend cuda runs nvfp4_m1 at up to
    M1_MAX_TOKENS tokens, triton the grouped Triton kernels; both against fp32 math."""
    from types import SimpleNamespace

    from tpserve.kernels.choice import Kernels
    from tpserve.kernels.quant import dispatch
    from tpserve.kernels.registry import resolve

    torch.manual_seed(1)
    e, d, i = 8, 512, 256
    gu, dn = torch.randn(e, 2 * i, d, device="cuda") / d**0.5, torch.randn(e, d, i, device="cuda") / i**0.5
    parts = [[qr.nvfp4_quantize(gu[j, :i]), qr.nvfp4_quantize(gu[j, i:]), qr.nvfp4_quantize(dn[j])] for j in range(e)]
    layer = SimpleNamespace(
        gate_up_proj=torch.stack([torch.cat([a[0], b[0]]) for a, b, _ in parts]),
        gate_up_bscale=torch.stack([torch.cat([a[1], b[1]]) for a, b, _ in parts]),
        gate_up_scale2=torch.stack([torch.stack([a[2], b[2]]) for a, b, _ in parts]),
        down_proj=torch.stack([c[0] for _, _, c in parts]), down_bscale=torch.stack([c[1] for _, _, c in parts]),
        down_scale2=torch.stack([c[2].reshape(1) for _, _, c in parts]))
    x = torch.randn(dispatch.M1_MAX_TOKENS, d, device="cuda").bfloat16()
    ids = torch.stack([torch.randperm(e, device="cuda")[:2] for _ in range(x.shape[0])])
    weights = torch.rand(x.shape[0], 2, device="cuda")
    ref = moe_ops_loop(x, weights, ids, layer, i)
    for backend in ("cuda", "triton"):
        kernels = Kernels(moe="triton", moe_route="triton", quant_decode="qtile-b", quant_gemv=backend)
        experts = resolve(kernels).experts
        assert experts.kernel("nvfp4", x, i) == ("cuda_nvfp4_m1" if backend == "cuda" else "triton_nvfp4_experts")
        got = experts.nvfp4(x, weights, ids, layer, 10.0).float()
        assert ((got - ref).abs().max() / ref.abs().max()).item() < 1e-2, backend
        if backend == "cuda":  # (it ran nvfp4_m1, not a fallback)
            assert torch.equal(got, m1.experts(x, weights, ids, layer.gate_up_proj, layer.gate_up_bscale,
                                               layer.gate_up_scale2, layer.down_proj, layer.down_bscale,
                                               layer.down_scale2, 10.0).float())


def moe_ops_loop(x, weights, ids, layer, i):
    from tpserve.kernels.moe import ref as moe_ops

    return moe_ops.experts_loop_fn(
        x.float(), weights, ids, layer.gate_up_proj.shape[0],
        lambda j: torch.cat([qr.nvfp4_dequantize(layer.gate_up_proj[j, :i], layer.gate_up_bscale[j, :i],
                                                 layer.gate_up_scale2[j, 0], torch.float32),
                             qr.nvfp4_dequantize(layer.gate_up_proj[j, i:], layer.gate_up_bscale[j, i:],
                                                 layer.gate_up_scale2[j, 1], torch.float32)]),
        lambda j: qr.nvfp4_dequantize(layer.down_proj[j], layer.down_bscale[j], layer.down_scale2[j], torch.float32),
        10.0)
