"""Depthwise causal conv (kernel k) with a carried state of the last k-1 inputs, then SiLU.

State and inputs are in the model dtype; the product runs in fp32 (the conv weight is fp32),
as transformers does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv_seq(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [n, C]; state [C, k-1]; weight [C, k] -> (silu(conv) [n, C] in x.dtype, new state [C, k-1])."""
    full = torch.cat([state.to(x.dtype), x.t()], dim=-1)                      # [C, k-1+n]
    out = F.conv1d(full.unsqueeze(0).to(weight.dtype), weight.unsqueeze(1), groups=weight.shape[0])
    new_state = full[:, full.shape[1] - state.shape[1]:]
    return F.silu(out[0]).t().to(x.dtype), new_state


def causal_conv_step(x: torch.Tensor, states: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: x [B, C]; states [B, C, k-1] -> (out [B, C], new states)."""
    full = torch.cat([states.to(x.dtype), x.unsqueeze(-1)], dim=-1)          # [B, C, k]
    out = (full.to(weight.dtype) * weight).sum(-1)
    return F.silu(out).to(x.dtype), full[..., 1:]
