"""Forward of the quantized layouts: one entry per op, dispatching on the device.

CPU (and any device without Triton): the reference, dequantize then matmul in the activation
dtype. CUDA: W8A16 split-K Triton GEMM for M <= SMALL_M, W8A8 `torch._scaled_mm` blockwise for
larger M where the shapes allow it (sm90, block 128), W4A16 Triton (nvfp4 dequantized in
registers); quantized experts through the grouped Triton kernel (NVFP4 at decode: kernels/quant/nvfp4_m1_cuda.py where
--quant-gemv-backend is cuda). Weights are never stored
dequantized: a fallback dequantizes one layer's weight for one call.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from tpserve.kernels.moe import ref as moe_ops
from tpserve.kernels.quant import ref as qr

SMALL_M = 16
# NVFP4 experts at up to this many tokens run kernels/quant/nvfp4_m1_cuda.py (--quant-gemv-backend cuda), one (token, choice)
# pair a time, each pair reading its expert (the grouped Triton kernels read each chosen expert once). On an H200
# (BENCHMARKS.md, twenty-fourth session): one MoE layer of 288 experts, top-8, uniformly routed, 47 / 71 us
# against Triton at 1 token, 254 / 397 at 8, 487 / 726 at 16, 979 / 1,161 at 32; but real-width KKKMKKKM's decode
# step (random weights, so the router's choices are its own) 2.221 / 2.396 ms at batch 1, 3.799 / 4.248 at 8 and
# 8.236 / 7.297 at 32 (nvfp4_m1 then taking up to 32 tokens): the limit is the largest batch measured faster there
M1_MAX_TOKENS = 8


def _triton_ok(x: torch.Tensor) -> bool:
    if not x.is_cuda:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _sm90(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.get_device_capability(x.device)[0] == 9


def fp8_block_linear(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, block: tuple[int, int],
                     bias: torch.Tensor | None = None, mma: bool | None = None, pdl: bool = False) -> torch.Tensor:
    """mma: the decode GEMV of kernels/quant/gemv_cuda.py (None: where it is quant_gemv's default; False: never); pdl:
    that GEMV launched as a programmatic dependent of the kernel before (mma_gemv.fp8_gemv)."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if _triton_ok(x) and m <= SMALL_M:
        from tpserve.kernels.quant.gemm_triton import w8a16_gemm

        y = w8a16_gemm(x2, w, s, block, mma=mma, pdl=pdl)
    elif _sm90(x) and tuple(block) == (128, 128) and k % 128 == 0 and w.shape[0] % 128 == 0:
        try:
            y = w8a8_block_scaled_mm(x2, w, s)
        except RuntimeError as exc:  # not silent: this torch build refuses the scale layout
            warnings.warn(f"W8A8 blockwise _scaled_mm refused ({str(exc).splitlines()[0]}); using the "
                          "dequantized-weight matmul", RuntimeWarning, stacklevel=2)
            y = F.linear(x2, qr.fp8_block_dequantize(w, s, block, x.dtype))
    else:
        y = F.linear(x2, qr.fp8_block_dequantize(w, s, block, x.dtype))
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, w.shape[0])


def fp8_channel_linear(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if _triton_ok(x) and x2.shape[0] <= SMALL_M:
        from tpserve.kernels.quant.gemm_triton import w8a16_gemm

        y = w8a16_gemm(x2, w, scale[:, None], (1, k))
    else:
        y = F.linear(x2, qr.fp8_channel_dequantize(w, scale, x.dtype))
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, w.shape[0])


def nvfp4_linear(x: torch.Tensor, w: torch.Tensor, bscale: torch.Tensor, scale2: torch.Tensor,
                 bias: torch.Tensor | None = None, mma: bool | None = None, pdl: bool = False) -> torch.Tensor:
    """mma and pdl as in fp8_block_linear (pdl at 2-8 rows: the one-row NVFP4 kernel launches plainly)."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if _triton_ok(x):
        from tpserve.kernels.quant.gemm_triton import w4a16_gemm

        y = w4a16_gemm(x2, w, bscale, scale2.reshape(1).expand(w.shape[0]).contiguous(), mma=mma, pdl=pdl)
    else:
        y = F.linear(x2, qr.nvfp4_dequantize(w, bscale, scale2, x.dtype))
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, w.shape[0])


def w8a8_block_scaled_mm(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x [M, K] 16-bit, w fp8 [N, K], s [N/128, K/128]: activations quantized per token x 128 columns,
    then torch._scaled_mm's DeepSeek-style blockwise FP8 GEMM (sm90), the scale layouts as DESIGN.md."""
    m, k = x.shape
    xb = x.float().view(m, k // 128, 128)
    amax = xb.abs().amax(-1).clamp(min=1e-12)
    sa = amax / qr.FP8_MAX
    xq = (xb / sa[..., None]).clamp(-qr.FP8_MAX, qr.FP8_MAX).view(m, k).to(qr.FP8)
    # scale_b: the [K/128, N/128] transpose of the weight's scales as a view (outer-dim-major), as
    # DESIGN.md notes; run 1 of bench/quant_kernels.py showed a contiguous copy is refused
    return torch._scaled_mm(xq, w.t(), scale_a=sa.t().contiguous().t(), scale_b=s.t(), out_dtype=x.dtype)


# ------------------------------------------------------------------ experts
def experts_bf16(x, weights, ids, gate_up, down, limit, kernels):
    return moe_ops.experts_forward(x, weights, ids, gate_up, down, limit, kernels.moe, kernels.moe_triton_max_tokens,
                                  kernels.moe_route, kernels.act)


def experts_fp8(x, weights, ids, gate_up, gu_scale, down, dn_scale, block, limit, kernels):
    if _triton_ok(x) and kernels.moe == "triton":
        from tpserve.kernels.quant.gemm_triton import experts_fp8_triton

        return experts_fp8_triton(x, weights, ids, gate_up, gu_scale, down, dn_scale, block, limit, kernels.moe_route,
                                  qtile=kernels.quant_decode_fp8 != "element",
                                  qtile_a=kernels.quant_decode_fp8 == "qtile")
    il = gate_up.shape[1] // 2
    nbi = gu_scale.shape[1] // 2

    def gate_up_of(e):
        g = qr.fp8_block_dequantize(gate_up[e, :il], gu_scale[e, :nbi], block, x.dtype)
        u = qr.fp8_block_dequantize(gate_up[e, il:], gu_scale[e, nbi:], block, x.dtype)
        return torch.cat([g, u])

    return moe_ops.experts_loop_fn(x, weights, ids, gate_up.shape[0], gate_up_of,
                                   lambda e: qr.fp8_block_dequantize(down[e], dn_scale[e], block, x.dtype), limit)


def experts_nvfp4(x, weights, ids, layer, limit, kernels):
    if kernels.quant_gemv == "cuda" and kernels.moe == "triton" and ids.shape[0] <= M1_MAX_TOKENS:
        from tpserve.kernels.quant import nvfp4_m1_cuda as nvfp4_m1

        if nvfp4_m1.usable(x, layer.down_proj.shape[2] * 2):
            return nvfp4_m1.experts(x, weights, ids, layer.gate_up_proj, layer.gate_up_bscale, layer.gate_up_scale2,
                                    layer.down_proj, layer.down_bscale, layer.down_scale2, limit)
    il = layer.gate_up_proj.shape[1] // 2
    row_scale2 = layer.gate_up_scale2.repeat_interleave(il, dim=1)             # [E, 2I]
    if _triton_ok(x) and kernels.moe == "triton":
        from tpserve.kernels.quant.gemm_triton import experts_nvfp4_triton

        return experts_nvfp4_triton(x, weights, ids, layer.gate_up_proj, layer.gate_up_bscale, row_scale2.contiguous(),
                                    layer.down_proj, layer.down_bscale,
                                    layer.down_scale2.expand(-1, layer.down_proj.shape[1]).contiguous(), limit,
                                    kernels.moe_route, qtile=kernels.quant_decode != "element",
                                    qtile_a=kernels.quant_decode == "qtile")
    return moe_ops.experts_loop_fn(
        x, weights, ids, layer.gate_up_proj.shape[0],
        lambda e: qr.nvfp4_dequantize(layer.gate_up_proj[e], layer.gate_up_bscale[e], row_scale2[e], x.dtype),
        lambda e: qr.nvfp4_dequantize(layer.down_proj[e], layer.down_bscale[e], layer.down_scale2[e], x.dtype),
        limit)
