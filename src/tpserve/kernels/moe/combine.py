"""The MoE combine: each token's k expert outputs (rows in expert order) weighted and summed in fp32, rounded
once. The definition that the grouped experts, the fused reduce-scatter (collectives/fused.py) and the Triton
kernel (route_triton.combine_sorted) all reproduce."""

from __future__ import annotations

import torch

MOE_COMBINES = ("torch", "triton")


def inverse_order(order: torch.Tensor) -> torch.Tensor:
    """inv with inv[order[i]] = i: where each token-major choice's output lies in y."""
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), dtype=order.dtype, device=order.device)
    return inv


def moe_combine_block(out: torch.Tensor, y: torch.Tensor, inv: torch.Tensor,
                      weights: torch.Tensor, shared: torch.Tensor | None, rows: tuple[int, int],
                      cols: tuple[int, int]) -> None:
    """out [r1 - r0, c1 - c0] (any view, y.dtype) = combined[r0:r1, c0:c1] of `moe_combine`, rows
    at or past T zero (the reduce-scatter's padding); inv [T, k] from `inverse_order`. Every
    element is the same chain of fp32 operations whichever block it is computed in, so blocks
    of a tensor are bitwise slices of the whole."""
    (r0, r1), (c0, c1) = rows, cols
    t, k = weights.shape
    valid = max(0, min(r1, t) - r0)
    if valid < r1 - r0:
        out[valid:].zero_()
    if valid == 0:
        return
    yc, idx, w = y[:, c0:c1], inv[r0:r0 + valid], weights[r0:r0 + valid].float()
    acc = yc.index_select(0, idx[:, 0]).float().mul_(w[:, 0:1])
    for j in range(1, k):
        acc.add_(yc.index_select(0, idx[:, j]).float().mul_(w[:, j:j + 1]))
    if shared is None:
        out[:valid].copy_(acc)
    else:
        torch.add(acc.to(y.dtype), shared[r0:r0 + valid, c0:c1], out=out[:valid])


def moe_combine(y: torch.Tensor, order: torch.Tensor, weights: torch.Tensor,
                shared: torch.Tensor | None = None, backend: str = "torch") -> torch.Tensor:
    """combined [T, D] in y.dtype (this module's definition): the k choices summed in fp32,
    rounded once, then `+ shared` in the dtype. `backend` "triton": the sum as
    kernels/moe/route_triton.combine_sorted computes it (CUDA; the k terms in its reduction order)."""
    if backend not in MOE_COMBINES:
        raise ValueError(f"moe_combine: backend must be one of {MOE_COMBINES}, got {backend!r}")
    if backend == "triton":
        from tpserve.kernels.moe.route_triton import combine_sorted

        out = combine_sorted(y.contiguous(), order, weights)
        return out if shared is None else out + shared
    t, d = weights.shape[0], y.shape[1]
    out = torch.empty((t, d), dtype=y.dtype, device=y.device)
    moe_combine_block(out, y, inverse_order(order).view(weights.shape), weights, shared, (0, t), (0, d))
    return out
