"""The expert-sorted layout the grouped MoE kernels need (below kernels/moe/ref.py and kernels/moe/grouped_triton.py).

`align_by_expert` sorts the (token, choice) assignments by expert and pads each expert's run to a
multiple of `block_m` rows, with no host sync: the number of blocks is bounded from the shapes
alone (sum over used experts of ceil(count / block_m) <= assignments / block_m + used experts),
blocks past the end are marked with expert id E and skipped by the kernels.
"""

from __future__ import annotations

import torch


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
