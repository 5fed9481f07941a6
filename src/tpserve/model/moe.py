"""MoE: sigmoid router with correction bias and group-limited top-k, clamped SwiGLU experts,
plus shared experts. Each expert's intermediate dim is split across ranks; the router is
replicated (fp32). Returns this rank's partial sum (the decoder layer reduces it). Where that sum
is reduce-scattered (sequence parallelism) and the experts take the grouped path,
`forward_unreduced` hands back the pieces instead (`SortedMoeOutput`), for the decoder layer to
combine inside the reduce-scatter (Communicator.reduce_scatter_moe_combine, --fused-collectives).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext
from tpserve.model.mlp import DenseMLP
from tpserve.model.quant_methods import Bf16Experts
from tpserve.model.weights import REPLICATED, declare


class Router(nn.Module):
    """Sigmoid scores, correction bias, group-limited top-k, normalised and scaled weights (`ctx.ops.route`; the
    Triton router takes one expert group, so a grouped config keeps the torch reference)."""

    def __init__(self, ctx: ShardContext, cfg: ModelConfig):
        super().__init__()
        self.route = ctx.ops.route if cfg.n_group == 1 else ctx.ops.route.reference
        e = cfg.n_routed_experts
        declare(self, "weight", (e, cfg.hidden_size), REPLICATED, dtype=ctx.dtype, world=ctx.world)
        declare(self, "e_score_correction_bias", (e,), REPLICATED, dtype=ctx.dtype, world=ctx.world,
                fp32=True)
        self.top_k, self.n_group, self.topk_group = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
        self.norm, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> (weights [T, k] fp32, expert ids [T, k])."""
        return self.route(x, self.weight, self.e_score_correction_bias, self.top_k, self.n_group, self.topk_group,
                          self.norm, self.scaling)


class Experts(nn.Module):
    """Fused gate_up_proj [E, 2I_local, D] (gate|up) and down_proj [E, D, I_local], filled from the
    checkpoint's per-expert `experts.{e}.{gate,up,down}_proj.*`. The layout, loading and forward
    belong to `self.quant` (model/quant_methods.py: bf16, fp8, nvfp4)."""

    def __init__(self, ctx: ShardContext, cfg: ModelConfig):
        super().__init__()
        self.ctx = ctx
        self.dims = (cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size)
        ctx.split(cfg.moe_intermediate_size, "moe_intermediate_size")
        self.limit = cfg.swiglu_limit
        self.qualname: str | None = None
        self.quant = Bf16Experts()
        self.quant.create(self, ctx, *self.dims)

    def set_quant(self, method, qualname: str | None = None) -> None:
        """Replace the weight layout (before the weights are materialised and loaded)."""
        if qualname is not None:
            self.qualname = qualname
        for name in list(self._parameters):
            del self._parameters[name]
        self.__dict__.get("_sources", {}).clear()
        self.quant = method
        method.create(self, self.ctx, *self.dims)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.quant.forward(self, x, weights, ids)

    def forward_sorted(self, x: torch.Tensor, weights: torch.Tensor,
                       ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(y, order) of kernels/moe/ref.experts_sorted where `forward` takes grouped_mm (16-bit unquantized
        experts: kernels/quant/dispatch.EXPERTS), else None."""
        if self.quant.name != "bf16":
            return None
        return self.ctx.ops.experts.sorted_bf16(x, weights, ids, self.gate_up_proj, self.down_proj, self.limit)

    def extra_repr(self) -> str:
        return f"experts={self.dims[0]}, quant={self.quant.describe()}"


@dataclass(frozen=True)
class SortedMoeOutput:
    """An MoE layer's partial output before the combine of its k choices (collectives/fused.moe_combine):
    the grouped experts' rows in expert order, the router's weights, the shared experts' output
    (None without them) and the combine backend the unfused path would use."""

    y: torch.Tensor                  # [T * k, D]
    order: torch.Tensor              # [T * k]
    weights: torch.Tensor            # [T, k] fp32
    shared: torch.Tensor | None      # [T, D]
    combine: str                     # "torch" or "triton" (kernels/moe/route_triton.combine_sorted)


class MoE(nn.Module):
    def __init__(self, ctx: ShardContext, cfg: ModelConfig):
        super().__init__()
        self.gate = Router(ctx, cfg)
        self.experts = Experts(ctx, cfg)
        width = cfg.moe_intermediate_size * cfg.n_shared_experts
        self.shared_experts = DenseMLP(ctx, cfg.hidden_size, width, cfg.swiglu_limit) if width else None
        # the grouped experts' combine (kernels/moe/ref.experts_grouped): its sum where the reduce-scatter does it
        self.combine_backend = ctx.ops.experts.combine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        return self._plus_shared(self.experts(x, weights, ids), x)

    def _plus_shared(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return out if self.shared_experts is None else out + self.shared_experts(x)

    def forward_unreduced(self, x: torch.Tensor) -> torch.Tensor | SortedMoeOutput:
        """`forward`, or where the experts take the grouped path its pieces before the combine
        (collectives/fused.moe_combine of them is `forward`'s result, bit for bit)."""
        weights, ids = self.gate(x)
        pieces = self.experts.forward_sorted(x, weights, ids)
        if pieces is None:
            return self._plus_shared(self.experts(x, weights, ids), x)
        shared = None if self.shared_experts is None else self.shared_experts(x)
        return SortedMoeOutput(*pieces, weights, shared, self.combine_backend)
