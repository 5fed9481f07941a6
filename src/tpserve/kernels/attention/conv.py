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
    return F.silu(_taps(full, weight)).to(x.dtype), full[..., 1:]


def _taps(windows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """sum_i windows[..., i] * weight[:, i], added tap by tap in a fixed order: elementwise ops only, so
    a row's result does not depend on how many rows there are (a reduction kernel may vectorise the
    sum differently for different shapes, and verify rows must equal decode steps bit for bit)."""
    prod = windows.to(weight.dtype) * weight
    out = prod[..., 0]
    for i in range(1, prod.shape[-1]):
        out = out + prod[..., i]
    return out


def causal_conv_verify(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Verify rows: x [n, C] after state [C, k-1] -> out [n, C], each row computed exactly as
    `causal_conv_step` computes a one-token decode (same products, same sum); the state is not
    advanced (model/kda.py commits the accepted rows)."""
    return causal_conv_verify_uniform(x.unsqueeze(0), state.unsqueeze(0), weight)[0]


def causal_conv_verify_uniform(x: torch.Tensor, states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Verify rows of B sequences of n rows each: x [B, n, C], states [B, C, k-1] -> out [B, n, C]. Same
    products and sums as a decode step; SiLU over one [B, C] block per position, the shape of a decode
    step of B sequences (a vectorised exp may round a vector body and its scalar tail differently)."""
    k = weight.shape[-1]
    full = torch.cat([states.to(x.dtype), x.transpose(1, 2)], dim=-1)         # [B, C, k-1+n]
    pre = _taps(full.unfold(-1, k, 1).permute(2, 0, 1, 3).contiguous(), weight)  # [n, B, C]
    return torch.stack([F.silu(pre[j]) for j in range(pre.shape[0])], dim=1).to(x.dtype)
