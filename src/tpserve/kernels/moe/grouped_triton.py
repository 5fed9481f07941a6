"""Grouped expert GEMMs in Triton for small forwards (decode), with no host sync.

Assignments (token t, choice j) are sorted by expert and padded per expert to BLOCK_M rows
(align.py / route_triton.py: align). Kernel 1, per (block, I tile): gate and up tiles of
x[rows] @ W_gate_up[e]^T in two fp32 accumulators, then the clamped SwiGLU, into H [rows, I].
Kernel 2, per (block, D tile): H[rows] @ W_down[e]^T times the routing weight, into
Y [assignments, D] fp32; the k choices of a token are summed afterwards (fp32, one rounding).
D, INTER and top_k are compile-time constants (one compile per model shape and TP size).

At decode the chosen experts' weights are the bytes that count (FLOPs are negligible). The torch loop it
replaces costs ~7 launches per used expert plus a host sync per layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tpserve.kernels.moe.tiles_triton import block_rows, routed_store, swiglu_store
from tpserve.kernels.moe.route_triton import align, combine_choices

BLOCK_M = 16


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, h_ptr, rows_ptr, block_expert_ptr, num_experts, limit, stride_we,
                    top_k: tl.constexpr, D: tl.constexpr, INTER: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b)
    if e < num_experts:
        m, a, m_ok = block_rows(rows_ptr, b, BLOCK_M)
        tok = tl.where(m_ok, a // top_k, 0).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < INTER
        w = w_ptr + e.to(tl.int64) * stride_we
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < D
            xa = tl.load(x_ptr + tok[:, None] * D + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            wk = k_ok[:, None] & n_ok[None, :]
            wg = tl.load(w + n[None, :].to(tl.int64) * D + k[:, None], mask=wk, other=0.0)
            wu = tl.load(w + (INTER + n[None, :]).to(tl.int64) * D + k[:, None], mask=wk, other=0.0)
            acc_g = tl.dot(xa, wg, acc_g, input_precision=PRECISION)
            acc_u = tl.dot(xa, wu, acc_u, input_precision=PRECISION)
        swiglu_store(h_ptr, m, m_ok, n, n_ok, acc_g, acc_u, limit, INTER)


@triton.jit
def _down_kernel(h_ptr, w_ptr, y_ptr, rows_ptr, block_expert_ptr, route_ptr, num_experts, stride_we,
                 D: tl.constexpr, INTER: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b)
    if e < num_experts:
        m, a, m_ok = block_rows(rows_ptr, b, BLOCK_M)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < D
        w = w_ptr + e.to(tl.int64) * stride_we
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < INTER
            ha = tl.load(h_ptr + m[:, None].to(tl.int64) * INTER + k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                         other=0.0)
            wd = tl.load(w + n[None, :].to(tl.int64) * INTER + k[:, None], mask=k_ok[:, None] & n_ok[None, :],
                         other=0.0)
            acc = tl.dot(ha, wd, acc, input_precision=PRECISION)
        routed_store(y_ptr, route_ptr, a, m_ok, n, n_ok, acc, D)


def experts_triton(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, limit: float, block_n: int = 64, block_k: int = 64,
                   route_backend: str = "torch") -> torch.Tensor:
    """Same contract as kernels.moe.experts_loop; `route_backend` builds the expert-sorted layout."""
    t, top_k = ids.shape
    num_experts, two_i, d = gate_up.shape
    inter = two_i // 2
    x = x.contiguous()
    rows, block_expert = align(ids, num_experts, BLOCK_M, route_backend)
    nb = block_expert.numel()
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    h = torch.empty(nb * BLOCK_M, inter, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(nb, triton.cdiv(inter, block_n))](
        x, gate_up, h, rows, block_expert, num_experts, float(limit), gate_up.stride(0), top_k=top_k, D=d, INTER=inter,
        PRECISION=precision, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k)
    y = torch.empty(t * top_k, d, dtype=torch.float32, device=x.device)
    route = weights.reshape(-1).float().contiguous()
    _down_kernel[(nb, triton.cdiv(d, block_n))](
        h, down, y, rows, block_expert, route, num_experts, down.stride(0), D=d, INTER=inter,
        PRECISION=precision, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k)
    return combine_choices(y, top_k, x.dtype, route_backend)
