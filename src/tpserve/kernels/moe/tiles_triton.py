"""The parts the grouped expert kernels share (moe/grouped_triton.py on bf16 experts, quant/gemm_triton.py on FP8 /
NVFP4 ones): a block's rows of the expert-sorted layout, gate|up's clamped SwiGLU into H, and down's routed
rows into Y."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def block_rows(rows_ptr, b, BLOCK_M: tl.constexpr):
    """Rows m of block b, their assignments a (token * top_k + choice; -1 where padding) and m_ok (a >= 0)."""
    m = b * BLOCK_M + tl.arange(0, BLOCK_M)
    a = tl.load(rows_ptr + m)
    return m, a, a >= 0


@triton.jit
def swiglu_store(h_ptr, m, m_ok, n, n_ok, acc_g, acc_u, limit, INTER: tl.constexpr):
    """H[m, n] = silu(min(gate, limit)) * clamp(up, -limit, limit) of the fp32 tiles, in H's dtype."""
    g = tl.minimum(acc_g, limit)
    u = tl.minimum(tl.maximum(acc_u, -limit), limit)
    h = g * tl.sigmoid(g) * u
    tl.store(h_ptr + m[:, None].to(tl.int64) * INTER + n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def routed_store(y_ptr, route_ptr, a, m_ok, n, n_ok, acc, D: tl.constexpr):
    """Y[a, n] = acc * the assignment's routing weight (fp32 rows of Y, one per assignment)."""
    route = tl.load(route_ptr + tl.where(m_ok, a, 0), mask=m_ok, other=0.0)
    a64 = tl.where(m_ok, a, 0).to(tl.int64)
    tl.store(y_ptr + a64[:, None] * D + n[None, :], acc * route[:, None], mask=m_ok[:, None] & n_ok[None, :])
