"""MoE: sigmoid router with correction bias and group-limited top-k, clamped SwiGLU experts,
plus shared experts. Each expert's intermediate dim is split across ranks; the router is
replicated (fp32). Returns this rank's partial sum (the decoder layer reduces it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tpserve.kernels.choice import Kernels
from tpserve.kernels.moe import experts_forward
from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext
from tpserve.model.mlp import DenseMLP
from tpserve.model.weights import COLUMN, REPLICATED, ROW, add_source, declare


class Router(nn.Module):
    def __init__(self, ctx: ShardContext, cfg: ModelConfig):
        super().__init__()
        e = cfg.n_routed_experts
        declare(self, "weight", (e, cfg.hidden_size), REPLICATED, dtype=ctx.dtype, world=ctx.world)
        declare(self, "e_score_correction_bias", (e,), REPLICATED, dtype=ctx.dtype, world=ctx.world,
                fp32=True)
        self.top_k, self.n_group, self.topk_group = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
        self.norm, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> (weights [T, k] fp32, expert ids [T, k])."""
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias
        if self.n_group > 1:
            grouped = choice.view(x.shape[0], self.n_group, -1)
            group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
            keep = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, keep, 1.0).bool()
            choice = choice.masked_fill(~group_mask.unsqueeze(-1).expand_as(grouped).reshape_as(choice),
                                        float("-inf"))
        ids = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if self.norm:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scaling, ids


class Experts(nn.Module):
    """Fused gate_up_proj [E, 2I_local, D] (gate|up) and down_proj [E, D, I_local], filled from the
    checkpoint's per-expert `experts.{e}.{gate,up,down}_proj.weight`."""

    def __init__(self, ctx: ShardContext, cfg: ModelConfig, kernels: Kernels):
        super().__init__()
        self.kernels = kernels
        e, i, d = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
        il = ctx.split(i, "moe_intermediate_size")
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * il, d, dtype=ctx.dtype), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(e, d, il, dtype=ctx.dtype), requires_grad=False)
        for x in range(e):
            add_source(self, f"{x}.gate_proj.weight", (i, d), COLUMN, "gate_up_proj", (x, slice(0, il)), ctx.world)
            add_source(self, f"{x}.up_proj.weight", (i, d), COLUMN, "gate_up_proj", (x, slice(il, 2 * il)),
                       ctx.world)
            add_source(self, f"{x}.down_proj.weight", (d, i), ROW, "down_proj", (x,), ctx.world)
        self.limit = cfg.swiglu_limit

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return experts_forward(x, weights, ids, self.gate_up_proj, self.down_proj, self.limit,
                               self.kernels.moe, self.kernels.moe_triton_max_tokens)


class MoE(nn.Module):
    def __init__(self, ctx: ShardContext, cfg: ModelConfig, kernels: Kernels = Kernels()):
        super().__init__()
        self.gate = Router(ctx, cfg)
        self.experts = Experts(ctx, cfg, kernels)
        width = cfg.moe_intermediate_size * cfg.n_shared_experts
        self.shared_experts = DenseMLP(ctx, cfg.hidden_size, width, cfg.swiglu_limit) if width else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = self.experts(x, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
