"""Routed experts in torch: the loop over the used experts (the reference) and grouped_mm (16-bit, any size, no
host sync). quant/dispatch.py chooses among these and the Triton / CUDA experts; the expert-sorted layout of the
grouped kernels is align.py's.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from tpserve.kernels.linear.ref import clamped_swiglu
from tpserve.kernels.moe.combine import moe_combine


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
                    down: torch.Tensor, limit: float, combine: str = "torch",
                    swiglu: Callable = clamped_swiglu) -> torch.Tensor:
    """Same contract as experts_loop, through torch.nn.functional.grouped_mm: tokens sorted by expert
    once, two grouped GEMMs, no loop and no host sync (`experts_sorted`). The k choices of a token are
    summed in fp32 and rounded once (moe/combine.py): combine "triton" in one kernel reading the sorted
    outputs in place (route_triton.combine_sorted, cuda), "torch" by gathers in choice order (deterministic,
    unlike an index_add). `swiglu` as in experts_sorted."""
    y, order = experts_sorted(x, weights, ids, gate_up, down, limit, swiglu)
    return moe_combine(y, order, weights, backend="triton" if combine == "triton" else "torch")


def experts_sorted(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, limit: float,
                   swiglu: Callable = clamped_swiglu) -> tuple[torch.Tensor, torch.Tensor]:
    """The grouped experts before their combine: (y [T * k, D] in x.dtype, order [T * k]), row i of y the
    output of expert ids.flatten()[order[i]] for token order[i] // k (unweighted). `swiglu`: the clamped
    SwiGLU between the two GEMMs (the resolved `swiglu` op: with --act-backend triton one kernel instead of
    torch's four passes over [T * k, I])."""
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
    hidden = swiglu(gate, up, limit).to(x.dtype)
    y = F.grouped_mm(hidden, down.transpose(1, 2), offs=offs)
    return y, order
