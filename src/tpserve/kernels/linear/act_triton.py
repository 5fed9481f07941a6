"""The clamped SwiGLU of the dense MLPs and shared experts in one Triton kernel (switch `--act-backend`).

silu(min(gate, limit)) * clamp(up, -limit, limit): in torch four launches (two clamps, SiLU, product),
each rounding to the model dtype. Here one: SiLU in fp32, rounded to the output dtype as torch's SiLU
rounds it, then the product of the two 16-bit values in fp32, rounded once (torch's 16-bit product does
the same), so the result differs from torch's only where exp rounds differently (an fp32 ulp before the
16-bit rounding). GLM-5.3-Flash runs it 45 times per step (3 dense MLPs, 42 shared experts): ~135
launches saved. Floors: reads 2 and writes 1 activations per token (a few KB at decode).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tpserve.kernels.launch import pdl_triton


@triton.jit
def _swiglu_kernel(g_ptr, stride_g, u_ptr, stride_u, out_ptr, N, limit, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_triton.start(PDL)  # (kernels/launch/pdl_triton.py)
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = n < N
    g = tl.minimum(tl.load(g_ptr + t * stride_g + n, mask=ok, other=0.0).to(tl.float32), limit)
    u = tl.load(u_ptr + t * stride_u + n, mask=ok, other=0.0)
    u = tl.minimum(tl.maximum(u, -limit), limit)
    act = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * N + n, (act.to(tl.float32) * u.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=ok)


def clamped_swiglu_triton(gate: torch.Tensor, up: torch.Tensor, limit: float, pdl: bool = False) -> torch.Tensor:
    """Same contract as kernels.moe.clamped_swiglu for 2-D gate, up [T, N] (rows may be strided). pdl: launched
    as a programmatic dependent of the kernel before (kernels/launch/pdl_triton.py; sm_90+)."""
    if gate.shape != up.shape or gate.dim() != 2 or gate.stride(1) != 1 or up.stride(1) != 1:
        raise ValueError(f"clamped_swiglu_triton: gate {tuple(gate.shape)} and up {tuple(up.shape)} must be "
                         "equal 2-D shapes with unit-stride rows")
    t, n = gate.shape
    out = torch.empty(t, n, dtype=gate.dtype, device=gate.device)
    if t and n:
        block = min(2048, triton.next_power_of_2(n))
        _swiglu_kernel[(t, triton.cdiv(n, block))](gate, gate.stride(0), up, up.stride(0), out, n, float(limit),
                                                    BLOCK=block, num_warps=4, PDL=pdl, launch_pdl=pdl)
    return out
