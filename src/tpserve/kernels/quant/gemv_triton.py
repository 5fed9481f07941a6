"""Decode GEMMs on quantized weights (M <= 16 rows): y = x W^T, streaming W once at full width.

Floors (bytes / 4.3 TB/s on an H200): FP8 block-128 [N, K] = N K (1 + 4/128^2) bytes, 12288 x 4096
-> 11.7 us; NVFP4 = N K (1/2 + 1/16) bytes -> 6.6 us. The FLOPs (2 M N K, <= 1.6 GFLOP) are
negligible against 790 TFLOP/s, so only bandwidth matters: every program reads a [BLOCK_N, BLOCK_K]
tile of W as rows with K contiguous (16-byte vector loads, coalesced), K is split over programs
so that a single row still spreads over every SM, and partial sums meet in fp32 atomics.

FP8 (w float8_e4m3fn [N, K], fp32 block scales s [ceil(N/BNS), K/BKS]): a tile never crosses a
scale block (BKS % BLOCK_K == 0), so the raw e4m3 values (exact in 16 bits) are dotted and the
tile's one scale per row multiplies the fp32 partial sum.
NVFP4 (w uint8 [N, K/2], low nibble = even k; s float8_e4m3fn [N, K/16]; s2 float32 per row): an
e2m1 code c becomes float16 bits ((c & 8) << 12) | ((c & 7) << 9), which is exactly its value
times 2^-14 (subnormals included), so decoding is three integer ops and a bitcast; the 2^14
rides on the row's global scale. At M = 1 the 16-element groups are summed first and scaled once
per group; at M > 1 the tile is scaled and the rows go through tl.dot.
At M = 1 the decode is ALU work per weight (the bytes are few), so `fp32_decode` offers a shorter
one: the code's bits placed straight into float32, ((c & 8) << 28) | ((c & 7) << 22), which is its
value times 2^-126 (the code 0.5 a float32 subnormal), against activations pre-scaled by 2^64 (exact;
products land near 2^-62 times their value, far inside the normal range), the 2^62 again on the
row's global scale: no 16-bit conversion per weight. Right only where the GPU keeps float32
subnormals (Triton does not flush them by default); bench/quant_kernels.py checks every config's
answer before timing it, so a flushing GPU shows the variant as WRONG, never as the fastest.
`qtile` (either format, any M): the tile decoded by kernels/quant/qtile_triton.py, two values per 32-bit operation,
and multiplied on the tensor cores, as their A operand (W @ X^T, the activations in the tile's pair
order) or B; the FP8 block scale or the NVFP4 global scale on the fp32 partial sums.
With one K split (waves = 0) a program runs the whole K and stores y in x's dtype: no zero fill,
atomics or cast kernel around the launch.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tpserve.kernels.quant import gemv_cuda as mma_gemv
from tpserve.kernels.quant.qtile_triton import (F16_OUT_BIAS, OUT_BIAS, fp8_pair_order, fp8_tile, nvfp4_codes, nvfp4_planes,
                                   nvfp4_tile, pair_order)

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


@triton.jit
def _nvfp4_row_kernel(x_ptr, w_ptr, s_ptr, s2_ptr, y_ptr, N, K: tl.constexpr, K_PER_SPLIT: tl.constexpr,
                      ATOMIC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr,
                      F16: tl.constexpr = True):
    """NVFP4 at M = 1 without the tensor cores: y[n] = sum over K of x[k] W[n, k]. The codes decoded two per
    32-bit operation with their block scale (qtile.nvfp4_codes), then one FMA each into an fp32 accumulator
    per code slot, summed over the slots once at the end. No dot, so no shared-memory staging, barrier or
    MMA wait in the loop (the qtile GEMV at one row kept one warp per scheduler waiting on those)."""
    G: tl.constexpr = BLOCK_K // 16
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    n64 = n.to(tl.int64)
    k_start = tl.program_id(1) * K_PER_SPLIT
    acc = tl.zeros((BLOCK_N, G, 2, 2), dtype=tl.float32)
    for kk in range(0, K_PER_SPLIT, BLOCK_K):
        k0 = k_start + kk
        o0, o1, o2, o3 = nvfp4_codes(w_ptr, s_ptr, n64, n_ok, k0, K, BLOCK_N, BLOCK_K, ASM, F16)
        # x at k = 16 g + 8 p + 4 q + 2 a + b, split to meet code j = 2 a + b of word 2 p + q (joining the codes
        # into k order instead against one x tile measured slower on the H200: 22.5 against 16.9 us)
        k = k0 + tl.arange(0, BLOCK_K)
        xs = tl.reshape(tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32), (G, 2, 2, 2, 2))
        xa0, xa1 = tl.split(xs)
        x0, x2 = tl.split(xa0)
        x1, x3 = tl.split(xa1)
        acc += o0.to(tl.float32) * x0[None]
        acc += o1.to(tl.float32) * x1[None]
        acc += o2.to(tl.float32) * x2[None]
        acc += o3.to(tl.float32) * x3[None]
    y = tl.sum(tl.reshape(acc, (BLOCK_N, BLOCK_K // 4)), axis=1)
    y *= tl.load(s2_ptr + n64, mask=n_ok, other=0.0) * (F16_OUT_BIAS if F16 else OUT_BIAS)
    if ATOMIC:
        tl.atomic_add(y_ptr + n, y, mask=n_ok)
    else:
        tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _nvfp4_planes_kernel(x_ptr, w_ptr, s_ptr, s2_ptr, y_ptr, M, N, K: tl.constexpr, K_PER_SPLIT: tl.constexpr,
                         ATOMIC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr,
                         X32: tl.constexpr, TILED: tl.constexpr = False):
    """NVFP4, M <= 16, on the tensor cores with the decode in their register operand. The tile is read as 16-bit
    words [BLOCK_N, BLOCK_K / 4] (code j of word i is k = 4 i + j), and each of the four nibble planes is one
    MMA operand [BLOCK_N, BLOCK_K / 4], an *elementwise* function of the words (qtile.nvfp4_planes), dotted
    with x at k = 4 i + j. Elementwise is the point: Triton then reads the words from shared memory in the
    MMA's register layout and decodes there (sm_90 SASS: 4.2 instructions a weight at 64 x 256, no bf16 tile
    stored and reloaded as qtile's join / reshape forms need, no byte permutes). x's tile [16, BLOCK_K] (M rows
    padded to 16) is read with k contiguous and split into its four planes in registers. Four warps or more on
    64-row tiles take wgmma, which waits after each dot (its register operand); fewer take mma.sync. On the
    H200 both ran at ~19 us on 12288 x 4096 at 1-16 rows (BENCHMARKS.md, twenty-first session): the default at
    2-16 rows, not at one. TILED: weights from nvfp4_tiled (each step one contiguous chunk)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    n64 = n.to(tl.int64)
    m = tl.arange(0, 16)
    m_ok = m < M
    k_start = tl.program_id(1) * K_PER_SPLIT
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for kk in range(0, K_PER_SPLIT, BLOCK_K):
        k0 = k_start + kk
        if TILED:  # tiled weights: [N / BLOCK_N, K / BLOCK_K, BLOCK_N, BLOCK_K / 4] words and [..., BLOCK_K / 16]
            # scales, each step one contiguous chunk (N, K whole tiles)
            t = tl.program_id(0).to(tl.int64) * (K // BLOCK_K) + k0 // BLOCK_K
            r = tl.arange(0, BLOCK_N)[:, None]
            words = tl.load(w_ptr + t * (BLOCK_N * BLOCK_K // 4) + r * (BLOCK_K // 4)
                            + tl.arange(0, BLOCK_K // 4)[None, :])
            sc = tl.load(s_ptr + t * (BLOCK_N * BLOCK_K // 16) + r * (BLOCK_K // 16)
                         + tl.arange(0, BLOCK_K // 16)[None, :]).to(tl.float32)
        else:
            i = k0 // 4 + tl.arange(0, BLOCK_K // 4)
            g = k0 // 16 + tl.arange(0, BLOCK_K // 16)
            words = tl.load(w_ptr + n64[:, None] * (K // 4) + i[None, :],
                            mask=n_ok[:, None] & (i < K // 4)[None, :], other=0)
            sc = tl.load(s_ptr + n64[:, None] * (K // 16) + g[None, :], mask=n_ok[:, None] & (g < K // 16)[None, :],
                         other=0.0).to(tl.float32)
        sc = tl.reshape(tl.broadcast_to(sc[:, :, None], (BLOCK_N, BLOCK_K // 16, 4)), (BLOCK_N, BLOCK_K // 4))
        o0, o1, o2, o3 = nvfp4_planes(words, sc, ASM)
        # x's tile read once, k contiguous (16-byte loads), its four planes split out in registers
        k = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + m[:, None] * K + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
        xt = tl.permute(tl.reshape(xt, (16, BLOCK_K // 4, 2, 2)), (1, 0, 3, 2))  # [i, m, b, a]: k = 4 i + 2 a + b
        xa0, xa1 = tl.split(xt)
        x0, x1 = tl.split(xa0)
        x2, x3 = tl.split(xa1)
        if X32:  # float32 x: the planes (exact in bf16) widened, full-precision products
            acc = tl.dot(o0.to(tl.float32), x0, acc, input_precision="ieee")
            acc = tl.dot(o1.to(tl.float32), x1, acc, input_precision="ieee")
            acc = tl.dot(o2.to(tl.float32), x2, acc, input_precision="ieee")
            acc = tl.dot(o3.to(tl.float32), x3, acc, input_precision="ieee")
        else:
            acc = tl.dot(o0, x0, acc)
            acc = tl.dot(o1, x1, acc)
            acc = tl.dot(o2, x2, acc)
            acc = tl.dot(o3, x3, acc)
    acc *= (tl.load(s2_ptr + n64, mask=n_ok, other=0.0) * OUT_BIAS)[:, None]
    yp = y_ptr + m[None, :] * N + n[:, None]
    ym = n_ok[:, None] & m_ok[None, :]
    if ATOMIC:
        tl.atomic_add(yp, acc, mask=ym)
    else:
        tl.store(yp, acc.to(y_ptr.dtype.element_ty), mask=ym)


def nvfp4_tiled(w: torch.Tensor, bscale: torch.Tensor, block_n: int, block_k: int):
    """NVFP4 weights (uint8 [N, K/2], e4m3 [N, K/16]) rearranged so that each (block_n x block_k) tile of the planes
    kernel is one contiguous chunk: words int16 [N / block_n, K / block_k, block_n, block_k / 4] and scales
    [..., block_n, block_k / 16] (N and K whole tiles)."""
    n, k = w.shape[0], w.shape[1] * 2
    if n % block_n or k % block_k:
        raise ValueError(f"nvfp4_tiled: N {n} and K {k} must be whole ({block_n}, {block_k}) tiles")
    words = w.contiguous().view(torch.int16).view(n // block_n, block_n, k // block_k, block_k // 4)
    scales = bscale.contiguous().view(n // block_n, block_n, k // block_k, block_k // 16)
    return words.transpose(1, 2).contiguous(), scales.transpose(1, 2).contiguous()


def split_k(n: int, k: int, block_n: int, block_k: int, waves: int = 4) -> tuple[int, int]:
    """-> (K splits, K per split, a whole number of K tiles) so that the (N tile, K split) programs
    fill the SMs `waves` times (here and in quant_triton's tiled kernel at small M); waves = 0: one
    split (each program runs the whole K and stores its output: no zero fill, atomics or cast)."""
    tiles = triton.cdiv(n, block_n)
    split = 1 if waves == 0 else max(1, min(triton.cdiv(k, block_k), triton.cdiv(waves * SMS, tiles)))
    k_per = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    return triton.cdiv(k, k_per), k_per


def _split_output(x: torch.Tensor, n: int, k: int, block_n: int, block_k: int, waves: int):
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


def _launch(x, w, s, s2, fmt: int, k: int, sk: int, bns: int, bks: int, block_n: int, block_k: int,
            num_warps: int, num_stages: int, waves: int, decode32: bool = False, qtile: bool = False,
            asm: bool | None = None, qa: bool = True) -> torch.Tensor:
    m, n = x.shape[0], w.shape[0]
    if m > 16:
        raise ValueError(f"x: quantized GEMV takes at most 16 rows, got {m}")
    x = x.contiguous()
    block_m = 1 if m == 1 and not qtile else 16
    split, k_per, y = _split_output(x, n, k, block_n, block_k, waves)
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
               prefetch: bool = False, mma: bool | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M <= 16, K] @ dequant(w fp8 [N, K], s [ceil(N/bn), K/bk])^T -> [M, N] in x.dtype. `qtile`: the
    weight tile decoded by qtile.fp8_tile on the tensor cores (any M; x bf16 or float32), as their A
    operand (W @ X^T, `qtile_a`) or B, instead of FMAs (M = 1) or a per-value conversion; `asm` as in
    w4a16_gemv. At M = 1 without qtile (_fp8_row_kernel) block_k may also be a multiple of the scale
    block, and `prefetch` loads the next K tile before this one's arithmetic. Defaults, from the H200
    sweeps of bench/quant_decode_sweep.py (BENCHMARKS.md, eighteenth and nineteenth sessions): at one row
    the row kernel with 4096-wide K tiles where K is a multiple of 4096, 4 rows on 8 warps (12288 x 4096:
    13.9 us, 84% of the floor) or, where K >= 8192, 8 rows on 4 warps (4096 x 12288: 15.3 us, 77%); else
    16-row tiles on 8 warps, 2048 wide and one K split where K >= 8192, 512 wide (or the widest of 256 / 128
    that K and the scale block allow) and split only below 2 waves of SMs; at 2-16 rows (bf16 / fp32 x)
    qtile as the B operand, 32 x 128 tiles, 4 warps, 4 stages, split over 2 waves (20.3 / 23.6 us against
    25.7 / 26.2 for the per-value path); an fp16 x takes the per-value path (32 x 128, split over 4 waves).
    `mma`: the CUDA kernel of kernels/quant/gemv_cuda.py (bf16 x, 1-8 rows, 128-wide K scale blocks); by default at 2-8
    rows where it can run and no Triton tile is asked for (H200: BENCHMARKS.md, twenty-third session), and at one
    row too under `pdl` (that kernel launched as a programmatic dependent of the kernel before, mma_gemv.fp8_gemv:
    13.3 / 14.0 us on 12288 x 4096 / 4096 x 12288 in a chain of dependents, against 13.7 / 14.7 for the Triton row
    kernel launched plainly; twenty-seventh session)."""
    tiles = (block_n, block_k, num_warps, num_stages, waves, qtile)
    if mma is None:
        mma = (2 <= x.shape[0] or pdl) and all(t is None for t in tiles) and mma_gemv.usable(x, block)
    if mma:
        return mma_gemv.fp8_gemv(x, w, s, block, pdl=pdl)
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
        return _launch(x, w, s.contiguous(), s, 0, w.shape[1], s.shape[1], block[0], block[1], block_n, block_k,
                       num_warps, num_stages, waves, qtile=qtile, asm=asm, qa=qtile_a)
    n, k = w.shape
    x, s = x.contiguous(), s.contiguous()
    split, k_per, y = _split_output(x, n, k, block_n, block_k, waves)
    _fp8_row_kernel[(triton.cdiv(n, block_n), split)](
        x, w, s, y, n, K=k, SK=s.shape[1], BNS=block[0], BKS=block[1], K_PER_SPLIT=k_per, ATOMIC=split > 1,
        BLOCK_N=block_n, BLOCK_K=block_k, PREFETCH=prefetch, num_warps=num_warps, num_stages=num_stages)
    return y.to(x.dtype)


def w4a16_gemv(x: torch.Tensor, w: torch.Tensor, bscale: torch.Tensor, scale2_rows: torch.Tensor,
               block_n: int | None = None, block_k: int | None = None, num_warps: int = 4,
               num_stages: int | None = None, waves: int | None = None, fp32_decode: bool | None = None,
               qtile: bool = False, asm: bool | None = None, qtile_a: bool = True, row: bool | None = None,
               row_f16: bool = True, planes: bool | None = None, tiled: bool = False,
               mma: bool | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M <= 16, K] @ dequant(nvfp4 w [N, K/2], bscale [N, K/16], scale2_rows [N])^T -> [M, N].
    `row` (one row of x): _nvfp4_row_kernel, the codes decoded two per 32-bit operation by qtile.nvfp4_codes
    (to float16 with `row_f16`, else bf16) and FMAs, no dot. `qtile`: decode with qtile.nvfp4_tile and
    multiply on the tensor cores, any M, the tile as their A operand (`qtile_a`) or B; x bf16 or float32 (an
    fp16 x would round the decoded tile's small values); `planes`: _nvfp4_planes_kernel, any M, the four nibble
    planes decoded in the tensor cores' register operand (x bf16 or float32; block_k a multiple of 64), `tiled`
    with weights from nvfp4_tiled at (block_n, block_k); `asm`: the PTX decode of any of them (default: on CUDA
    when compiled; False gives the same bits in plain Triton, for checks). `fp32_decode`: the float32-bits
    decode at M = 1 (module docstring). Defaults, from the H200 sweeps (BENCHMARKS.md, nineteenth session):
    at one row the one-row kernel with the float16 decode, 16 x 512 tiles (256 where K is not a multiple of
    512), 4 warps, one stage, K split where the row tiles are fewer than 4 waves of SMs (12288 x 4096: 16.7 us,
    40% of its floor, against 18.4 for qtile B and 21.7 for the float32-bits decode; 4096 x 12288: 20.0 us,
    33%, against 25.4 and 20.9; unsplit there 33.9 us); at 2-16 rows (twenty-first session) the planes kernel,
    64 x 256 tiles, 4 warps, 3 stages, K split over 2 waves (12288 x 4096: 19.9 / 20.5 us at 8 / 16 rows against
    58.9 / 87.6 for the per-value decode, the default before; 4096 x 12288: 22.5 / 23.2 against 59.0 / 87.1);
    an fp16 x at 2-16 rows the per-value decode, 32 x 256 tiles, 3 stages, K split over 4 waves.
    `mma`: the CUDA kernels (bf16 x, K a multiple of 256): at one row kernels/quant/nvfp4_m1_cuda.py, at 2-8 rows
    kernels/quant/gemv_cuda.py; by default wherever they can run and no Triton kernel, tile or decode is asked for (H200:
    BENCHMARKS.md, twenty-third and twenty-fourth sessions: one row 12.2 / 12.6 us against mma_gemv's 13.6 /
    16.5 on 12288 x 4096 / 4096 x 12288). `pdl`: mma_gemv at 2-8 rows launched as a programmatic dependent of the
    kernel before (the one-row kernel launches plainly)."""
    if x.dim() != 2 or x.shape[0] > 16:
        raise ValueError(f"x: quantized GEMV takes [M <= 16, K], got {tuple(x.shape)}")
    if mma is None:
        asked = (block_n, block_k, num_stages, waves, fp32_decode, row, planes)
        mma = not (qtile or tiled) and all(a is None for a in asked) and mma_gemv.usable(x)
    if mma:
        if x.shape[0] == 1:
            from tpserve.kernels.quant import nvfp4_m1_cuda as nvfp4_m1

            return nvfp4_m1.gemv(x, w, bscale, scale2_rows)
        return mma_gemv.nvfp4_gemv(x, w, bscale, scale2_rows, pdl=pdl)
    if tiled:  # nvfp4_tiled's layout, for the planes kernel at its (block_n, block_k)
        if not planes or w.dim() != 4 or (block_n, block_k) != (w.shape[2], w.shape[3] * 4):
            raise ValueError(f"tiled: the planes kernel's weights from nvfp4_tiled at (block_n, block_k); got "
                             f"{tuple(w.shape)} for ({block_n}, {block_k}), planes={planes}")
        k = w.shape[1] * block_k
    else:
        k = w.shape[1] * 2
    one = x.shape[0] == 1
    if planes is None:  # the default at 2-16 rows where it applies (x bf16 / float32, no other kernel or decode asked)
        planes = (not one and not qtile and not row and fp32_decode is None and x.dtype != torch.float16
                  and (block_k or 256) % 64 == 0 and k % (block_k or 256) == 0)
    if row is None:
        row = one and not qtile and not planes and not fp32_decode
    if row and not one:
        raise ValueError(f"row: the one-row kernel takes one row of x, got {x.shape[0]}")
    if sum(bool(f) for f in (row, qtile, planes)) > 1:
        raise ValueError("row / qtile / planes: three different kernels; ask for one of them")
    if planes or qtile:
        if x.dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"{'planes' if planes else 'qtile'}: takes a bf16 or float32 x, got {x.dtype}")
    if planes and (block_k or 256) % 64:
        raise ValueError(f"block_k: the planes kernel takes a multiple of 64, got {block_k}")
    if block_k is None:
        block_k = 512 if one and not planes and k % 512 == 0 else 256
    if k % block_k or block_k % 32:
        raise ValueError(f"block_k: {block_k} must be a multiple of 32 dividing K {k}")
    if row or planes:
        n = w.shape[0] * (block_n if tiled else 1)
        block_n = block_n or (64 if planes else 16)
        split, k_per, y = _split_output(x, n, k, block_n, block_k, (2 if planes else 4) if waves is None else waves)
        args = (x.contiguous(), w.view(torch.int16), bscale.contiguous(), scale2_rows.float().contiguous(), y)
        if planes:
            _nvfp4_planes_kernel[(triton.cdiv(n, block_n), split)](
                *args, x.shape[0], n, K=k, K_PER_SPLIT=k_per, ATOMIC=split > 1, BLOCK_N=block_n, BLOCK_K=block_k,
                ASM=use_asm(x, asm), X32=x.dtype == torch.float32, TILED=tiled, num_warps=num_warps,
                num_stages=num_stages or 3)
        else:
            _nvfp4_row_kernel[(triton.cdiv(n, block_n), split)](
                *args, n, K=k, K_PER_SPLIT=k_per, ATOMIC=split > 1, BLOCK_N=block_n, BLOCK_K=block_k,
                ASM=use_asm(x, asm), F16=row_f16, num_warps=num_warps, num_stages=num_stages or 1)
        return y.to(x.dtype)
    if fp32_decode is None:
        fp32_decode = one
    return _launch(x, w, bscale.contiguous(), scale2_rows.float().contiguous(), 1, k, k // 16, 1, 16, block_n or 32,
                   block_k, num_warps, num_stages or 3, 4 if waves is None else waves, fp32_decode and not qtile,
                   qtile, asm, qtile_a)
