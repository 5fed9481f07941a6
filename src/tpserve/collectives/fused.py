"""The fused all-reduce collectives: their definitions, unfused paths and error bounds.

The fused operation (Communicator.all_reduce_add_rmsnorm) computes, for a row-parallel layer's
partial output `partial` on every rank:

    total        = sum over ranks of partial       (the all-reduce: rank order, fp32, rounded)
    new_residual = residual + total                (in the tensors' dtype: fp32 add, rounded)
    normed       = weight * (h * rsqrt(mean(h^2, -1) + eps)).to(dtype),  h = new_residual.float()

which is exactly model/layers.RMSNorm applied after the add. `add_rmsnorm` is that computation in
torch (the CPU path and the reference); the CUDA kernel (workspace_triton_pipe.py) produces
`total` and `new_residual` bitwise equal to it and `normed` within `rmsnorm_bound`.

All-reduce + mHC expand (Communicator.all_reduce_hc_expand): in this model no plain residual add
follows a block's all-reduce; the hyper-connection expand does (model/mhc.py):

    total       = sum over ranks of partial [T, D]   (the all-reduce, as above)
    new_streams = post (x) total + comb^T @ streams  [T, N, D], post [T, N] and comb [T, N, N]
                                                     cast to the streams' dtype first

`hc_expand` (kernels/norms/ref.py) is that expand in torch (the model's torch path, so the unfused path
and the CPU path are the model's own arithmetic); the CUDA kernel (workspace_triton_pipe.py) sums
`total` bitwise as the all-reduce does and gives new_streams within `hc_expand_bound`.

MoE combine + reduce-scatter (Communicator.reduce_scatter_moe_combine): with sequence parallelism
an MoE layer's partial output is reduce-scattered, and on the grouped experts path
(kernels/moe/ref.experts_grouped) that output is first combined from the experts' expert-sorted rows:

    combined[t] = sum_j fp32(weights[t, j]) * fp32(y[inv[t*k + j]])   j = 0 .. k-1, in fp32,
                  rounded once to y.dtype                               (inv: order's inverse)
    combined    = combined + shared                  (in the dtype, where there are shared experts)
    result      = reduce_scatter(pad_rows(combined)) (zero rows up to a multiple of the world)

y [T*k, D] holds the experts' outputs in expert order (row i is choice order[i] of the
token-major choices), weights [T, k] the router's. `moe_combine` is the combine in torch (the k
terms added in order j = 0, 1, ...; kernels/moe/ref.experts_grouped's torch form is this function);
`moe_combine(..., backend="triton")` is kernels/moe/route_triton.combine_sorted's sum instead (CUDA).
The fused paths write each rank's combined rows straight into the reduce-scatter's workspace slot
(no [T, D] tensor written and read back): the CPU workspace (workspace.py) with this file's torch
arithmetic row block by row block, the CUDA workspace with combine_sorted's own tile code (one
round where it fits a slot, workspace_triton.py; else pipelined, workspace_triton_pipe.py); each
is taken only where the unfused path would use the same combine and the same workspace sum, so the
result is bitwise the unfused path's.
"""

from __future__ import annotations

import torch

from tpserve.kernels.moe.combine import MOE_COMBINES, inverse_order, moe_combine, moe_combine_block  # noqa: F401
from tpserve.kernels.norms.ref import hc_expand  # noqa: F401  (the expand's definition)


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


def check_hc_args(partial: torch.Tensor, streams: torch.Tensor, post: torch.Tensor,
                  comb: torch.Tensor) -> None:
    name = "all_reduce_hc_expand"
    if partial.dim() != 2:
        raise ValueError(f"{name}: partial must be [tokens, hidden], got shape "
                         f"{tuple(partial.shape)}")
    t, d = partial.shape
    if streams.dim() != 3 or streams.shape[0] != t or streams.shape[2] != d:
        raise ValueError(f"{name}: streams shape {tuple(streams.shape)} != ({t}, hc_mult, {d})")
    n = streams.shape[1]
    if post.shape != (t, n):
        raise ValueError(f"{name}: post shape {tuple(post.shape)} != ({t}, {n})")
    if comb.shape != (t, n, n):
        raise ValueError(f"{name}: comb shape {tuple(comb.shape)} != ({t}, {n}, {n})")
    if streams.dtype != partial.dtype:
        raise ValueError(f"{name}: streams dtype {streams.dtype} != partial dtype {partial.dtype}")
    for arg, x in (("partial", partial), ("post", post), ("comb", comb)):
        if not x.is_floating_point():
            raise ValueError(f"{name}: {arg} must be a floating-point tensor, got {x.dtype}")
    if comb.dtype != post.dtype:
        raise ValueError(f"{name}: comb dtype {comb.dtype} != post dtype {post.dtype}")
    for arg, x in (("streams", streams), ("post", post), ("comb", comb)):
        if x.device != partial.device:
            raise ValueError(f"{name}: {arg} is on {x.device}, partial on {partial.device}; "
                             "all four must be on one device")


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


def hc_expand_bound(total: torch.Tensor, streams: torch.Tensor, post: torch.Tensor,
                    comb: torch.Tensor) -> torch.Tensor:
    """Per-element bound [T, N, D] on |new_streams - hc_expand(total, streams, post, comb)| for an
    implementation of the same formula with another summation order, fused multiply-adds or
    another accumulation precision (at least the dtype's) in the matmul.

    Derivation: with p, c = post, comb cast to the dtype (the same values in both), element
    (t, n, d) is the sum of N + 1 products, v = p[n] x[d] + sum_m c[m, n] s[m, d]. Either
    implementation rounds each product at most once, the matmul's N terms through at most N - 1
    additions and one rounding to the dtype, and the final add at most twice (in float32, then
    to the dtype), each rounding relative with unit roundoff <= u (the dtype's, eps / 2). So every
    product reaches the result through at most N + 3 factors (1 + delta), |delta| <= u, and
    |computed - v| <= gamma(N + 3) * S with S = |p x| + sum_m |c[m, n] s[m, d]| and
    gamma(k) = k u / (1 - k u) (Higham, Accuracy and Stability, Lemma 3.1). Two implementations
    differ by at most twice that. Below the normal range a rounding adds an absolute error of at
    most u * tiny (half the subnormal spacing): the floor 2 (N + 3) u tiny.
    """
    dtype = streams.dtype
    info = torch.finfo(dtype)
    n = streams.shape[1]
    k = n + 3
    u = info.eps / 2
    gamma = k * u / (1 - k * u)
    p = post.to(dtype).double().abs()
    c = comb.to(dtype).double().abs()
    s = p.unsqueeze(-1) * total.double().abs().unsqueeze(-2) + torch.matmul(
        c.transpose(-1, -2), streams.double().abs())
    return 2 * gamma * s + 2 * k * u * info.tiny


def pad_rows(x: torch.Tensor, world: int) -> torch.Tensor:
    """x with zero rows appended up to a multiple of `world` (a reduce-scatter's input)."""
    extra = (-x.shape[0]) % world
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 1) + (0, extra)) if extra else x


def check_moe_args(y: torch.Tensor, order: torch.Tensor, weights: torch.Tensor,
                   shared: torch.Tensor | None) -> None:
    name = "reduce_scatter_moe_combine"
    if weights.dim() != 2 or weights.shape[1] < 1:
        raise ValueError(f"{name}: weights must be [tokens, top_k] with top_k >= 1, got shape "
                         f"{tuple(weights.shape)}")
    t, k = weights.shape
    if y.dim() != 2 or y.shape[0] != t * k:
        raise ValueError(f"{name}: y shape {tuple(y.shape)} != ({t * k}, hidden): one row per "
                         f"choice of the weights' {t} tokens x {k}")
    if order.shape != (t * k,):
        raise ValueError(f"{name}: order shape {tuple(order.shape)} != ({t * k},)")
    if shared is not None and shared.shape != (t, y.shape[1]):
        raise ValueError(f"{name}: shared shape {tuple(shared.shape)} != ({t}, {y.shape[1]})")
    for arg, x in (("y", y), ("weights", weights)):
        if not x.is_floating_point():
            raise ValueError(f"{name}: {arg} must be a floating-point tensor, got {x.dtype}")
    if order.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name}: order must be int64 or int32, got {order.dtype}")
    if shared is not None and shared.dtype != y.dtype:
        raise ValueError(f"{name}: shared dtype {shared.dtype} != y dtype {y.dtype}")
    for arg, x in (("order", order), ("weights", weights), ("shared", shared)):
        if x is not None and x.device != y.device:
            raise ValueError(f"{name}: {arg} is on {x.device}, y on {y.device}; all must be on "
                             "one device")
