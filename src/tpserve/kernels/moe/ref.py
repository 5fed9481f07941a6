"""Routed experts: the torch loop (reference), grouped_mm (bf16, any size, no host sync) and the
dispatch to the grouped Triton kernels. The expert-sorted layout lives in kernels/moe/align.py.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from tpserve.kernels.moe.combine import moe_combine


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit)."""
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


def experts_loop_fn(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, num_experts: int,
                    gate_up_of: Callable[[int], torch.Tensor], down_of: Callable[[int], torch.Tensor],
                    limit: float) -> torch.Tensor:
    """The reference: a loop over the used experts; gate_up_of(e) [2I, D], down_of(e) [D, I] give one
    expert's weights in x.dtype (dequantized for the quantized layouts)."""
    out = torch.zeros_like(x)
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    token_of = order // ids.shape[1]
    w_sorted = weights.reshape(-1)[order]
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        tok = token_of[start:start + n]
        gate, up = F.linear(x[tok], gate_up_of(expert)).chunk(2, dim=-1)
        y = F.linear(clamped_swiglu(gate, up, limit), down_of(expert))
        out.index_add_(0, tok, (y * w_sorted[start:start + n, None]).to(out.dtype))
        start += n
    return out


def experts_loop(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                 down: torch.Tensor, limit: float) -> torch.Tensor:
    """x [T, D]; weights/ids [T, k]; gate_up [E, 2I, D] (gate | up); down [E, D, I] -> [T, D] in x.dtype."""
    return experts_loop_fn(x, weights, ids, gate_up.shape[0], gate_up.__getitem__, down.__getitem__, limit)


def experts_grouped(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor, limit: float, combine: str = "torch", act: str = "torch") -> torch.Tensor:
    """Same contract as experts_loop, through torch.nn.functional.grouped_mm: tokens sorted by expert
    once, two grouped GEMMs, no loop and no host sync (`experts_sorted`). The k choices of a token are
    summed in fp32 and rounded once (collectives/fused.moe_combine): combine "triton" in one kernel reading the
    sorted outputs in place (kernels/moe/route_triton.combine_sorted, cuda), "torch" by gathers in choice
    order (deterministic, unlike an index_add). `act` as in experts_sorted."""
    y, order = experts_sorted(x, weights, ids, gate_up, down, limit, act)
    return moe_combine(y, order, weights, backend="triton" if combine == "triton" else "torch")


def experts_sorted(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, limit: float, act: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """The grouped experts before their combine: (y [T * k, D] in x.dtype, order [T * k]), row i of y the
    output of expert ids.flatten()[order[i]] for token order[i] // k (unweighted). `act` "triton" (the
    `--act-backend` switch): the clamped SwiGLU between the two GEMMs in one kernel (kernels/act_triton)
    instead of torch's four, each a pass over [T * k, I] (at 16k tokens and I 2048, 0.5 GB a pass)."""
    k = ids.shape[1]
    e = gate_up.shape[0]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(e, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    tok = order // k
    h = F.grouped_mm(x[tok], gate_up.transpose(1, 2), offs=offs)
    gate, up = h.chunk(2, dim=-1)
    if act == "triton":
        from tpserve.kernels.linear.act_triton import clamped_swiglu_triton

        hidden = clamped_swiglu_triton(gate, up, limit)
    else:
        hidden = clamped_swiglu(gate, up, limit).to(x.dtype)
    y = F.grouped_mm(hidden, down.transpose(1, 2), offs=offs)
    return y, order


def takes_grouped(x: torch.Tensor, backend: str, max_tokens: int) -> bool:
    """Whether `experts_forward` takes `experts_grouped` for x."""
    return (backend == "triton" and not 0 < x.shape[0] <= max_tokens
            and x.dtype in (torch.bfloat16, torch.float16))


def experts_forward(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor, limit: float, backend: str = "torch", max_tokens: int = 0,
                    route_backend: str = "torch", act: str = "torch") -> torch.Tensor:
    if backend == "triton":
        if 0 < x.shape[0] <= max_tokens:
            from tpserve.kernels.moe.grouped_triton import experts_triton

            return experts_triton(x, weights, ids, gate_up, down, limit, route_backend=route_backend)
        if takes_grouped(x, backend, max_tokens):  # large forwards on cuda: grouped_mm, no loop
            return experts_grouped(x, weights, ids, gate_up, down, limit, combine=route_backend, act=act)
    return experts_loop(x, weights, ids, gate_up, down, limit)
