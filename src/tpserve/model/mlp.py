"""Dense SwiGLU MLP (clamped), column/row parallel. Returns this rank's partial sum."""

from __future__ import annotations

import torch
from torch import nn

from tpserve.kernels.linear.ref import clamped_swiglu
from tpserve.model import merged
from tpserve.model.layers import ShardContext, column, row


class DenseMLP(nn.Module):
    merged_linears = {"gate_up": ("gate_proj", "up_proj")}  # model/merged.py

    def __init__(self, ctx: ShardContext, hidden: int, intermediate: int, limit: float):
        super().__init__()
        self.swiglu = ctx.ops.swiglu  # 2-D activations; others take the torch form
        ctx.split(intermediate, "MLP intermediate size")
        self.gate_proj = column(ctx, hidden, intermediate)
        self.up_proj = column(ctx, hidden, intermediate)
        self.down_proj = row(ctx, intermediate, hidden)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = merged.outputs(self, "gate_up", x)
        act = self.swiglu if gate.dim() == 2 else clamped_swiglu
        return self.down_proj(act(gate, up, self.limit))
