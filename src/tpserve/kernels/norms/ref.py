"""The norms' torch references: RMSNorm, KDA's gated RMSNorm, and the mHC stream norm, collapse and expand
(norm_triton.py computes each in one kernel)."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Glm5NextTextRMSNorm: normalise in fp32, cast back, then scale."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """KDA's output norm: fp32 RMSNorm over the last dim, scaled, times sigmoid(gate)."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight.float() * h
    return (h * torch.sigmoid(gate.float())).to(dtype)


def hc_stream_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """The mHC projection's input: the flattened streams [T, N * D] RMS-normalised in fp32 (no weight)."""
    flat = x.float()
    return flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)


def hc_collapse(pre: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """The block input: streams [T, N, D] summed with the pre gates [T, N] (fp32), in the streams' dtype."""
    return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)


def hc_expand(total: torch.Tensor, streams: torch.Tensor, post: torch.Tensor,
              comb: torch.Tensor) -> torch.Tensor:
    """New streams [T, N, D] = post (x) total + comb^T @ streams: the mHC expand after a block (collectives/fused.py
    fuses it with the all-reduce before it)."""
    dtype = streams.dtype
    return post.to(dtype).unsqueeze(-1) * total.unsqueeze(-2) + torch.matmul(
        comb.to(dtype).transpose(-1, -2), streams)
