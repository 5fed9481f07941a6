"""MoE routing in torch (the reference of route_triton.route): sigmoid scores of the router logits, the
correction bias for the choice, group-limited top-k, the chosen scores normalised and scaled."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def router_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight^T in float32, as F.linear(x.float(), weight.float()): on CUDA 16-bit inputs go straight
    into a GEMM with fp32 accumulation and fp32 output (the products of 16-bit values are exact in
    fp32), with no fp32 copies of x and of the [E, D] weight."""
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype:
        return torch.mm(x, weight.t(), out_dtype=torch.float32)
    return F.linear(x.float(), weight.float())


def route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int,
          norm: bool, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D], router weight [E, D], correction bias [E] -> (weights [T, top_k] fp32, expert ids [T, top_k])."""
    scores = F.linear(x.float(), weight.float()).sigmoid()
    choice = scores + bias
    if n_group > 1:
        grouped = choice.view(x.shape[0], n_group, -1)
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
        keep = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, keep, 1.0).bool()
        choice = choice.masked_fill(~group_mask.unsqueeze(-1).expand_as(grouped).reshape_as(choice),
                                    float("-inf"))
    ids = torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if norm:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, ids
