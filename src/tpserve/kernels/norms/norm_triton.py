"""Fused Triton kernels for the small per-token ops of a decode step: norms and the mHC collapse / expand.

Why: a decode step of this model is hundreds of tiny kernels, each with a fixed launch cost however little it
does. RMSNorm in torch is 8 of them (cast, square, mean, add, rsqrt, mul, cast, mul), the KDA output norm 12
(its weight and gate cast too, the sigmoid, two more products), the mHC stream norm 6, its collapse 3 and its
expand 5; here each is one. Every kernel reads its inputs and writes its output once: the point is the launch
count, not bandwidth.

Numerics (norms/ref.py's torch forms are the reference and the CPU path): the same formulas in fp32 with another
summation order for the mean of squares (a tree over BLOCK-wide chunks) and for the mHC sums; every rounding to
the output dtype happens where the torch form rounds, except in the expand, which adds in fp32 and rounds once
(torch rounds the product, the matmul and the sum). Bounds: collectives/fused.py's rmsnorm_bound and
hc_expand_bound.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tpserve.kernels.launch import pdl_triton

_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _inv_rms(row_ptr, D, eps, BLOCK: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of one row, in fp32."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, D, BLOCK):
        d = start + tl.arange(0, BLOCK)
        h = tl.load(row_ptr + d, mask=d < D, other=0.0).to(tl.float32)
        acc += h * h
    return 1.0 / tl.sqrt(tl.sum(acc, axis=0) / D + eps)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, g_ptr, out_ptr, D, x_stride, g_stride, out_stride, eps,
                     MODE: tl.constexpr, DT: tl.constexpr, OUT_DT: tl.constexpr, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    """MODE 0: w * (h r).to(DT) (model RMSNorm); 1: h r in fp32 (mHC stream norm);
    2: (w.float() * h r * sigmoid(g.float())).to(DT) (KDA gated norm); h = x.float()."""
    pdl_triton.start(PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    r = _inv_rms(x_row, D, eps, BLOCK)
    for start in range(0, D, BLOCK):
        d = start + tl.arange(0, BLOCK)
        ok = d < D
        q = tl.load(x_row + d, mask=ok, other=0.0).to(tl.float32) * r
        if MODE == 0:
            w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
            y = (q.to(DT).to(tl.float32) * w).to(OUT_DT)
        elif MODE == 1:
            y = q
        else:
            w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + row * g_stride + d, mask=ok, other=0.0).to(tl.float32)
            y = ((w * q) * tl.sigmoid(g)).to(OUT_DT)
        tl.store(out_ptr + row * out_stride + d, y, mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, D] with unit stride along D (a view where possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _launch_norm(x, weight, gate, eps: float, mode: int, out_dtype: torch.dtype, pdl: bool) -> torch.Tensor:
    d = x.shape[-1]
    x2 = _rows(x)
    g2 = _rows(gate) if gate is not None else x2
    out = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    if x2.shape[0]:
        block = min(triton.next_power_of_2(d), 4096)
        _rms_norm_kernel[(x2.shape[0],)](
            x2, weight if weight is not None else x2, g2, out, d, x2.stride(0), g2.stride(0), out.stride(0), eps,
            MODE=mode, DT=_TL[x.dtype], OUT_DT=_TL[out_dtype], BLOCK=block, num_warps=4 if block <= 1024 else 8,
            PDL=pdl, launch_pdl=pdl)
    return out.view(*x.shape[:-1], d)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool = False) -> torch.Tensor:
    """model/layers.RMSNorm: weight * (h * rsqrt(mean(h^2) + eps)).to(x.dtype), h = x.float(). pdl (here and
    below): launched as a programmatic dependent of the kernel before (kernels/launch/pdl_triton.py; sm_90+)."""
    return _launch_norm(x, weight, None, eps, 0, torch.promote_types(x.dtype, weight.dtype), pdl)


def rms_normalize(x: torch.Tensor, eps: float, pdl: bool = False) -> torch.Tensor:
    """h * rsqrt(mean(h^2) + eps) in fp32, h = x.float() (the mHC stream norm, no weight)."""
    return _launch_norm(x, None, None, eps, 1, torch.float32, pdl)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   pdl: bool = False) -> torch.Tensor:
    """model/layers.GatedRMSNorm: (weight.float() * h * rsqrt(mean(h^2) + eps) * sigmoid(gate.float())).to(x.dtype)."""
    if gate.shape != x.shape:
        raise ValueError(f"gated_rms_norm: gate shape {tuple(gate.shape)} != x shape {tuple(x.shape)}")
    return _launch_norm(x, weight, gate, eps, 2, x.dtype, pdl)


@triton.jit
def _hc_collapse_kernel(pre_ptr, s_ptr, out_ptr, D, s_stride_t, s_stride_n, N: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    """out[t, d] = sum_n pre[t, n] * streams[t, n, d] (fp32, n in order), rounded to the streams' dtype."""
    pdl_triton.start(PDL)
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = d < D
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for n in tl.static_range(N):
        p = tl.load(pre_ptr + t * N + n)
        acc += p * tl.load(s_ptr + t * s_stride_t + n * s_stride_n + d, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * D + d, acc.to(out_ptr.dtype.element_ty), mask=ok)


def hc_collapse(pre: torch.Tensor, streams: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """(pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype): pre [T, N] fp32, streams [T, N, D]."""
    t, n, d = streams.shape
    if streams.stride(-1) != 1:
        streams = streams.contiguous()
    pre = pre.float().contiguous()
    out = torch.empty(t, d, dtype=streams.dtype, device=streams.device)
    if t:
        block = min(triton.next_power_of_2(d), 1024)
        _hc_collapse_kernel[(t, triton.cdiv(d, block))](pre, streams, out, d, streams.stride(0), streams.stride(1),
                                                        N=n, BLOCK=block, PDL=pdl, launch_pdl=pdl)
    return out


@triton.jit
def _hc_expand_kernel(x_ptr, s_ptr, post_ptr, comb_ptr, out_ptr, D, x_stride, s_stride_t, s_stride_n,
                      N: tl.constexpr, DT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out[t, n, d] = post[t, n] x[t, d] + sum_m comb[t, m, n] s[t, m, d]; post / comb rounded to DT
    first (as the torch form casts them), the sum in fp32, one rounding to DT."""
    pdl_triton.start(PDL)
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = d < D
    x = tl.load(x_ptr + t * x_stride + d, mask=ok, other=0.0).to(tl.float32)
    for n in tl.static_range(N):
        p = tl.load(post_ptr + t * N + n).to(DT).to(tl.float32)
        acc = p * x
        for m in tl.static_range(N):
            c = tl.load(comb_ptr + t * N * N + m * N + n).to(DT).to(tl.float32)
            acc += c * tl.load(s_ptr + t * s_stride_t + m * s_stride_n + d, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + (t * N + n) * D + d, acc.to(DT), mask=ok)


def hc_expand(total: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
              pdl: bool = False) -> torch.Tensor:
    """collectives/fused.hc_expand in one kernel: post (x) total + comb^T @ streams -> [T, N, D] in streams' dtype."""
    t, n, d = streams.shape
    if streams.stride(-1) != 1:
        streams = streams.contiguous()
    total = _rows(total)
    post, comb = post.float().contiguous(), comb.float().contiguous()
    out = torch.empty(t, n, d, dtype=streams.dtype, device=streams.device)
    if t:
        block = min(triton.next_power_of_2(d), 1024)
        _hc_expand_kernel[(t, triton.cdiv(d, block))](total, streams, post, comb, out, d, total.stride(0),
                                                      streams.stride(0), streams.stride(1), N=n,
                                                      DT=_TL[streams.dtype], BLOCK=block, PDL=pdl,
                                                      launch_pdl=pdl)
    return out
