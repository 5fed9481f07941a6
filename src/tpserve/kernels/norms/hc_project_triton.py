"""The mHC projection of a prefill step in one Triton kernel: mixed = rms_normalize(streams) @ fn^T.

The torch form writes the normalised streams in fp32 ([T, n*D]: 1 GiB at 16,384 tokens, n*D = 16,384) and reads
them back into an fp32 GEMM against fn [(2+n)*n, n*D]. Here one pass reads the bf16 streams once, summing each
row's squares and its dot products with fn together, and scales the sums by the row's inverse RMS at the end:
mixed[t, j] = r_t * sum_c x[t, c] fn[j, c], r_t = 1 / sqrt(mean_c x[t, c]^2 + eps). It is bandwidth-bound
(the streams' bytes against a few GFLOP); 128 rows a program keep the split weight's re-reads from L2 few
(bench/prefill_kernels.py --hc-block-t; BENCHMARKS.md, mHC projection).

Exact products on bf16 tensor cores: fn is split once, after loading (norms/mhc.py `split_weight`), into three
bf16 parts hi + lo + lo2 whose sum is fn to within 2^-24 relative (each part holds the next 8 bits), and every
bf16 x bf16 product is exact in fp32. The sums are not an fp32 GEMM's (the tensor cores' accumulation does not
round each addition to nearest): the error stays inside the bound below, far under bf16's resolution (2^-8),
where the projection's results (the mHC weights) are used. Only bf16 streams take this path (their values are
exact in bf16). The split weight is 3 x (2+n)*n x n*D bf16 per block (model/plan.py counts it with the weights).

Used for steps with prefill tokens only (model/mhc.py): a program streams K for its rows, so at decode the
weight read would run through one SM; decode and verify steps (every CUDA graph) keep the two-kernel path, so
graphs and eager decode steps compute alike.

Bound against exact arithmetic, per output (u = 2^-24; S = r sum_c |x_c fn_jc|): the split leaves <= u S;
3K exact products summed in fp32: <= 3K u S; the mean of K squares in fp32 moves r by <= (K/2 + 3) u
relative; the final product 1 u. The torch form (an fp32 GEMM over fp32-rounded normalised values) lies under
the same bound: tests/kernels/norms/test_hc_project.py checks both against float64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


BLOCK_T = 128  # rows per program (the dot's M)
BLOCK_K = 128  # columns per step


@triton.jit
def _hc_project_kernel(x_ptr, f_ptr, out_ptr, T, K, W, x_stride, eps,
                       BT: tl.constexpr, BK: tl.constexpr, WP: tl.constexpr, PARTS: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    tm = t < T
    j = tl.arange(0, WP)
    jm = j < W
    sq = tl.zeros([BT], tl.float32)
    acc = tl.zeros([BT, WP], tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        km = k < K
        x = tl.load(x_ptr + t[:, None].to(tl.int64) * x_stride + k[None, :], mask=tm[:, None] & km[None, :],
                    other=0.0)
        xf = x.to(tl.float32)
        sq += tl.sum(xf * xf, axis=1)
        for p in tl.static_range(PARTS):
            f = tl.load(f_ptr + (p * W + j)[None, :].to(tl.int64) * K + k[:, None], mask=km[:, None] & jm[None, :],
                        other=0.0)
            if PARTS == 1:  # float32 streams and weight (tests, fp32 models): IEEE products
                acc += tl.dot(x, f, input_precision="ieee")
            else:
                acc += tl.dot(x, f)
    r = 1.0 / tl.sqrt(sq / K + eps)
    tl.store(out_ptr + t[:, None].to(tl.int64) * W + j[None, :], acc * r[:, None], mask=tm[:, None] & jm[None, :])


def hc_project(streams: torch.Tensor, parts: torch.Tensor, eps: float, block_t: int = BLOCK_T) -> torch.Tensor:
    """streams [T, K] (rows may be strided, columns contiguous), parts = kernels/norms/mhc.project_weight(fn,
    streams.dtype) -> mixed [T, W] fp32 = rms_normalize(streams) @ fn^T. bf16 streams: parts [3, W, K] bf16 (the
    split); float32 streams: parts [1, W, K] float32 (fn itself; the interpreter tests this form, having no bf16
    arithmetic)."""
    want = {torch.bfloat16: (3, torch.bfloat16), torch.float32: (1, torch.float32)}.get(streams.dtype)
    t, k = streams.shape
    if want is None or (parts.shape[0], parts.dtype) != want or parts.dim() != 3 or parts.shape[2] != k:
        raise ValueError(f"hc_project: {streams.dtype} streams [{t}, {k}] need parts [3, W, {k}] bf16 (bfloat16) "
                         f"or [1, W, {k}] float32 (float32), got {tuple(parts.shape)} {parts.dtype}")
    x = streams if streams.stride(1) == 1 else streams.contiguous()
    w = parts.shape[1]
    out = torch.empty(t, w, dtype=torch.float32, device=streams.device)
    if t:
        _hc_project_kernel[(triton.cdiv(t, block_t),)](x, parts, out, t, k, w, x.stride(0), eps, BT=block_t,
                                                       BK=BLOCK_K, WP=max(16, triton.next_power_of_2(w)),
                                                       PARTS=parts.shape[0], num_warps=4 if block_t <= 32 else 8)
    return out
