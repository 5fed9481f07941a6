"""Dense SwiGLU MLP (clamped), column/row parallel. Returns this rank's partial sum."""

from __future__ import annotations

import torch
from torch import nn

from tpserve.kernels.moe.ref import clamped_swiglu
from tpserve.model import merged
from tpserve.model.layers import ShardContext, column, row


class DenseMLP(nn.Module):
    merged_linears = {"gate_up": ("gate_proj", "up_proj")}  # model/merged.py
    pdl = False  # layers.set_pdl: the Triton SwiGLU launched as a programmatic dependent

    def __init__(self, ctx: ShardContext, hidden: int, intermediate: int, limit: float, act: str = "torch"):
        super().__init__()
        self.act = act  # "triton": the clamped SwiGLU in one kernel (kernels/linear/act_triton.py)
        ctx.split(intermediate, "MLP intermediate size")
        self.gate_proj = column(ctx, hidden, intermediate)
        self.up_proj = column(ctx, hidden, intermediate)
        self.down_proj = row(ctx, intermediate, hidden)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = merged.outputs(self, "gate_up", x)
        if self.act == "triton" and gate.dim() == 2:
            from tpserve.kernels.linear.act_triton import clamped_swiglu_triton

            return self.down_proj(clamped_swiglu_triton(gate, up, self.limit, self.pdl))
        return self.down_proj(clamped_swiglu(gate, up, self.limit))
