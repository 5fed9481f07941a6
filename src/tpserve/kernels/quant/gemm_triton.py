"""Triton GEMMs on quantized weights, dequantized in registers (W8A16 / W4A16).

`_dot_w` adds one K tile of X @ W^T for a stored weight. FP8 (w [N, K] float8_e4m3fn, float32
block scales s [*, SK] at (scale row, k // BKS); per-channel FP8 is the block (1, K)): when the
scale block spans the K tile the raw e4m3 values go to the dot and the scale multiplies the fp32
partial product, else each element is scaled first. NVFP4 (w [N, K/2] uint8, low nibble first;
s [N, K/16] float8_e4m3fn; a float32 global scale per row): each byte is loaded once, its two
codes decoded and scaled, and they meet the even and odd columns of X in two dots. Tiles are cast
to the activation dtype for tl.dot; accumulation is fp32.

- `w8a16_gemm` / `w4a16_gemm`: y = x W^T, split over K at up to 16 rows so that even one row spreads
  over the whole GPU; partial sums are added in fp32 (atomic) and cast once. quant/dispatch.py takes
  them where the decode GEMVs (gemv_triton.py) do not fit.
- `experts_fp8_triton` / `experts_nvfp4_triton`: the grouped expert GEMMs of moe/grouped_triton.py
  (tokens sorted by expert, padded per expert to BLOCK_M rows, no host sync) on quantized experts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tpserve.kernels.moe.route_triton import align, combine_choices
from tpserve.kernels.moe.tiles_triton import block_rows, routed_store, swiglu_store
from tpserve.kernels.quant.gemv_triton import split_k, use_asm
from tpserve.kernels.quant.qtile_triton import OUT_BIAS, fp8_pair_order, fp8_tile, nvfp4_tile, pair_order

BLOCK_M = 16


@triton.jit
def _fp8_tile(w_ptr, s_ptr, n2, k2, srow2, mask, K: tl.constexpr, SK: tl.constexpr, BKS: tl.constexpr):
    """fp32 values of an FP8 weight at rows n2, columns k2 (broadcastable int64 index arrays), each
    element times its own block scale s[srow2, k2 // BKS]."""
    q = tl.load(w_ptr + n2 * K + k2, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + srow2 * SK + k2 // BKS, mask=mask, other=0.0)
    return q * s


@triton.jit
def _e2m1(c):
    """fp32 value of e2m1 codes (int32 0..15, sign in bit 3)."""
    m = c & 7
    e = m >> 1
    half = (m & 1).to(tl.float32) * 0.5
    mag = tl.where(e == 0, half, tl.exp2((e - 1).to(tl.float32)) * (1.0 + half))
    return tl.where((c & 8) != 0, -mag, mag)


@triton.jit
def _dot_w(acc, xrow, m_ok, w_ptr, s_ptr, s2_ptr, n64, srow, k0, n_ok, K: tl.constexpr, SK: tl.constexpr,
           BKS: tl.constexpr, FORMAT: tl.constexpr, HOIST: tl.constexpr, PRECISION: tl.constexpr,
           BLOCK_K: tl.constexpr, QTILE: tl.constexpr = 0, QA: tl.constexpr = True):
    """acc + X[:, k0:k0+BLOCK_K] @ W[n, k0:k0+BLOCK_K]^T; xrow: [BM, 1] pointers to the rows of X.
    QTILE 1 / 2 (2: its PTX): the tile decoded by qtile_triton.py (w_ptr viewed as int16; FP8 needs HOIST),
    with QA as the tensor cores' A operand (X in the tile's pair order), else as B (k order); the
    scale on the partial product.
    FP8 with HOIST (the scale block spans the K tile): the raw e4m3 values (exact in 16 bits) go to
    the dot and the block scale multiplies the fp32 partial product, one scale per output column.
    FP8 otherwise: the tile is dequantized element by element. NVFP4: each byte is loaded once; its
    low nibbles (even k) and high nibbles (odd k) meet the even and odd columns of X in two dots."""
    if QTILE:
        k = k0 + tl.arange(0, BLOCK_K)
        xa = tl.load(xrow + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
        if FORMAT == 0:
            wt = fp8_tile(w_ptr, n64, n_ok, k0, K, n64.shape[0], BLOCK_K, QTILE == 2, QA)
            if QA:
                xa = fp8_pair_order(xa, xa.shape[0], BLOCK_K)
            scale = tl.load(s_ptr + srow * SK + k0 // BKS, mask=n_ok, other=0.0)
        else:
            wt = nvfp4_tile(w_ptr, s_ptr, n64, n_ok, k0, K, n64.shape[0], BLOCK_K, QTILE == 2, QA)
            if QA:
                xa = pair_order(xa, xa.shape[0], BLOCK_K)
            scale = tl.load(s2_ptr + n64, mask=n_ok, other=0.0) * OUT_BIAS
        if QA:
            part = tl.trans(tl.dot(wt.to(xa.dtype), tl.trans(xa), input_precision=PRECISION))
        else:
            part = tl.dot(xa, tl.trans(wt.to(xa.dtype)), input_precision=PRECISION)
        return acc + part * scale[None, :]
    if FORMAT == 0:
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        xa = tl.load(xrow + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        k64 = k.to(tl.int64)
        mask = k_ok[:, None] & n_ok[None, :]
        if HOIST:
            q = tl.load(w_ptr + n64[None, :] * K + k64[:, None], mask=mask, other=0.0)
            part = tl.dot(xa, q.to(xa.dtype), input_precision=PRECISION)
            sc = tl.load(s_ptr + srow * SK + k0 // BKS, mask=n_ok, other=0.0)
            return acc + part * sc[None, :]
        else:
            wt = _fp8_tile(w_ptr, s_ptr, n64[None, :], k64[:, None], srow[None, :], mask, K, SK, BKS)
            return tl.dot(xa, wt.to(xa.dtype), acc, input_precision=PRECISION)
    else:
        j = tl.arange(0, BLOCK_K // 2)
        ke = k0 + 2 * j
        k_ok = ke < K
        xm = m_ok[:, None] & k_ok[None, :]
        xe = tl.load(xrow + ke[None, :], mask=xm, other=0.0)
        xo = tl.load(xrow + ke[None, :] + 1, mask=xm, other=0.0)
        mask = k_ok[:, None] & n_ok[None, :]
        b = tl.load(w_ptr + n64[None, :] * (K // 2) + (ke // 2).to(tl.int64)[:, None], mask=mask, other=0).to(tl.int32)
        sc = tl.load(s_ptr + n64[None, :] * (K // 16) + (ke // 16).to(tl.int64)[:, None], mask=mask,
                     other=0.0).to(tl.float32)
        sc = sc * tl.load(s2_ptr + n64, mask=n_ok, other=0.0)[None, :]
        acc = tl.dot(xe, (_e2m1(b & 15) * sc).to(xe.dtype), acc, input_precision=PRECISION)
        return tl.dot(xo, (_e2m1(b >> 4) * sc).to(xo.dtype), acc, input_precision=PRECISION)


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, s_ptr, s2_ptr, y_ptr, M, N, K: tl.constexpr, SK: tl.constexpr, BNS: tl.constexpr,
                 BKS: tl.constexpr, FORMAT: tl.constexpr, K_PER_SPLIT: tl.constexpr, PRECISION: tl.constexpr,
                 ATOMIC: tl.constexpr, HOIST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = m < M, n < N
    n64 = n.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = tl.program_id(2) * K_PER_SPLIT
    xrow = x_ptr + m[:, None].to(tl.int64) * K
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        acc = _dot_w(acc, xrow, m_ok, w_ptr, s_ptr, s2_ptr, n64, n64 // BNS, k_start + k0, n_ok, K, SK, BKS, FORMAT,
                     HOIST, PRECISION, BLOCK_K)
    offs = y_ptr + m[:, None].to(tl.int64) * N + n[None, :]
    if ATOMIC:
        tl.atomic_add(offs, acc, mask=m_ok[:, None] & n_ok[None, :])
    else:
        tl.store(offs, acc, mask=m_ok[:, None] & n_ok[None, :])


def _gemm(x, w, s, s2, fmt: int, k: int, sk: int, bns: int, bks: int, block_n: int = 64, block_k: int = 128):
    m, n = x.shape[0], w.shape[0]
    x = x.contiguous()
    block_m = 16 if m <= 16 else 64
    split, k_per = (1, triton.cdiv(k, block_k) * block_k) if m > 16 else split_k(n, k, block_n, block_k)
    y = (torch.zeros if split > 1 else torch.empty)(m, n, dtype=torch.float32, device=x.device)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    _gemm_kernel[grid](x, w, s, s2, y, m, n, K=k, SK=sk, BNS=bns, BKS=bks, FORMAT=fmt, K_PER_SPLIT=k_per,
                       PRECISION=precision, ATOMIC=split > 1, HOIST=fmt == 0 and bks % block_k == 0, BLOCK_M=block_m,
                       BLOCK_N=block_n, BLOCK_K=block_k)
    return y.to(x.dtype)


def w8a16_gemm(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, block: tuple[int, int], **tiles) -> torch.Tensor:
    """x [M, K] (16-bit or fp32) @ dequant(w fp8 [N, K], s [ceil(N/bn), ceil(K/bk)])^T -> [M, N] in x.dtype, the
    tiled kernel (split over K at up to 16 rows); tiles: block_n / block_k overrides (benchmarks)."""
    s = s.contiguous()
    return _gemm(x, w, s, s, 0, w.shape[1], s.shape[1], block[0], block[1], **tiles)


def w4a16_gemm(x: torch.Tensor, w: torch.Tensor, bscale: torch.Tensor, scale2_rows: torch.Tensor,
               **tiles) -> torch.Tensor:
    """x [M, K] @ dequant(nvfp4 w [N, K/2], bscale [N, K/16], scale2_rows [N])^T -> [M, N] in x.dtype, the tiled
    kernel; tiles as in w8a16_gemm."""
    k = w.shape[1] * 2
    return _gemm(x, w, bscale.contiguous(), scale2_rows.float().contiguous(), 1, k, k // 16, 1, 16, **tiles)


# ------------------------------------------------------------------ grouped experts
@triton.jit
def _qgate_up_kernel(x_ptr, w_ptr, s_ptr, s2_ptr, h_ptr, rows_ptr, block_expert_ptr, num_experts, limit,
                     stride_we, stride_se, stride_s2e, top_k: tl.constexpr, D: tl.constexpr, INTER: tl.constexpr,
                     SK: tl.constexpr, BNS: tl.constexpr, BKS: tl.constexpr, UP_SROW: tl.constexpr,
                     FORMAT: tl.constexpr, HOIST: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, QTILE: tl.constexpr = 0,
                     QA: tl.constexpr = True):
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b)
    if e < num_experts:
        m, a, m_ok = block_rows(rows_ptr, b, BLOCK_M)
        tok = tl.where(m_ok, a // top_k, 0).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < INTER
        n64 = n.to(tl.int64)
        e64 = e.to(tl.int64)
        w, s, s2 = w_ptr + e64 * stride_we, s_ptr + e64 * stride_se, s2_ptr + e64 * stride_s2e
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        xrow = x_ptr + tok[:, None] * D
        for k0 in range(0, D, BLOCK_K):
            acc_g = _dot_w(acc_g, xrow, m_ok, w, s, s2, n64, n64 // BNS, k0, n_ok, D, SK, BKS, FORMAT, HOIST,
                           PRECISION, BLOCK_K, QTILE, QA)
            acc_u = _dot_w(acc_u, xrow, m_ok, w, s, s2, INTER + n64, UP_SROW + n64 // BNS, k0, n_ok, D, SK, BKS,
                           FORMAT, HOIST, PRECISION, BLOCK_K, QTILE, QA)
        swiglu_store(h_ptr, m, m_ok, n, n_ok, acc_g, acc_u, limit, INTER)


@triton.jit
def _qdown_kernel(h_ptr, w_ptr, s_ptr, s2_ptr, y_ptr, rows_ptr, block_expert_ptr, route_ptr, num_experts,
                  stride_we, stride_se, stride_s2e, D: tl.constexpr, INTER: tl.constexpr, SK: tl.constexpr,
                  BNS: tl.constexpr, BKS: tl.constexpr, FORMAT: tl.constexpr, HOIST: tl.constexpr,
                  PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  QTILE: tl.constexpr = 0, QA: tl.constexpr = True):
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b)
    if e < num_experts:
        m, a, m_ok = block_rows(rows_ptr, b, BLOCK_M)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < D
        n64 = n.to(tl.int64)
        e64 = e.to(tl.int64)
        w, s, s2 = w_ptr + e64 * stride_we, s_ptr + e64 * stride_se, s2_ptr + e64 * stride_s2e
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        hrow = h_ptr + m[:, None].to(tl.int64) * INTER
        for k0 in range(0, INTER, BLOCK_K):
            acc = _dot_w(acc, hrow, m_ok, w, s, s2, n64, n64 // BNS, k0, n_ok, INTER, SK, BKS, FORMAT, HOIST,
                         PRECISION, BLOCK_K, QTILE, QA)
        routed_store(y_ptr, route_ptr, a, m_ok, n, n_ok, acc, D)


def _qtile_mode(x: torch.Tensor, qtile: bool | None, asm: bool | None) -> int:
    """QTILE for the kernels: 0 (the per-element decode), 1 (qtile_triton.py in plain Triton) or 2 (its PTX).
    Default on, except for an fp16 x (the decoded tiles are bf16)."""
    if qtile and x.dtype == torch.float16:
        raise ValueError("qtile: takes a bf16 or float32 x, got float16")
    if qtile is False or (qtile is None and x.dtype == torch.float16):
        return 0
    return 2 if use_asm(x, asm) else 1


def _experts(x, weights, ids, fmt, gu, gu_s, gu_s2, dn, dn_s, dn_s2, limit, sk_gu, sk_dn, bns, bks, up_srow,
             route_backend: str = "torch", qtile: int = 0, qtile_a: bool = True, block_n: int = 64,
             block_k: int | None = None, num_warps: int = 4, num_stages: int | None = None):
    if num_stages is None:  # one token: five stages, more: three (the faster on an H200; BENCHMARKS.md, quantized
        # experts)
        num_stages = 5 if ids.shape[0] == 1 else 3
    if block_k is None:  # qtile: 64 x 256 nvfp4 tiles (the best measured at 8 tokens); fp8 tiles must sit in one
        # 128-wide scale block
        block_k = (128 if fmt == 0 else 256) if qtile else 64
    t, top_k = ids.shape
    num_experts, two_i = gu.shape[:2]
    inter, d = two_i // 2, x.shape[1]
    x = x.contiguous()
    rows, block_expert = align(ids, num_experts, BLOCK_M, route_backend)
    nb = block_expert.numel()
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    hoist = fmt == 0 and bks % block_k == 0
    if qtile and fmt == 0 and not hoist:
        qtile = 0  # fp8_tile leaves the scale to the partial product: the K tile must sit in one scale block
    if qtile:  # qtile_triton.py reads the weights as int16 words
        gu, dn = gu.view(torch.int16), dn.view(torch.int16)
    h = torch.empty(nb * BLOCK_M, inter, dtype=x.dtype, device=x.device)
    _qgate_up_kernel[(nb, triton.cdiv(inter, block_n))](
        x, gu, gu_s, gu_s2, h, rows, block_expert, num_experts, float(limit), gu.stride(0), gu_s.stride(0),
        gu_s2.stride(0), top_k=top_k, D=d, INTER=inter, SK=sk_gu, BNS=bns, BKS=bks, UP_SROW=up_srow, FORMAT=fmt,
        HOIST=hoist, PRECISION=precision, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, QTILE=qtile,
        QA=qtile_a, num_warps=num_warps, num_stages=num_stages)
    y = torch.empty(t * top_k, d, dtype=torch.float32, device=x.device)
    route = weights.reshape(-1).float().contiguous()
    _qdown_kernel[(nb, triton.cdiv(d, block_n))](
        h, dn, dn_s, dn_s2, y, rows, block_expert, route, num_experts, dn.stride(0), dn_s.stride(0), dn_s2.stride(0),
        D=d, INTER=inter, SK=sk_dn, BNS=bns, BKS=bks, FORMAT=fmt, HOIST=hoist, PRECISION=precision, BLOCK_M=BLOCK_M,
        BLOCK_N=block_n, BLOCK_K=block_k, QTILE=qtile, QA=qtile_a, num_warps=num_warps, num_stages=num_stages)
    return combine_choices(y, top_k, x.dtype, route_backend)


def experts_fp8_triton(x, weights, ids, gate_up, gu_scale, down, dn_scale, block, limit, route_backend="torch",
                       qtile: bool | None = None, asm: bool | None = None, qtile_a: bool = True, **tiles):
    """Same contract as kernels.moe.experts_loop on fp8 block experts (quant_methods.Fp8Experts).
    `qtile` (default: unless x is fp16): tiles decoded by qtile.fp8_tile, two values per 32-bit
    operation (`asm`: its PTX, default on CUDA), as the tensor cores' A operand (`qtile_a`) or B;
    tiles: block_n / block_k / num_warps / num_stages overrides (benchmarks)."""
    gu_scale, dn_scale = gu_scale.contiguous(), dn_scale.contiguous()
    return _experts(x, weights, ids, 0, gate_up, gu_scale, gu_scale, down, dn_scale, dn_scale, limit,
                    gu_scale.shape[2], dn_scale.shape[2], block[0], block[1], gu_scale.shape[1] // 2, route_backend,
                    _qtile_mode(x, qtile, asm), qtile_a, **tiles)


def experts_nvfp4_triton(x, weights, ids, gate_up, gu_bscale, gu_scale2_rows, down, dn_bscale, dn_scale2_rows, limit,
                         route_backend="torch", qtile: bool | None = None, asm: bool | None = None,
                         qtile_a: bool = True, **tiles):
    """Same contract on nvfp4 experts; scale2_rows: the global scale of each row [E, rows] float32.
    `qtile`, `asm`, `qtile_a` and tiles as in experts_fp8_triton (qtile.nvfp4_tile: two codes per
    operation)."""
    return _experts(x, weights, ids, 1, gate_up, gu_bscale.contiguous(), gu_scale2_rows.float().contiguous(), down,
                    dn_bscale.contiguous(), dn_scale2_rows.float().contiguous(), limit, 0, 0, 1, 16, 0, route_backend,
                    _qtile_mode(x, qtile, asm), qtile_a, **tiles)
