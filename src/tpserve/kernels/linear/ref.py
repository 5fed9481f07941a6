"""Torch references of the dense ops: the clamped SwiGLU (act_triton.py) and the greedy draw's argmax with its
probability (argmax_triton.py). The dense linear itself is F.linear (quant/dispatch.py chooses gemv_triton.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit)."""
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


def argmax_and_probability(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[N, V] logits -> float64 [2, N]: each row's argmax (the first on ties, as argmax) and its probability under
    the softmax, stacked for one device-to-host copy (written into `out`, a float64 [2, N] view, when given)."""
    top = logits.max(-1)
    sure = (top.values - logits.logsumexp(-1)).exp()
    res = torch.stack([top.indices.double(), sure.double()])
    if out is None:
        return res
    out.copy_(res)
    return out
