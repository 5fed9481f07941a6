"""All-reduce + residual add + RMSNorm: the definition, the unfused path and its error bound.

The fused operation (Communicator.all_reduce_add_rmsnorm) computes, for a row-parallel layer's
partial output `partial` on every rank:

    total        = sum over ranks of partial       (the all-reduce: rank order, fp32, rounded)
    new_residual = residual + total                (in the tensors' dtype: fp32 add, rounded)
    normed       = weight * (h * rsqrt(mean(h^2, -1) + eps)).to(dtype),  h = new_residual.float()

which is exactly model/layers.RMSNorm applied after the add. `add_rmsnorm` is that computation in
torch (the CPU path and the reference); the CUDA kernel (workspace_fused.py) produces `total` and
`new_residual` bitwise equal to it and `normed` within `rmsnorm_bound`.
"""

from __future__ import annotations

import torch


def check_args(partial: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
    if partial.dim() < 1:
        raise ValueError("all_reduce_add_rmsnorm: partial must have at least one dimension")
    if residual.shape != partial.shape:
        raise ValueError(f"all_reduce_add_rmsnorm: residual shape {tuple(residual.shape)} != "
                         f"partial shape {tuple(partial.shape)}")
    if residual.dtype != partial.dtype:
        raise ValueError(f"all_reduce_add_rmsnorm: residual dtype {residual.dtype} != partial "
                         f"dtype {partial.dtype}")
    if weight.shape != partial.shape[-1:]:
        raise ValueError(f"all_reduce_add_rmsnorm: weight shape {tuple(weight.shape)} != "
                         f"({partial.shape[-1]},)")
    if residual.device != partial.device or weight.device != partial.device:
        raise ValueError("all_reduce_add_rmsnorm: partial, residual and weight must be on one "
                         "device")


def add_rmsnorm(total: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed, new_residual) from the all-reduced `total` (model/layers.RMSNorm numerics)."""
    new_residual = residual + total
    h = new_residual.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(new_residual.dtype), new_residual


def _ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype` at |x| (fp32 tensor), with the smallest normal as the floor."""
    info = torch.finfo(dtype)
    mag = x.abs().clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * info.eps


def rmsnorm_bound(new_residual: torch.Tensor, weight: torch.Tensor, eps: float,
                  ref_normed: torch.Tensor) -> torch.Tensor:
    """Per-element bound on |normed - ref_normed| for an implementation that computes the same
    formula with another fp32 summation order for mean(h^2) and another rsqrt.

    Derivation: with n = h.shape[-1], the fp32 mean differs by at most ~n ulp32 relative (two
    summation orders, each within (n-1) * eps32 / 2 of exact), rsqrt by 2 ulp32, so
    r' = r (1 + d) with |d| <= d_max = (n + 4) eps32. Then q = h r rounds to the output dtype
    either to the same value or to a neighbour, so |q' - q| <= ulp(q) + |q| d_max; the product
    with the weight is rounded again (half an ulp of the result each side, one ulp in all).
    """
    dtype = ref_normed.dtype
    n = new_residual.shape[-1]
    h = new_residual.float()
    r = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    q = (h * r).abs()
    d_max = (n + 4) * torch.finfo(torch.float32).eps
    w = weight.float().abs()
    dq = _ulp(q, dtype) * 1.01 + q * d_max
    return w * dq + _ulp(ref_normed.float().abs() + w * dq, dtype)
