"""Decode GEMMs on 16-bit weights (M <= 16 rows): y = x W^T in one launch (switch `--gemv-backend`).

At M <= 16 a linear layer only streams its weight: W [N, K] bf16 is 2 N K bytes, so 4096 x 4096
-> 33.5 MB -> 7.8 us at 4.3 TB/s, 12288 x 4096 -> 23.4 us; the FLOPs (2 M N K) are nothing against
790 TFLOP/s. cuBLAS picks 64x8 / 128x8 tiles there, often split-K with a separate reduce kernel.
Here each program owns BLOCK_N output columns and reads their rows of W whole (K contiguous, 16-byte
loads), no split-K, so there is no reduce launch and no fp32 scratch: enough programs for every SM
need N >= ~2048 (`fits`), the layers below that stay on cuBLAS. M = 1 multiplies in fp32 and sums
along K; 1 < M <= 16 runs tl.dot on a 16-row tile (fp32 accumulate). The tile shape is autotuned per
(N, K, M tile) at the first call (the graph warm-up runs before capture, so tuning never happens
inside one). Against cuBLAS only the fp32 summation order differs (tests/kernels/test_gemv_triton.py
bounds it).

Measured on an H200 (`bench/gemv_kernels.py`, weights out of L2; BENCHMARKS.md, thirteenth session): the
real-width KKKM model's dense linears at M = 1 take 399.1 us per step here against cuBLAS's 420.1 us
(floor 290.7 us); 0.89-0.99x of cuBLAS at M = 1, up to 1.15x slower at M = 4-16 on 4096 x 2048 and
32768 x 512. In the engine it gained nothing (decode batch 1: 1.841 ms against 1.784 / 1.795 ms with
cuBLAS before and after), so `--gemv-backend auto` stays on cuBLAS.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tpserve.kernels import pdl_triton

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
    # programmatic dependent launch (kernels/pdl_triton.py): the next kernel may launch now; at one row W's first
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


@triton.jit
def _gemv_split_kernel(x_ptr, w_ptr, part_ptr, N, K, K_PER, stride_wn, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """One row of x against BLOCK_N rows of W over one K_PER-wide slice of K (program axis 1): fp32 partial sums
    into part [slices, N]."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    k_lo = tl.program_id(1) * K_PER
    k_hi = tl.minimum(k_lo + K_PER, K)
    pdl_triton.release(PDL)
    k = k_lo + tl.arange(0, BLOCK_K)  # the first tile loads before the wait (weights: no kernel writes them)
    k_ok = k < k_hi
    w = tl.load(rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    pdl_triton.wait(PDL)
    acc = tl.sum(w.to(tl.float32) * tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)[None, :], axis=1)
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < k_hi
        w = tl.load(rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)[None, :], axis=1)
    tl.store(part_ptr + tl.program_id(1).to(tl.int64) * N + n, acc, mask=n_ok)


@triton.jit
def _sum_slices_kernel(part_ptr, y_ptr, N, S, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """y[n] = sum over the slices s = 0, 1, ... of part[s, n] (fp32, in that order), in y's dtype."""
    pdl_triton.start(PDL)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = n < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(S):
        acc += tl.load(part_ptr + s * N + n, mask=ok, other=0.0)
    tl.store(y_ptr + n, acc.to(y_ptr.dtype.element_ty), mask=ok)


def split_plan(n: int, k: int, sms: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, K_PER, slices) of `gemv_split` for W [n, k] on `sms` SMs: row tiles of up to 32 rows,
    K cut into slices (whole 256-wide tiles) until there are about two programs an SM."""
    block_n, block_k = min(32, triton.next_power_of_2(max(n, 1))), 256
    tiles = triton.cdiv(n, block_n)
    want = max(1, min(triton.cdiv(k, block_k), triton.cdiv(2 * sms, tiles)))
    k_per = triton.cdiv(triton.cdiv(k, want), block_k) * block_k
    return block_n, block_k, k_per, triton.cdiv(k, k_per)


def gemv_split(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype | None = None,
               pdl: bool = False) -> torch.Tensor:
    """One row: x [1, K] @ w [N, K]^T -> [1, N] in out_dtype (default x's), for the few-output linears `gemv`
    cannot spread over the SMs (N < MIN_N: the KDA f_a | g_a | b projections, the router, the mHC projection):
    K is cut into slices, each program summing one row tile over one slice (fp32), then a second kernel sums the
    slices in order (deterministic; no atomics, no zero fill). x and w may differ in dtype (the mHC projection: a
    float32 x against float32 w; bf16 against bf16 elsewhere). pdl: both kernels launched as programmatic
    dependents (kernels/pdl_triton.py), the first loading its first W tile before its wait."""
    if x.dim() != 2 or x.shape[0] != 1 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"gemv_split: x {tuple(x.shape)} and w {tuple(w.shape)} must be [1, K] and [N, K]")
    if w.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError("gemv_split: x and w must have unit-stride rows")
    n, k = w.shape
    y = torch.empty(1, n, dtype=out_dtype or x.dtype, device=x.device)
    if n == 0:
        return y
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    block_n, block_k, k_per, slices = split_plan(n, k, sms)
    part = torch.empty(slices, n, dtype=torch.float32, device=x.device)
    _gemv_split_kernel[(triton.cdiv(n, block_n), slices)](x, w, part, n, k, k_per, w.stride(0), BLOCK_N=block_n,
                                                          BLOCK_K=block_k, PDL=pdl, num_warps=4, launch_pdl=pdl)
    block = min(1024, triton.next_power_of_2(n))
    _sum_slices_kernel[(triton.cdiv(n, block),)](part, y, n, slices, BLOCK=block, PDL=pdl, num_warps=4,
                                                 launch_pdl=pdl)
    return y


def fits_split(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `gemv_split` serves x @ w^T where `fits` does not: one row of x, w [1 <= N < MIN_N, K] with unit-stride
    rows, on a GPU."""
    return (x.dim() == 2 and x.shape[0] == 1 and x.is_cuda and w.dim() == 2 and 0 < w.shape[0] < MIN_N
            and w.shape[1] == x.shape[1] and w.stride(1) == 1 and x.stride(1) == 1)


def fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the GEMV serves x @ w^T: 2-D x of 1..16 rows, w [N >= MIN_N, K] of x's dtype with unit-stride
    rows, on a GPU."""
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_M and x.is_cuda and w.dim() == 2 and w.dtype == x.dtype
            and w.shape[0] >= MIN_N and w.shape[1] == x.shape[1] and w.stride(1) == 1 and x.stride(1) == 1)


def gemv(x: torch.Tensor, w: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """x [M <= 16, K] @ w [N, K]^T -> [M, N] in x.dtype (F.linear without bias). pdl: launched as a programmatic
    dependent of the kernel before (sm_90+; kernels/pdl_triton.py) at one row: W's first tile loads before that
    kernel ends (more rows launch plainly)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or not 0 < x.shape[0] <= MAX_M:
        raise ValueError(f"gemv: x {tuple(x.shape)} and w {tuple(w.shape)} must be [1..{MAX_M}, K] and [N, K]")
    if w.dtype != x.dtype or w.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(f"gemv: x ({x.dtype}) and w ({w.dtype}) must share a dtype and have unit-stride rows")
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = 1 if m == 1 else MAX_M
    # PDL at one row only: at 8 rows the PDL-compiled kernel ran a 32-GEMV chain 1.40x slower (the first tile
    # hoisted or not; BENCHMARKS.md, twenty-sixth session), and the engine gained nothing at batch 2 / 8
    pdl = pdl and m == 1
    _gemv_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
        x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", BLOCK_M=block_m, PDL=pdl, launch_pdl=pdl)
    return y
