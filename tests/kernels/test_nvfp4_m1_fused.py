"""kernels/nvfp4_m1_fused.py: the one-token NVFP4 experts in one persistent kernel. Its configuration and shape
errors on the CPU; on a GPU (skipped without one) against fp32 math, bit for bit from call to call (its counters
reset, its sums in one order), with an expert id out of range, a choice routed at weight 0, few warps (many items
each) and many, and replayed from a CUDA graph."""

import pytest
import torch

from tpserve.kernels import nvfp4_m1_fused as m1f
from tpserve.kernels import quant_ref as qr


def test_config_and_shape_errors_name_the_field():
    with pytest.raises(ValueError, match="Config.stages"):
        m1f.Config(stages=9)
    with pytest.raises(ValueError, match="Config.warps"):
        m1f.Config(warps=0)
    with pytest.raises(ValueError, match="Config.l2_prefetch"):
        m1f.Config(l2_prefetch=32)
    gu = torch.zeros(4, 2 * 1024, 512, dtype=torch.uint8)
    with pytest.raises(ValueError, match="x, ids, weights: must be one bf16 CUDA token"):  # (two tokens, and on CPU)
        m1f.experts(torch.zeros(2, 1024).bfloat16(), torch.ones(2, 4), torch.zeros(2, 4, dtype=torch.long), gu,
                    *[None] * 6)
    with pytest.raises(ValueError, match="x, ids, weights"):  # more choices than the workspace holds
        m1f.experts(torch.zeros(1, 1024).bfloat16(), torch.ones(1, 17), torch.zeros(1, 17, dtype=torch.long), gu,
                    *[None] * 6)


def test_source_defines_and_fits():
    text, name = m1f.source(m1f.Config(warps=8, stages=3), timeline=True)
    assert "#define KS 8\n" in text and "#define STAGES 3\n" in text and "#define TIMELINE 1\n" in text
    assert "#define Q 5\n" in text and name.endswith("_tl") and f"NAME {name}\n" in text
    assert "decode_fp4_shift" in text and "x_shift_order" in text  # (nvfp4_m1's helpers, shared)
    x, ids = torch.zeros(1, 1024).bfloat16(), torch.zeros(1, 8, dtype=torch.long)
    assert m1f.fits(x, ids, 1024, m1f.Config(warps=4))
    assert not m1f.fits(x, ids, 1024, m1f.Config(warps=8))  # (gate|up items of four tasks: D / 256)
    assert not m1f.fits(x, ids, 256, m1f.Config(warps=4, down_pairs=2))  # (down items of two tasks)
    assert not m1f.fits(torch.zeros(2, 1024).bfloat16(), ids, 1024, m1f.Config(warps=4))
    cfg = m1f.Config(warps=4, stages=4, down_pairs=2)
    assert cfg.smem(1024, 512, 8) == 4 * 4 * 2 * m1f.m1.TILE_STAGE_BYTES + 2 * 1024 + 16 * 512 + 6 * 4 * 128
    assert m1f.items_of(cfg, 1024, 512, 8) == 8 * (32 + 16)


def _experts(e, d, i, seed):
    torch.manual_seed(seed)
    gu = torch.randn(e, 2 * i, d, device="cuda") / d**0.5
    dn = torch.randn(e, d, i, device="cuda") / i**0.5
    q = [[qr.nvfp4_quantize(gu[j, :i]), qr.nvfp4_quantize(gu[j, i:]), qr.nvfp4_quantize(dn[j])] for j in range(e)]
    return dict(gup=torch.stack([torch.cat([a[0], b[0]]) for a, b, _ in q]),
                gbs=torch.stack([torch.cat([a[1], b[1]]) for a, b, _ in q]),
                gs2=torch.stack([torch.stack([a[2], b[2]]) for a, b, _ in q]),
                dnp=torch.stack([c[0] for _, _, c in q]), dbs=torch.stack([c[1] for _, _, c in q]),
                ds2=torch.stack([c[2].reshape(1) for _, _, c in q]))


def _reference(x, weights, ids, w, i, limit):
    from tpserve.kernels import moe as moe_ops

    keep = (ids >= 0) & (ids < w["gup"].shape[0])
    return moe_ops.experts_loop_fn(
        x.float(), weights * keep, torch.where(keep, ids, 0), w["gup"].shape[0],
        lambda j: torch.cat([qr.nvfp4_dequantize(w["gup"][j, :i], w["gbs"][j, :i], w["gs2"][j, 0], torch.float32),
                             qr.nvfp4_dequantize(w["gup"][j, i:], w["gbs"][j, i:], w["gs2"][j, 1], torch.float32)]),
        lambda j: qr.nvfp4_dequantize(w["dnp"][j], w["dbs"][j], w["ds2"][j], torch.float32), limit)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernel needs a GPU")
def test_gpu_fused_experts_match_fp32_math_and_repeat_bit_for_bit():
    from tpserve.kernels import nvfp4_m1 as m1

    e, d, i = 16, 1024, 1024
    w = _experts(e, d, i, 0)
    args = (w["gup"], w["gbs"], w["gs2"], w["dnp"], w["dbs"], w["ds2"], 7.0)
    ws = m1f.Workspace(d, i, torch.device("cuda"))
    four = m1f.Config(warps=4)  # (D = 1024: gate|up items of four tasks)
    for top_k, cfg in ((8, four), (4, m1f.Config(warps=1, stages=2, down_pairs=1)),
                       (16, m1f.Config(warps=4, stages=4, down_pairs=1)), (1, m1f.Config(warps=2, stages=6)),
                       (3, m1f.Config(warps=3, stages=3, blocks_per_sm=2)),
                       (5, m1f.Config(warps=4, down_pairs=4, l2_prefetch=0))):
        x = torch.randn(1, d, device="cuda").bfloat16()
        ids = torch.randperm(e, device="cuda")[:top_k][None].clone()
        weights = torch.rand(1, top_k, device="cuda")
        if top_k >= 4:
            ids[0, 1] = e + 3  # an expert id out of range: contributes zeros
            weights[0, 2] = 0.0  # a choice routed at weight 0
        ref = _reference(x, weights, ids, w, i, 7.0)
        got = m1f.experts(x, weights, ids, *args, ws, cfg)
        assert ((got.float() - ref).abs().max() / ref.abs().max()).item() < 1e-2, (top_k, cfg)
        for _ in range(3):  # the counters are back at zero, the sums in one order: the same bits
            assert torch.equal(m1f.experts(x, weights, ids, *args, ws, cfg), got), (top_k, cfg)
        if top_k > 1:  # beside nvfp4_m1's two kernels (sums in another order)
            two = m1.experts(x, weights, ids, *args)
            assert ((got.float() - two.float()).abs().max() / ref.abs().max()).item() < 1e-2
    x = torch.randn(1, d, device="cuda").bfloat16()
    ids, weights = torch.randperm(e, device="cuda")[:8][None].clone(), torch.rand(1, 8, device="cuda")
    eager = m1f.experts(x, weights, ids, *args, ws, four)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        out = m1f.experts(x, weights, ids, *args, ws, four)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    marks = torch.zeros(m1f.items_of(four, d, i, 8), 3, dtype=torch.int64, device="cuda")
    assert torch.equal(m1f.experts(x, weights, ids, *args, ws, four, marks), eager)  # (the timeline build)
    assert bool((marks[:, 1] >= marks[:, 0]).all()) and bool((marks[:, 0] > 0).all())  # every item ran once
