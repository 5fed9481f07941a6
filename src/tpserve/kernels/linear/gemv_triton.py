"""Decode GEMMs on 16-bit weights (M <= 16 rows): y = x W^T in one launch (switch `--gemv-backend`).

At M <= 16 a linear layer only streams its weight (2 N K bytes; the FLOPs, 2 M N K, are nothing against it).
cuBLAS picks 64x8 / 128x8 tiles there, often split-K with a separate reduce kernel. Here each program owns
BLOCK_N output columns and reads their rows of W whole (K contiguous, 16-byte loads), no split-K, so there is
no reduce launch and no fp32 scratch: enough programs for every SM need N >= ~2048 (`fits`), the layers below
that stay on cuBLAS. M = 1 multiplies in fp32 and sums along K; 1 < M <= 16 runs tl.dot on a 16-row tile (fp32
accumulate). The tile shape is autotuned per (N, K, M tile) at the first call (the graph warm-up runs before
capture, so tuning never happens inside one). Against cuBLAS only the fp32 summation order differs
(tests/kernels/linear/test_gemv_triton.py bounds it). `--gemv-backend auto` takes it on CUDA (engine/setup.py);
against cuBLAS: BENCHMARKS.md, the Triton GEMV and merged linears.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tpserve.kernels.launch import pdl_triton

MAX_M = 16
MIN_N = 2048  # below: too few programs to stream at full bandwidth without split-K


def _configs():
    out = []
    for bn, bk, warps, stages in [(8, 512, 4, 4), (16, 256, 4, 4), (16, 512, 4, 3), (16, 1024, 8, 3),
                                  (32, 256, 4, 4), (32, 512, 8, 3), (64, 128, 4, 4), (64, 256, 8, 3)]:
        out.append(triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps, num_stages=stages))
    return out


def _prune(configs, named_args, **kwargs):
    if named_args.get("BLOCK_M", kwargs.get("BLOCK_M", 1)) > 1:  # tl.dot needs 16-wide tiles
        return [c for c in configs if c.kwargs["BLOCK_N"] >= 16 and c.kwargs["BLOCK_K"] <= 512] or configs[-1:]
    return configs


@triton.jit
def _tile(acc, x_ptr, w, k, k_ok, m, m_ok, stride_xm, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr):
    """acc + x[:, k] w^T for one K tile w [BLOCK_N, BLOCK_K] (already loaded)."""
    if BLOCK_M == 1:
        xk = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * xk[None, :], axis=1)[None, :]
    else:
        xa = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(xa, tl.trans(w), acc, input_precision=PRECISION)
    return acc


@triton.autotune(configs=_configs(), key=["N", "K", "BLOCK_M", "PDL"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = 0
    # programmatic dependent launch (kernels/launch/pdl_triton.py): the next kernel may launch now; at one row W's first
    # tile loads (weights: no kernel writes them) before the wait for the kernel before (x is its output)
    pdl_triton.release(PDL)
    if BLOCK_M > 1:
        pdl_triton.wait(PDL)  # (`gemv` launches these plainly: 1.4-1.5x slower at 8 rows with PDL)
    if PDL and BLOCK_M == 1:
        k = tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        pdl_triton.wait(PDL)
        acc = _tile(acc, x_ptr, w, k, k_ok, m, m_ok, stride_xm, PRECISION, BLOCK_M)
        k_lo = BLOCK_K
    for k0 in range(k_lo, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _tile(acc, x_ptr, w, k, k_ok, m, m_ok, stride_xm, PRECISION, BLOCK_M)
    tl.store(y_ptr + m[:, None].to(tl.int64) * stride_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the GEMV serves x @ w^T: 2-D x of 1..16 rows, w [N >= MIN_N, K] of x's dtype with unit-stride
    rows, on a GPU."""
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_M and x.is_cuda and w.dim() == 2 and w.dtype == x.dtype
            and w.shape[0] >= MIN_N and w.shape[1] == x.shape[1] and w.stride(1) == 1 and x.stride(1) == 1)


def gemv(x: torch.Tensor, w: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """x [M <= 16, K] @ w [N, K]^T -> [M, N] in x.dtype (F.linear without bias). pdl: launched as a programmatic
    dependent of the kernel before (sm_90+; launch/pdl_triton.py) at one row: W's first tile loads before that
    kernel ends (more rows launch plainly)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or not 0 < x.shape[0] <= MAX_M:
        raise ValueError(f"gemv: x {tuple(x.shape)} and w {tuple(w.shape)} must be [1..{MAX_M}, K] and [N, K]")
    if w.dtype != x.dtype or w.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(f"gemv: x ({x.dtype}) and w ({w.dtype}) must share a dtype and have unit-stride rows")
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = 1 if m == 1 else MAX_M
    # PDL at one row only: at more rows the PDL-compiled kernel ran slower, capped to one wave of blocks an SM too
    # (BENCHMARKS.md, programmatic dependent launch)
    pdl = pdl and m == 1
    _gemv_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
        x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", BLOCK_M=block_m, PDL=pdl, launch_pdl=pdl)
    return y
