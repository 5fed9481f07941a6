"""kernels/quant/gemv_cuda.py: the CUDA W8A16 GEMV's decode and data layout, checked on the CPU by emulating what each
lane does (the kernel itself runs only on a GPU: the last test, skipped without one; BENCHMARKS.md has its H200
checks)."""

import pytest
import torch

from tpserve.kernels.launch import ex_cuda as launch_ex
from tpserve.kernels.quant import gemv_cuda as mg
from tpserve.kernels.quant import ref as qr

from lanes import bf16 as _bf16, decode_fp4, mma16816 as _mma, prmt2 as _prmt2  # noqa: E402


def _decode2(word: int, sel: int) -> tuple[int, int]:
    v = ((_prmt2(word, word, sel) << mg.DECODE_SHIFT) & 0xFFFFFFFF) & mg.DECODE_MASK
    return v & 0xFFFF, v >> 16


def test_decode_gives_every_e4m3_code_times_2_pow_minus_120():
    codes = [c for c in range(256) if c & 0x7F != 0x7F]  # (0x7F, 0xFF: NaN)
    value = torch.tensor(codes, dtype=torch.uint8).view(torch.float8_e4m3fn).float() * 2.0**mg.W_OFFSET_LOG2
    for i in range(0, len(codes), 4):
        quad = (codes[i:i + 4] + [0, 0, 0])[:4]
        word = quad[0] | quad[1] << 8 | quad[2] << 16 | quad[3] << 24
        got = _decode2(word, mg.SEL_LO) + _decode2(word, mg.SEL_HI)  # bytes (0, 1) then (2, 3)
        for j, c in enumerate(codes[i:i + 4]):
            assert _bf16(got[j]) == value[i + j].item(), f"e4m3 code {c:#04x}"


def test_fp4_decode_gives_every_pair_of_e2m1_codes_in_k_order():
    """decode_fp4 on the CPU: prmt table lookups of the magnitudes' bf16 bytes, the signs ORed into the high bytes
    from (w << 4, w), the bytes interleaved into (k, k + 1) pairs; every code in every nibble position."""
    t = mg.FP4_TABLES
    values = qr.e2m1_decode(torch.arange(16, dtype=torch.uint8)).tolist()
    for first in range(16):
        for second in range(16):
            codes = [(first + i) % 16 if i % 2 == 0 else (second + i) % 16 for i in range(8)]
            regs = decode_fp4(sum(c << (4 * i) for i, c in enumerate(codes)), t)
            got = [_bf16(v) for r in regs for v in (r & 0xFFFF, r >> 16)]
            assert got == [values[c] for c in codes], (first, second)


def test_x_scale_constant_is_2_pow_60_and_the_offsets_cancel():
    assert mg.W_OFFSET_LOG2 + 2 * mg.X_SCALE_LOG2 == 0
    assert _bf16(0x5D80) == 2.0**mg.X_SCALE_LOG2 and "0x5D805D80u" in mg.source(mg.Config())


def test_lane_layout_computes_w_times_x_over_a_64_wide_chunk():
    """What `compute` does for one row tile and one 64-wide half: each lane's 16 contiguous bytes of rows g and
    g + 8 at k = 16 c, and 16 contiguous values of x row g there; MMA j takes 32-bit word j of each (k pairs 4j,
    4j + 1 and 4j + 2, 4j + 3). The four MMAs together must give W x^T."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randint(-8, 8, (16, 64), generator=gen).float()
    x = torch.randint(-8, 8, (8, 64), generator=gen).float()
    d = torch.zeros(16, 8)
    for j in range(4):
        a_regs, b_regs = [], []
        for lane in range(32):
            g, c = divmod(lane, 4)
            k = 16 * c + 4 * j  # word j of the lane's 16 values
            lo, hi = w[g, k:k + 4].tolist(), w[g + 8, k:k + 4].tolist()
            a_regs.append((lo[0:2], hi[0:2], lo[2:4], hi[2:4]))  # decode2(lo, SEL_LO), (hi, SEL_LO), (.., SEL_HI)
            b_regs.append((x[g, k:k + 2].tolist(), x[g, k + 2:k + 4].tolist()))  # x words 2j, 2j + 1
        d += _mma(a_regs, b_regs)
    assert torch.equal(d, w @ x.T)


def test_config_and_shape_errors_name_the_field():
    with pytest.raises(ValueError, match="Config.rows"):
        mg.Config(rows=0)
    with pytest.raises(ValueError, match="Config.depth"):
        mg.Config(depth=True)
    with pytest.raises(ValueError, match="l2_prefetch"):
        mg.Config(l2_prefetch=32)
    with pytest.raises(ValueError, match="Config.min_blocks"):
        mg.Config(min_blocks=9)
    assert "#define LAUNCH_BOUNDS 32 * KS\n" in mg.source(mg.Config())  # no minimum unless asked: see Config
    assert "#define LAUNCH_BOUNDS 32 * KS, 2\n" in mg.source(mg.Config(min_blocks=2))
    with pytest.raises(ValueError, match="Config.fmt"):
        mg.Config("int4")
    with pytest.raises(ValueError, match="Config.stage"):
        mg.Config(stage="tma")
    with pytest.raises(ValueError, match="Config.max_blocks"):
        mg.Config(max_blocks=9)
    per_sm = 233472  # an H100's / H200's 228 KiB
    for smem, static, cap in ((0, 3584, 2), (0, 3584, 3), (18432, 512, 2), (69664, 3200, 2), (69664, 3200, 3)):
        pad, carve = launch_ex.capped_smem(smem, static, cap, per_sm)  # cap blocks fit the carveout, cap + 1 do not
        assert pad >= smem and cap * (pad + static + 1024) <= carve < (cap + 1) * (pad + static + 1024)
        assert carve == (launch_ex.CARVEOUT if cap * (smem + static + 1152) <= launch_ex.CARVEOUT else per_sm)
    with pytest.raises(ValueError, match="cap: 3 blocks"):
        launch_ex.capped_smem(76 * 1024, 0, 3, per_sm)
    capped = mg.Config(rows=1, splits=8, max_blocks=2)
    assert capped.name != mg.Config(rows=1, splits=8).name and mg.source(capped).replace(
        capped.name, "") == mg.source(mg.Config(rows=1, splits=8)).replace(mg.Config(rows=1, splits=8).name, "")
    assert [launch_ex.one_wave_cap(b, 132) for b in (64, 132, 256, 384, 528, 529)] == [1, 1, 2, 3, 4, 0]
    cfg = mg.Config(rows=2, splits=4, depth=3, stage="smem")
    assert cfg.smem_bytes == 4 * 3 * 2 * 2048 and mg.Config().smem_bytes == 0
    assert "#define ASYNC 1\n" in mg.source(cfg) and "#define ASYNC 0\n" in mg.source(mg.Config())
    assert cfg.name != mg.Config(rows=2, splits=4, depth=3).name
    for c in (cfg, mg.Config()):  # PDL: its own kernel; the wait comes after W's first loads are issued
        text = mg.source(c, pdl=True)
        assert "#define PDL 1\n" in text and "#define PDL 0\n" in mg.source(c)
        assert f"#define NAME {mg.kernel_name(c, True)}\n" in text and mg.kernel_name(c, True) != c.name
    assert mg.fits(8, 4096, torch.bfloat16, (128, 128)) and mg.fits(8, 4096, torch.bfloat16)
    assert not mg.fits(9, 4096, torch.bfloat16, (128, 128))
    assert not mg.fits(4, 4000, torch.bfloat16, (128, 128))
    assert not mg.fits(4, 4096 + 128, torch.bfloat16)  # NVFP4: 256-wide K chunks
    assert not mg.fits(4, 4096, torch.float16, (128, 128))
    q, s = qr.fp8_block_quantize(torch.randn(32, 128))
    with pytest.raises(ValueError, match="x: must be a CUDA tensor"):
        mg.fp8_gemv(torch.randn(2, 128).bfloat16(), q, s)
    p, bs, s2 = qr.nvfp4_quantize(torch.randn(32, 256))
    with pytest.raises(ValueError, match="x: must be a CUDA tensor"):
        mg.nvfp4_gemv(torch.randn(2, 256).bfloat16(), p, bs, s2.expand(32))
    assert not mg.available(torch.zeros(1)) and not mg.usable(torch.zeros(2, 256).bfloat16())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernel needs a GPU")
def test_gpu_matches_fp32_math():
    for n, k, m in ((1000, 256, 3), (4096, 512, 8), (48, 1024, 1)):
        w = torch.randn(n, k, device="cuda") / k**0.5
        q, s = qr.fp8_block_quantize(w)
        x = torch.randn(m, k, device="cuda").bfloat16()
        ref = x.float() @ qr.fp8_block_dequantize(q, s).T
        y = mg.fp8_gemv(x, q, s).float()
        # bf16 output rounding (2^-9 of each value) plus fp32 sums in another order
        assert ((y - ref).abs().max() / ref.abs().max()).item() < 4e-3
        p, bs, s2 = qr.nvfp4_quantize(w)
        ref = x.float() @ qr.nvfp4_dequantize(p, bs, s2).T
        y = mg.nvfp4_gemv(x, p, bs, s2.expand(n)).float()
        assert ((y - ref).abs().max() / ref.abs().max()).item() < 4e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernel needs a GPU")
def test_gpu_smem_stage_is_bit_for_bit_the_register_loads():
    """Config.stage "smem" moves W through shared memory and nothing else: the same sums in the same order."""
    torch.manual_seed(0)
    for n, k, m in ((1000, 256, 3), (4096, 1024, 8), (48, 2048, 1)):
        w = torch.randn(n, k, device="cuda") / k**0.5
        q, s = qr.fp8_block_quantize(w)
        p, bs, s2 = qr.nvfp4_quantize(w)
        x = torch.randn(m, k, device="cuda").bfloat16()
        for rows, splits, depth in ((1, 8, 2), (2, 4, 3), (1, 3, 6)):
            for fmt in ("fp8", "nvfp4"):
                cfgs = [mg.Config(fmt, rows, splits, depth, 256, True, 0, stage) for stage in ("regs", "smem")]
                if fmt == "fp8":
                    a, b = (mg.fp8_gemv(x, q, s, cfg=c) for c in cfgs)
                else:
                    a, b = (mg.nvfp4_gemv(x, p, bs, s2.expand(n), cfg=c) for c in cfgs)
                assert torch.equal(a, b), (n, k, m, rows, splits, depth, fmt)


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)),
                    reason="programmatic dependent launch needs an sm_90+ GPU")
def test_gpu_pdl_launch_is_bit_for_bit_the_plain_one_eager_and_in_a_graph():
    """pdl: the same kernel but for griddepcontrol: the same sums; a chain of dependent launches captured in a graph
    (each call reading the output of the one before) replays to the plain chain's output."""
    torch.manual_seed(0)
    n = k = 1024
    w = torch.randn(n, k, device="cuda") / k**0.5
    q, s = qr.fp8_block_quantize(w)
    p, bs, s2 = qr.nvfp4_quantize(w)
    x = torch.randn(8, k, device="cuda").bfloat16()
    for stage in ("regs", "smem"):
        for fmt, fn in (("fp8", lambda x, c, pdl: mg.fp8_gemv(x, q, s, cfg=c, pdl=pdl)),
                        ("nvfp4", lambda x, c, pdl: mg.nvfp4_gemv(x, p, bs, s2.expand(n), cfg=c, pdl=pdl))):
            cfg = mg.Config(fmt, 1, 4, 3, 0, True, 0, stage)
            for m in (2, 8):
                assert torch.equal(fn(x[:m], cfg, True), fn(x[:m], cfg, False)), (fmt, stage, m)

            def chain(pdl, fn=fn, cfg=cfg):
                y = x
                for _ in range(5):
                    y = fn(y, cfg, pdl)
                return y

            want = chain(False)
            graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
            with torch.cuda.stream(stream), torch.cuda.graph(graph):
                out = chain(True)
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want), (fmt, stage)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernel needs a GPU")
def test_gpu_misaligned_views_graph_replay_and_empty_output():
    n, k = 256, 512
    q, s = qr.fp8_block_quantize(torch.randn(n, k, device="cuda"))
    x = torch.randn(4, k, device="cuda").bfloat16()
    want = mg.fp8_gemv(x, q, s)
    flat = torch.empty(n * k + 1, dtype=torch.uint8, device="cuda")[1:]  # one byte off a 16-byte boundary
    flat.copy_(q.view(torch.uint8).reshape(-1))
    assert torch.equal(mg.fp8_gemv(x, flat.view(n, k).view(torch.float8_e4m3fn), s), want)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        out = mg.fp8_gemv(x, q, s)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    assert mg.fp8_gemv(x, q[:0], s[:0]).shape == (4, 0)
