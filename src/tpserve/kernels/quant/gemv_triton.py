"""Decode GEMVs on quantized weights in Triton (M <= 16 rows): y = x W^T, W streamed once at full width.

At these sizes only bandwidth matters (the FLOPs are negligible against W's bytes): every program reads a
[BLOCK_N, BLOCK_K] tile of W as rows with K contiguous (16-byte vector loads), K is split over programs so that a
single row still spreads over every SM, and partial sums meet in fp32 atomics; with one K split (waves = 0) a
program runs the whole K and stores y in x's dtype (no zero fill, atomics or cast kernel around the launch).

FP8 (w float8_e4m3fn [N, K], fp32 block scales s [ceil(N/BNS), K/BKS]): a tile never crosses a scale block
(BKS % BLOCK_K == 0), so the raw e4m3 values (exact in 16 bits) are dotted and the tile's one scale per row
multiplies the fp32 partial sum; at one row `_fp8_row_kernel` does FMAs on them instead.
NVFP4 in the generic kernel (w uint8 [N, K/2], low nibble = even k; s float8_e4m3fn [N, K/16]; s2 float32 per
row): an e2m1 code c becomes float16 bits ((c & 8) << 12) | ((c & 7) << 9), exactly its value times 2^-14
(subnormals included), so decoding is three integer ops and a bitcast; the 2^14 rides on the row's global scale.
At M = 1 the 16-value groups are summed first and scaled once per group; at M > 1 the tile is scaled and the
rows go through tl.dot. `fp32_decode` (M = 1) places the code's bits straight into float32,
((c & 8) << 28) | ((c & 7) << 22), its value times 2^-126, against activations pre-scaled by 2^64 (exact), the
2^62 again on the row's global scale: right only where the GPU keeps float32 subnormals (Triton does not flush
them by default). The NVFP4 one-row and planes kernels are gemv_nvfp4_triton.py's.
`qtile` (either format, any M): the tile decoded by qtile_triton.py, two values per 32-bit operation, and
multiplied on the tensor cores as their A operand (W @ X^T, the activations in the tile's pair order) or B; the
FP8 block scale or the NVFP4 global scale on the fp32 partial sums.
quant/dispatch.py chooses the kernel for a call; `w8a16_gemv` launches the one its arguments name.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tpserve.kernels.quant.qtile_triton import OUT_BIAS, fp8_pair_order, fp8_tile, nvfp4_tile, pair_order

SMS = 132  # H200 streaming multiprocessors: the split-K target is a few waves of programs


@triton.jit
def _e2m1_scaled_down(c):
    """fp32 value of e2m1 codes c (int32 0..15) times 2^-14."""
    bits = ((c & 8) << 12) | ((c & 7) << 9)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e2m1_fp32_bits(b):
    """fp32 values times 2^-126 of the low and high e2m1 codes of bytes b (int32 0..255)."""
    lo = ((b & 8) << 28) | ((b & 7) << 22)
    hi = ((b & 0x80) << 24) | ((b & 0x70) << 18)
    return lo.to(tl.float32, bitcast=True), hi.to(tl.float32, bitcast=True)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, s2_ptr, y_ptr, M, N, K: tl.constexpr, SK: tl.constexpr, BNS: tl.constexpr,
                 BKS: tl.constexpr, FORMAT: tl.constexpr, K_PER_SPLIT: tl.constexpr, ATOMIC: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, DECODE32: tl.constexpr = False, QTILE: tl.constexpr = False,
                 QA: tl.constexpr = True, ASM: tl.constexpr = False):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    n64 = n.to(tl.int64)
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    k_start = tl.program_id(1) * K_PER_SPLIT
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # QTILE and QA: W @ X^T, the tile as the MMA's A
    for kk in range(0, K_PER_SPLIT, BLOCK_K):
        k0 = k_start + kk
        if FORMAT == 0:
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < K
            if not QTILE:
                w = tl.load(w_ptr + n64[:, None] * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            sc = tl.load(s_ptr + (n64 // BNS) * SK + k0 // BKS, mask=n_ok, other=0.0)
            if QTILE:  # fp8_tile (e4m3 exact in bf16) on the tensor cores, the block scale on the partial
                wt = fp8_tile(w_ptr, n64, n_ok, k0, K, BLOCK_N, BLOCK_K, ASM, QA)
                xa = tl.load(x_ptr + m[:, None] * K + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                if QA:
                    xa = fp8_pair_order(xa, BLOCK_M, BLOCK_K)
                    acc_t += tl.dot(wt.to(xa.dtype), tl.trans(xa), input_precision=PRECISION) * sc[:, None]
                else:
                    acc += tl.dot(xa, tl.trans(wt.to(xa.dtype)), input_precision=PRECISION) * sc[None, :]
            else:  # M > 1 (one row goes to _fp8_row_kernel)
                xa = tl.load(x_ptr + m[:, None] * K + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                part = tl.dot(xa, tl.trans(w.to(xa.dtype)), input_precision=PRECISION)
                acc += part * sc[None, :]
        elif QTILE:  # nvfp4_tile: two codes per 32-bit operation, then the tensor cores
            wt = nvfp4_tile(w_ptr, s_ptr, n64, n_ok, k0, K, BLOCK_N, BLOCK_K, ASM, QA)
            k = k0 + tl.arange(0, BLOCK_K)
            xa = tl.load(x_ptr + m[:, None] * K + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
            if QA:
                acc_t += tl.dot(wt.to(xa.dtype), tl.trans(pair_order(xa, BLOCK_M, BLOCK_K)), input_precision=PRECISION)
            else:
                acc += tl.dot(xa, tl.trans(wt.to(xa.dtype)), input_precision=PRECISION)
        else:
            j = tl.arange(0, BLOCK_K // 2)
            kb = k0 // 2 + j
            b_ok = kb < K // 2
            b = tl.load(w_ptr + n64[:, None] * (K // 2) + kb[None, :], mask=n_ok[:, None] & b_ok[None, :],
                        other=0).to(tl.int32)
            if DECODE32:
                lo, hi = _e2m1_fp32_bits(b)
            else:
                lo = _e2m1_scaled_down(b & 15)
                hi = _e2m1_scaled_down(b >> 4)
            g = k0 // 16 + tl.arange(0, BLOCK_K // 16)
            sc = tl.load(s_ptr + n64[:, None] * (K // 16) + g[None, :], mask=n_ok[:, None] & (g < K // 16)[None, :],
                         other=0.0).to(tl.float32)
            if BLOCK_M == 1:
                xe = tl.load(x_ptr + 2 * kb, mask=b_ok, other=0.0).to(tl.float32)
                xo = tl.load(x_ptr + 2 * kb + 1, mask=b_ok, other=0.0).to(tl.float32)
                if DECODE32:
                    xe *= 18446744073709551616.0  # 2^64
                    xo *= 18446744073709551616.0
                prod = lo * xe[None, :] + hi * xo[None, :]
                groups = tl.sum(tl.reshape(prod, (BLOCK_N, BLOCK_K // 16, 8)), axis=2)
                acc += tl.sum(groups * sc, axis=1)[None, :]
            else:
                xm = m_ok[:, None] & b_ok[None, :]
                xe = tl.load(x_ptr + m[:, None] * K + 2 * kb[None, :], mask=xm, other=0.0)
                xo = tl.load(x_ptr + m[:, None] * K + 2 * kb[None, :] + 1, mask=xm, other=0.0)
                los = tl.reshape(tl.reshape(lo, (BLOCK_N, BLOCK_K // 16, 8)) * sc[:, :, None], (BLOCK_N, BLOCK_K // 2))
                his = tl.reshape(tl.reshape(hi, (BLOCK_N, BLOCK_K // 16, 8)) * sc[:, :, None], (BLOCK_N, BLOCK_K // 2))
                acc += tl.dot(xe, tl.trans(los.to(xe.dtype)), input_precision=PRECISION)
                acc += tl.dot(xo, tl.trans(his.to(xo.dtype)), input_precision=PRECISION)
    if QTILE and QA:
        acc = tl.trans(acc_t)
    if FORMAT == 1:
        if QTILE:
            acc *= tl.load(s2_ptr + n64, mask=n_ok, other=0.0)[None, :] * OUT_BIAS
        elif DECODE32:
            acc *= tl.load(s2_ptr + n64, mask=n_ok, other=0.0)[None, :] * 4611686018427387904.0  # 2^62
        else:
            acc *= tl.load(s2_ptr + n64, mask=n_ok, other=0.0)[None, :] * 16384.0
    offs = y_ptr + m[:, None].to(tl.int64) * N + n[None, :]
    if ATOMIC:
        tl.atomic_add(offs, acc, mask=m_ok[:, None] & n_ok[None, :])
    else:  # one K split: the output in its own dtype, no zero fill and no cast kernel around it
        tl.store(offs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _fp8_row_kernel(x_ptr, w_ptr, s_ptr, y_ptr, N, K: tl.constexpr, SK: tl.constexpr, BNS: tl.constexpr,
                    BKS: tl.constexpr, K_PER_SPLIT: tl.constexpr, ATOMIC: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """FP8 at M = 1: y[n] = sum over K of x[k] w[n, k] s[n // BNS, k // BKS], FMAs on the e4m3 values, each
    scale block's partial sum scaled once. A K tile sits inside one scale block or spans SUBS whole ones
    (BLOCK_K = SUBS * BKS: wider tiles put more bytes in flight per program). Triton software-pipelines
    only loads that feed a dot, so this loop's loads are not; PREFETCH issues the next tile's load before
    this tile's arithmetic (two tiles in flight per program, twice the registers for W)."""
    SUBS: tl.constexpr = BLOCK_K // BKS if BLOCK_K > BKS else 1
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    n64 = n.to(tl.int64)
    k_start = tl.program_id(1) * K_PER_SPLIT
    k_end = k_start + K_PER_SPLIT
    kr = tl.arange(0, BLOCK_K)
    wrow = w_ptr + n64[:, None] * K
    srow = s_ptr + (n64 // BNS) * SK
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if PREFETCH:
        w = tl.load(wrow + (k_start + kr)[None, :], mask=n_ok[:, None] & (k_start + kr < K)[None, :], other=0.0)
    for kk in range(0, K_PER_SPLIT, BLOCK_K):
        k0 = k_start + kk
        k = k0 + kr
        if PREFETCH:
            cur = w
            kn = k + BLOCK_K
            w = tl.load(wrow + kn[None, :], mask=n_ok[:, None] & ((kn < K) & (kn < k_end))[None, :], other=0.0)
        else:
            cur = tl.load(wrow + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0.0)
        prod = cur.to(tl.float32) * tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)[None, :]
        if SUBS == 1:
            acc += tl.sum(prod, axis=1) * tl.load(srow + k0 // BKS, mask=n_ok, other=0.0)
        else:
            j = k0 // BKS + tl.arange(0, SUBS)
            sc = tl.load(srow[:, None] + j[None, :], mask=n_ok[:, None] & (j < SK)[None, :], other=0.0)
            acc += tl.sum(tl.sum(tl.reshape(prod, (BLOCK_N, SUBS, BLOCK_K // SUBS)), axis=2) * sc, axis=1)
    if ATOMIC:
        tl.atomic_add(y_ptr + n, acc, mask=n_ok)
    else:
        tl.store(y_ptr + n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


def split_k(n: int, k: int, block_n: int, block_k: int, waves: int = 4) -> tuple[int, int]:
    """-> (K splits, K per split, a whole number of K tiles) so that the (N tile, K split) programs
    fill the SMs `waves` times (here and in gemm_triton's tiled kernel at small M); waves = 0: one
    split (each program runs the whole K and stores its output: no zero fill, atomics or cast)."""
    tiles = triton.cdiv(n, block_n)
    split = 1 if waves == 0 else max(1, min(triton.cdiv(k, block_k), triton.cdiv(waves * SMS, tiles)))
    k_per = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    return triton.cdiv(k, k_per), k_per


def split_output(x: torch.Tensor, n: int, k: int, block_n: int, block_k: int, waves: int):
    """(K splits, K per split, y [M, N]) for a GEMV launch: y fp32 zeros where splits add into it atomically
    (the caller casts it to x's dtype), else uninitialised in x's dtype (each program stores its own)."""
    split, k_per = split_k(n, k, block_n, block_k, waves)
    m = x.shape[0]
    y = torch.zeros(m, n, dtype=torch.float32, device=x.device) if split > 1 else x.new_empty(m, n)
    return split, k_per, y


_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"  # Triton decides this at import, once per process


def use_asm(x: torch.Tensor, asm: bool | None = None) -> bool:
    """Whether qtile_triton.py may use its inline PTX: a CUDA tensor and Triton compiling (not interpreting), unless
    the caller's `asm` is False."""
    return x.is_cuda and not _INTERPRETED and asm is not False


def gemv_rows(x, w, s, s2, fmt: int, k: int, sk: int, bns: int, bks: int, block_n: int, block_k: int,
              num_warps: int, num_stages: int, waves: int, decode32: bool = False, qtile: bool = False,
              asm: bool | None = None, qa: bool = True) -> torch.Tensor:
    """The generic kernel (`_gemv_kernel`, fmt 0 FP8 / 1 NVFP4) on x [M <= 16, K] with these tiles and K split."""
    m, n = x.shape[0], w.shape[0]
    if m > 16:
        raise ValueError(f"x: quantized GEMV takes at most 16 rows, got {m}")
    x = x.contiguous()
    block_m = 1 if m == 1 and not qtile else 16
    split, k_per, y = split_output(x, n, k, block_n, block_k, waves)
    _gemv_kernel[(triton.cdiv(n, block_n), split)](
        x, w.view(torch.int16) if qtile else w, s, s2, y, m, n, K=k, SK=sk, BNS=bns, BKS=bks, FORMAT=fmt,
        K_PER_SPLIT=k_per, ATOMIC=split > 1,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, DECODE32=decode32 and block_m == 1, QTILE=qtile, QA=qa,
        ASM=qtile and use_asm(x, asm),
        num_warps=num_warps, num_stages=num_stages)
    return y.to(x.dtype)


def fp8_gemv_fits(k: int, block: tuple[int, int], block_k: int = 128, one_row: bool = False) -> bool:
    """Whether the FP8 GEMV's K tile stays inside one scale block (one row: or spans whole ones) and K is
    whole tiles."""
    return (block[1] % block_k == 0 or one_row and block_k % block[1] == 0) and k % block_k == 0



def w8a16_gemv(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, block: tuple[int, int], block_n: int | None = None,
               block_k: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
               waves: int | None = None, qtile: bool | None = None, asm: bool | None = None, qtile_a: bool = False,
               prefetch: bool = False) -> torch.Tensor:
    """x [M <= 16, K] @ dequant(w fp8 [N, K], s [ceil(N/bn), K/bk])^T -> [M, N] in x.dtype. One row without `qtile`:
    the row kernel (_fp8_row_kernel: FMAs; block_k may also span whole scale blocks, `prefetch` loads the next K
    tile before this one's arithmetic). Else the generic kernel: `qtile` (None: more than one row of a bf16 or
    float32 x) decodes the tile with qtile_triton.fp8_tile onto the tensor cores as their A operand (`qtile_a`,
    W @ X^T) or B, else each value is converted; `asm` as in gemv_nvfp4_triton.w4a16_gemv. Tile defaults, from
    bench/quant_decode_sweep.py on an H200 (BENCHMARKS.md, quantized GEMV): one row: 4096-wide K tiles where K
    is whole 4096 tiles (4 rows on 8 warps, 8 on 4 where K >= 8192), else 16 rows on 8 warps, 2048 wide with one
    K split where K >= 8192, else the widest of 512 / 256 / 128 that K and the scale block allow, split over 2
    waves; more rows: 32 x 128 on 4 warps, qtile with 4 stages over 2 waves, per-value 3 stages over 4 waves."""
    if qtile and x.dtype == torch.float16:
        raise ValueError("qtile: takes a bf16 or float32 x, got float16")
    if qtile is None:
        qtile = x.shape[0] > 1 and x.dtype != torch.float16
    one_row = x.shape[0] == 1 and not qtile
    if one_row:
        k = w.shape[1]
        if block_k is None:  # 4096 where K is whole 4096 tiles, else the widest tile K and the scale block allow
            wide = (4096, 2048, 512, 256) if k >= 8192 else (4096, 512, 256)
            block_k = next((bk for bk in wide if fp8_gemv_fits(k, block, bk, True)), 128)
        if block_k == 4096:  # a whole 4096-wide row slice per step: 4 rows on 8 warps, or 8 on 4 where K >= 8192
            block_n, num_warps = block_n or (8 if k >= 8192 else 4), num_warps or (4 if k >= 8192 else 8)
        block_n, num_warps, num_stages = block_n or 16, num_warps or 8, num_stages or 3
        waves = (0 if block_k == 2048 else 2) if waves is None else waves
    else:
        block_n, block_k, num_warps = block_n or 32, block_k or 128, num_warps or 4
        num_stages = num_stages or (4 if qtile else 3)
        waves = (2 if qtile else 4) if waves is None else waves
    if not fp8_gemv_fits(w.shape[1], block, block_k, one_row):
        raise ValueError(f"block_k: {block_k} must divide the scale block {block[1]}"
                         f"{' (or be a multiple of it)' if one_row else ''} and K {w.shape[1]}")
    if not one_row:
        return gemv_rows(x, w, s.contiguous(), s, 0, w.shape[1], s.shape[1], block[0], block[1], block_n, block_k,
                         num_warps, num_stages, waves, qtile=qtile, asm=asm, qa=qtile_a)
    n, k = w.shape
    x, s = x.contiguous(), s.contiguous()
    split, k_per, y = split_output(x, n, k, block_n, block_k, waves)
    _fp8_row_kernel[(triton.cdiv(n, block_n), split)](
        x, w, s, y, n, K=k, SK=s.shape[1], BNS=block[0], BKS=block[1], K_PER_SPLIT=k_per, ATOMIC=split > 1,
        BLOCK_N=block_n, BLOCK_K=block_k, PREFETCH=prefetch, num_warps=num_warps, num_stages=num_stages)
    return y.to(x.dtype)
