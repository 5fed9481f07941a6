"""mHC weights from the projected streams: pre / post gates and the doubly stochastic comb.

`hc_weights_torch` is the reference (transformers' order of operations, fp32). The Triton kernel
(kernels/norms/mhc_triton.py) computes the same per token in one launch; the torch form is about
5 + 6 * sinkhorn_iters small ops (~120 launches per block at 20 iterations), which made mHC the
largest share of kernel launches in a decode step.
"""

from __future__ import annotations

import torch


def hc_weights_torch(mixed: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mixed [T, (2+n)*n] fp32 -> (pre [T, n], post [T, n], comb [T, n, n]), all fp32."""
    pre_w, post_w, comb_w = mixed.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.split([n, n, n * n])
    pre_s, post_s, comb_s = scale.unbind(0)
    pre = torch.sigmoid(pre_w * pre_s + pre_b) + eps
    post = 2 * torch.sigmoid(post_w * post_s + post_b)
    comb = torch.softmax(comb_w.view(-1, n, n) * comb_s + comb_b.view(n, n), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb


def split_weight(fn: torch.Tensor) -> torch.Tensor:
    """fn [W, K] -> [3, W, K] bf16 parts hi, lo, lo2 (each the bf16 rounding of what the earlier parts leave)
    whose sum is fn to 2^-24 relative: the mHC projection's weight for kernels/norms/hc_project_triton.py."""
    f = fn.float()
    hi = f.to(torch.bfloat16)
    rest = f - hi.float()
    lo = rest.to(torch.bfloat16)
    lo2 = (rest - lo.float()).to(torch.bfloat16)
    return torch.stack([hi, lo, lo2]).contiguous()


def project_weight(fn: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weight layout kernels/norms/hc_project_triton.py reads for streams of `dtype`: the bf16 split [3, W, K]
    for bf16, fn itself [1, W, K] for float32."""
    if dtype == torch.bfloat16:
        return split_weight(fn)
    if dtype == torch.float32:
        return fn.float().unsqueeze(0).contiguous()
    raise ValueError(f"project_weight: bf16 or float32 streams, got {dtype}")
