"""NVFP4 decode GEMVs in Triton (M <= 16 rows) beside the generic kernel of gemv_triton.py: the one-row kernel
(codes decoded two per 32-bit operation, FMAs, no dot) and the planes kernel (the four nibble planes decoded in the
tensor cores' register operand), and `w4a16_gemv`, which launches the one its arguments name (quant/dispatch.py
chooses for a call). nvfp4_tiled rearranges weights so that each of the planes kernel's tiles is one chunk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tpserve.kernels.quant.gemv_triton import gemv_rows, split_output, use_asm
from tpserve.kernels.quant.qtile_triton import F16_OUT_BIAS, OUT_BIAS, nvfp4_codes, nvfp4_planes


@triton.jit
def _nvfp4_row_kernel(x_ptr, w_ptr, s_ptr, s2_ptr, y_ptr, N, K: tl.constexpr, K_PER_SPLIT: tl.constexpr,
                      ATOMIC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr,
                      F16: tl.constexpr = True):
    """NVFP4 at M = 1 without the tensor cores: y[n] = sum over K of x[k] W[n, k]. The codes decoded two per
    32-bit operation with their block scale (qtile_triton.nvfp4_codes), then one FMA each into an fp32
    accumulator per code slot, summed over the slots once at the end. No dot, so no shared-memory staging,
    barrier or MMA wait in the loop (which kept the qtile GEMV's warps waiting at one row)."""
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
        # into k order instead, against one x tile, measured slower)
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
    MMA operand [BLOCK_N, BLOCK_K / 4], an *elementwise* function of the words (qtile_triton.nvfp4_planes), dotted
    with x at k = 4 i + j. Elementwise is the point: Triton then reads the words from shared memory in the
    MMA's register layout and decodes there (sm_90 SASS: 4.2 instructions a weight at 64 x 256, no bf16 tile
    stored and reloaded as qtile's join / reshape forms need, no byte permutes). x's tile [16, BLOCK_K] (M rows
    padded to 16) is read with k contiguous and split into its four planes in registers. Four warps or more on
    64-row tiles take wgmma, which waits after each dot (its register operand); fewer take mma.sync (both ran
    alike on an H200). TILED: weights from nvfp4_tiled (each step one contiguous chunk)."""
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


def w4a16_gemv(x: torch.Tensor, w: torch.Tensor, bscale: torch.Tensor, scale2_rows: torch.Tensor,
               block_n: int | None = None, block_k: int | None = None, num_warps: int = 4,
               num_stages: int | None = None, waves: int | None = None, fp32_decode: bool | None = None,
               qtile: bool = False, asm: bool | None = None, qtile_a: bool = True, row: bool | None = None,
               row_f16: bool = True, planes: bool | None = None, tiled: bool = False) -> torch.Tensor:
    """x [M <= 16, K] @ dequant(nvfp4 w [N, K/2], bscale [N, K/16], scale2_rows [N])^T -> [M, N]. The kernel:
    `row` (one row of x): _nvfp4_row_kernel, codes decoded two per 32-bit operation by qtile_triton.nvfp4_codes
    (to float16 with `row_f16`, else bf16) and FMAs, no dot; `planes`: _nvfp4_planes_kernel, any M, the four
    nibble planes decoded in the tensor cores' register operand (x bf16 or float32; block_k a multiple of 64),
    `tiled` with weights from nvfp4_tiled at (block_n, block_k); else gemv_triton's generic kernel: `qtile` decodes
    with qtile_triton.nvfp4_tile onto the tensor cores as their A operand (`qtile_a`) or B (x bf16 or float32: an
    fp16 x would round the decoded tile's small values), else per value (`fp32_decode`: the float32-bits decode at
    one row, gemv_triton's docstring). `asm`: the PTX decode of any of them (default: on CUDA when compiled; False
    gives the same bits in plain Triton, for checks). Left None, row / planes are the defaults for the rows (one
    row: row; more: planes unless x is fp16). Tile defaults, from bench/quant_decode_sweep.py on an H200
    (BENCHMARKS.md, quantized GEMV): row 16 x 512 (256 where K is not whole 512 tiles), 4 warps, one stage, K
    split over 4 waves; planes 64 x 256, 4 warps, 3 stages, split over 2 waves; generic 32 x 256, 3 stages, split
    over 4 waves."""
    if x.dim() != 2 or x.shape[0] > 16:
        raise ValueError(f"x: quantized GEMV takes [M <= 16, K], got {tuple(x.shape)}")
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
        split, k_per, y = split_output(x, n, k, block_n, block_k, (2 if planes else 4) if waves is None else waves)
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
    return gemv_rows(x, w, bscale.contiguous(), scale2_rows.float().contiguous(), 1, k, k // 16, 1, 16,
                     block_n or 32, block_k, num_warps, num_stages or 3, 4 if waves is None else waves,
                     fp32_decode and not qtile, qtile, asm, qtile_a)
