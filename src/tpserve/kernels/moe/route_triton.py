"""MoE routing, the expert-sorted layout and the sum of the k choices in one Triton kernel each (switch
`--moe-route-backend`).

The torch forms cost a decode step about 11 kernels per MoE layer for the router (sigmoid, bias, top-k,
gather, normalise, scale, two fp32 casts), about 20 for `align_by_expert` (counts, cumsums, argsort,
searchsorted, gathers) and 2 for the k-choice sum: ~33 launches for work that reads a
few KB. GLM-5.3-Flash has 42 MoE layers, so ~1,400 launches per decode step. Here:

- `route_topk`: one program per token: sigmoid of the fp32 logits, plus the correction bias, top-k by k
  rounds of argmax over the experts in registers, the chosen sigmoid scores normalised and scaled.
  Group-limited choice (n_group > 1) is not implemented here: the Router keeps torch for it (`route`
  wraps the router GEMM and this kernel).
- `align_by_expert_triton`: one program: expert counts by atomics on a scratch row, padded run ends by a
  cumsum over the experts, each block's expert by counting the run ends at or before it (a searchsorted),
  and each assignment's row by an atomic cursor per expert. Same layout as kernels/moe/align.py, except
  that the rows inside one expert's run come in no fixed order: the grouped kernels compute each row
  alone (its own dot products, the same K order), so the output does not depend on it.
- `combine_choices`: the k expert outputs of each token (fp32) summed and cast to the model dtype in one
  kernel (torch: a sum and a cast).

Floors: all read and write a few KB at decode; at batch 1 each is one launch, with the router GEMV 4
launches against ~33 (BENCHMARKS.md, fused MoE routing).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tpserve.kernels.launch import pdl_triton
from tpserve.kernels.moe.align import align_by_expert, max_blocks
from tpserve.kernels.moe.route import router_logits

ALIGN_CHUNK = 256
ALIGN_BLOCK_CHUNK = 16


@triton.jit
def _router_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, E, scaling, TOP_K: tl.constexpr, NORM: tl.constexpr,
                   E_PAD: tl.constexpr, K_PAD: tl.constexpr, PDL: tl.constexpr):
    pdl_triton.start(PDL)  # (kernels/launch/pdl_triton.py)
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_PAD)
    ok = e < E
    s = tl.sigmoid(tl.load(logits_ptr + t * E + e, mask=ok, other=0.0))
    c = tl.where(ok, s + tl.load(bias_ptr + e, mask=ok, other=0.0), float("-inf"))
    kk = tl.arange(0, K_PAD)
    wv = tl.zeros([K_PAD], dtype=tl.float32)
    iv = tl.zeros([K_PAD], dtype=tl.int64)
    for i in tl.static_range(TOP_K):
        m = tl.max(c, axis=0)
        # the first expert holding the max; a NaN row matches nothing: clamp, never index out of range
        idx = tl.minimum(tl.min(tl.where(c == m, e, E_PAD), axis=0), E - 1)
        wv = tl.where(kk == i, tl.sum(tl.where(e == idx, s, 0.0), axis=0), wv)
        iv = tl.where(kk == i, idx.to(tl.int64), iv)
        c = tl.where(e == idx, float("-inf"), c)
    if NORM:
        wv = wv / (tl.sum(wv, axis=0) + 1e-20)
    kok = kk < TOP_K
    tl.store(w_ptr + t * TOP_K + kk, wv * scaling, mask=kok)
    tl.store(ids_ptr + t * TOP_K + kk, iv, mask=kok)


def route_topk(logits: torch.Tensor, bias: torch.Tensor, top_k: int, norm: bool,
               scaling: float, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] fp32 (router GEMV) -> (weights [T, top_k] fp32, ids [T, top_k] int64), as
    model/moe.Router's torch form with n_group == 1 (the order of the k choices may differ). pdl: launched as a
    programmatic dependent of the kernel before (kernels/launch/pdl_triton.py)."""
    t, e = logits.shape
    logits = logits.float().contiguous()
    weights = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=logits.device)
    if t:
        _router_kernel[(t,)](logits, bias.float().contiguous(), weights, ids, e, float(scaling), TOP_K=top_k,
                             NORM=bool(norm), E_PAD=triton.next_power_of_2(e),
                             K_PAD=triton.next_power_of_2(top_k), num_warps=4, PDL=pdl, launch_pdl=pdl)
    return weights, ids


def route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int,
          norm: bool, scaling: float, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """moe/route.route's contract with one expert group: the router GEMM (route.router_logits), then
    `route_topk`."""
    if n_group != 1:
        raise ValueError(f"n_group: the Triton router takes one expert group, got {n_group} (route.route does)")
    return route_topk(router_logits(x, weight), bias, top_k, norm, scaling, pdl)


@triton.jit
def _align_kernel(ids_ptr, rows_ptr, block_expert_ptr, scratch_ptr, A, E, NB, BLOCK_M: tl.constexpr,
                  E_PAD: tl.constexpr, CHUNK: tl.constexpr, B_CHUNK: tl.constexpr):
    e = tl.arange(0, E_PAD)
    tl.store(scratch_ptr + e, tl.zeros([E_PAD], dtype=tl.int32))
    tl.debug_barrier()
    for a0 in range(0, A, CHUNK):  # counts per expert
        a = a0 + tl.arange(0, CHUNK)
        ok = a < A
        idv = tl.load(ids_ptr + a, mask=ok, other=0).to(tl.int32)
        tl.atomic_add(scratch_ptr + idv, tl.full([CHUNK], 1, tl.int32), mask=ok)
    tl.debug_barrier()
    counts = tl.load(scratch_ptr + e, cache_modifier=".cg")  # from L2, where the atomics landed
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    pad_start = pad_end - padded
    tl.debug_barrier()
    tl.store(scratch_ptr + e, pad_start)  # now each expert's next free row
    for r0 in range(0, NB * BLOCK_M, CHUNK):
        r = r0 + tl.arange(0, CHUNK)
        tl.store(rows_ptr + r, tl.full([CHUNK], -1, tl.int32), mask=r < NB * BLOCK_M)
    ends = tl.where(e < E, pad_end, 2147483647)
    for b0 in range(0, NB, B_CHUNK):  # block b's expert: the runs ending at or before its first row
        b = b0 + tl.arange(0, B_CHUNK)
        ex = tl.sum((ends[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, ex, mask=b < NB)
    tl.debug_barrier()
    for a0 in range(0, A, CHUNK):
        a = a0 + tl.arange(0, CHUNK)
        ok = a < A
        idv = tl.load(ids_ptr + a, mask=ok, other=0).to(tl.int32)
        pos = tl.atomic_add(scratch_ptr + idv, tl.full([CHUNK], 1, tl.int32), mask=ok)
        tl.store(rows_ptr + pos, a, mask=ok)


def align_by_expert_triton(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as kernels.moe_align.align_by_expert (rows within an expert's run unordered)."""
    flat = ids.reshape(-1).contiguous()
    a = flat.numel()
    nb = max_blocks(a, num_experts, block_m)
    rows = torch.empty(nb * block_m, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(nb, dtype=torch.int32, device=ids.device)
    e_pad = triton.next_power_of_2(num_experts)
    scratch = torch.empty(e_pad, dtype=torch.int32, device=ids.device)
    if nb:
        _align_kernel[(1,)](flat, rows, block_expert, scratch, a, num_experts, nb, BLOCK_M=block_m, E_PAD=e_pad,
                            CHUNK=ALIGN_CHUNK, B_CHUNK=ALIGN_BLOCK_CHUNK, num_warps=8)
    return rows, block_expert


def align(ids: torch.Tensor, num_experts: int, block_m: int, backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """The grouped expert kernels' layout: this file's one kernel ("triton") or the torch ops ("torch")."""
    if backend == "triton":
        return align_by_expert_triton(ids, num_experts, block_m)
    return align_by_expert(ids, num_experts, block_m)


@triton.jit
def _combine_kernel(y_ptr, out_ptr, D, TOP_K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = tl.arange(0, K_PAD)
    m = (j[:, None] < TOP_K) & (d[None, :] < D)
    y = tl.load(y_ptr + (t * TOP_K + j[:, None]) * D + d[None, :], mask=m, other=0.0)
    tl.store(out_ptr + t * D + d, tl.sum(y, axis=0).to(out_ptr.dtype.element_ty), mask=d < D)


def combine_choices(y: torch.Tensor, top_k: int, dtype: torch.dtype, backend: str = "torch") -> torch.Tensor:
    """y [T * top_k, D] fp32 (each token's k weighted expert outputs, token-major) -> [T, D] in dtype: the
    sum over the k choices in fp32, rounded once."""
    t, d = y.shape[0] // top_k, y.shape[1]
    if backend != "triton":
        return y.view(t, top_k, d).sum(dim=1).to(dtype)
    out = torch.empty(t, d, dtype=dtype, device=y.device)
    if t:
        block = min(512, triton.next_power_of_2(d))
        _combine_kernel[(t, triton.cdiv(d, block))](y, out, d, TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k),
                                                    BLOCK_D=block, num_warps=4)
    return out


@triton.jit
def combine_sorted_tile(y_ptr, inv_ptr, w_ptr, t, d, D, TOP_K: tl.constexpr, K_PAD: tl.constexpr):
    """Token t's combine at columns d (a BLOCK_D range), fp32: its k outputs read where they lie in the
    expert-sorted y (rows inv[t*k + j]), weighted and summed over j in one reduction. The one copy of this
    arithmetic: combine_sorted and the fused reduce-scatter (collectives/workspace_triton.py) both call it, so they
    agree bit for bit."""
    j = tl.arange(0, K_PAD)
    jm = j < TOP_K
    rows = tl.load(inv_ptr + t * TOP_K + j, mask=jm, other=0).to(tl.int64)
    w = tl.load(w_ptr + t * TOP_K + j, mask=jm, other=0.0)
    m = jm[:, None] & (d[None, :] < D)
    y = tl.load(y_ptr + rows[:, None] * D + d[None, :], mask=m, other=0.0).to(tl.float32)
    return tl.sum(y * w[:, None], axis=0)


@triton.jit
def _combine_sorted_kernel(y_ptr, inv_ptr, w_ptr, out_ptr, D, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                           BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    acc = combine_sorted_tile(y_ptr, inv_ptr, w_ptr, t, d, D, TOP_K, K_PAD)
    tl.store(out_ptr + t * D + d, acc.to(out_ptr.dtype.element_ty), mask=d < D)


COMBINE_NUM_WARPS = 4


def combine_block_d(d: int) -> int:
    """Columns per program of the combine (combine_sorted and the fused reduce-scatter alike: with
    COMBINE_NUM_WARPS, the same tile, so the same reduction order)."""
    return min(512, triton.next_power_of_2(d))


def combine_sorted(y: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The grouped MoE's combine (moe/ref.experts_grouped; moe/combine.py defines it): y [T * k, D] (expert
    outputs, row i belonging to choice order[i] of the token-major choices), weights [T, k] -> [T, D] in y.dtype:
    each token's k outputs read where they lie (the inverse of `order`), weighted and summed in fp32, rounded
    once; one read of y and one write of the output (an index_add in torch, with atomics, was a visible share
    of a long prefill)."""
    tk, d = y.shape
    t, k = weights.shape
    if tk != t * k or order.shape != (tk,) or not y.is_contiguous():
        raise ValueError(f"combine_sorted: y {tuple(y.shape)} (contiguous), order {tuple(order.shape)} and weights "
                         f"{tuple(weights.shape)} must agree")
    inv = torch.empty_like(order)
    inv[order] = torch.arange(tk, device=order.device)
    out = torch.empty(t, d, dtype=y.dtype, device=y.device)
    if t:
        block = combine_block_d(d)
        _combine_sorted_kernel[(t, triton.cdiv(d, block))](y, inv, weights.float().contiguous(), out, d, TOP_K=k,
                                                           K_PAD=triton.next_power_of_2(k), BLOCK_D=block,
                                                           num_warps=COMBINE_NUM_WARPS)
    return out
