"""Routed experts: the torch loop (reference) and the layout the grouped Triton kernels need.

`align_by_expert` sorts the (token, choice) assignments by expert and pads each expert's run to a
multiple of `block_m` rows, with no host sync: the number of blocks is bounded from the shapes
alone (sum over used experts of ceil(count / block_m) <= assignments / block_m + used experts),
blocks past the end are marked with expert id E and skipped by the kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tpserve.model.layers import clamped_swiglu


def experts_loop(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                 down: torch.Tensor, limit: float) -> torch.Tensor:
    """x [T, D]; weights/ids [T, k]; gate_up [E, 2I, D] (gate | up); down [E, D, I] -> [T, D] in x.dtype."""
    out = torch.zeros_like(x)
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=gate_up.shape[0]).tolist()
    token_of = order // ids.shape[1]
    w_sorted = weights.reshape(-1)[order]
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        tok = token_of[start:start + n]
        gate, up = F.linear(x[tok], gate_up[expert]).chunk(2, dim=-1)
        y = F.linear(clamped_swiglu(gate, up, limit), down[expert])
        out.index_add_(0, tok, (y * w_sorted[start:start + n, None]).to(out.dtype))
        start += n
    return out


def max_blocks(assignments: int, num_experts: int, block_m: int) -> int:
    return -(-assignments // block_m) + min(num_experts, assignments)


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] -> (rows [B * block_m] int32: the assignment index t * k + j for each padded row,
    -1 for padding; block_expert [B] int32: the expert of each block, num_experts past the end)."""
    flat = ids.reshape(-1)
    a = flat.numel()
    nb = max_blocks(a, num_experts, block_m)
    # scatter_add, not bincount: bincount on CUDA reads the largest id back to the host
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    pad_start = pad_end - padded
    run_start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    pos = torch.arange(nb * block_m, device=ids.device)
    expert = torch.searchsorted(pad_end, pos, right=True)            # == num_experts past the last run
    e = expert.clamp(max=num_experts - 1)
    j = pos - pad_start[e]
    valid = (expert < num_experts) & (j < counts[e])
    src = order[(run_start[e] + j).clamp(0, max(a - 1, 0))]
    rows = torch.where(valid, src, torch.full_like(src, -1)).to(torch.int32)
    return rows, expert[::block_m].to(torch.int32)


def experts_forward(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor, limit: float, backend: str = "torch", max_tokens: int = 0) -> torch.Tensor:
    if backend == "triton" and 0 < x.shape[0] <= max_tokens:
        from tpserve.kernels.moe_triton import experts_triton

        return experts_triton(x, weights, ids, gate_up, down, limit)
    return experts_loop(x, weights, ids, gate_up, down, limit)
