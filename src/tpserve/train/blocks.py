"""Differentiable full-sequence forwards of the glm5_next blocks, over our modules' parameters.

Each function takes one of tpserve's model modules (built only for its parameters and checkpoint
names, never called) and a batch of full sequences [B, T, D], with no cache. The math follows
transformers 5.23.0's Glm5NextText* modules: fp32 RMSNorm, mHC with Sinkhorn (kernels/norms/mhc.py),
KDA through the chunked torch reference (kernels/attention/kda.py), NoPE MLA under the indexer's k-pool
selection, the sigmoid router with correction bias and clamped SwiGLU experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tpserve.kernels.attention.kda import kda_chunked
from tpserve.kernels.norms.mhc import hc_weights_torch
from tpserve.kernels.linear.ref import clamped_swiglu

KDA_CHUNK = 32  # the chunked form's [heads, chunks, C, C, K] decay tensor is the largest activation


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rms_norm_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The MTP layer's enorm / hnorm (model/mtp.norm_fp32): scaled in fp32 with an fp32 weight, one cast."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def linear(x: torch.Tensor, lin) -> torch.Tensor:
    return F.linear(x, lin.weight, lin.bias)


# ------------------------------------------------------------------------------------ mHC
def hc_collapse(hc, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """streams [B, T, N, D] -> (post [B, T, N], comb [B, T, N, N], block input [B, T, D])."""
    b, t, n, d = streams.shape
    flat = streams.reshape(b * t, n * d).float()
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + hc.norm_eps)
    mixed = F.linear(flat, hc.fn.float())
    pre, post, comb = hc_weights_torch(mixed, hc.base, hc.scale, n, hc.iters, hc.hc_eps)
    pre, post, comb = pre.view(b, t, n), post.view(b, t, n), comb.view(b, t, n, n)
    collapsed = (pre.unsqueeze(-1) * streams).sum(dim=2).to(streams.dtype)
    return post, comb, collapsed


def hc_expand(block_out: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
              comb: torch.Tensor) -> torch.Tensor:
    dtype = residual.dtype
    return post.to(dtype).unsqueeze(-1) * block_out.unsqueeze(-2) + torch.matmul(
        comb.to(dtype).transpose(-1, -2), residual)


# ------------------------------------------------------------------------------------ MLP / MoE
def dense_mlp(mlp, x: torch.Tensor) -> torch.Tensor:
    return linear(clamped_swiglu(linear(x, mlp.gate_proj), linear(x, mlp.up_proj), mlp.limit), mlp.down_proj)


def moe(block, x: torch.Tensor, loads: list | None = None, dense: bool = False) -> torch.Tensor:
    """MoE over x [B, T, D]; appends (router, tokens per expert) to `loads` (bias balancing).

    dense=False: each expert over its own tokens (a loop with a host sync per expert).
    dense=True: every expert over every token, weighted by a [N, E] matrix that is zero off the
    chosen experts: no host sync and a few large matmuls (the demo's 8 small experts cost little
    more than a loop); the chosen experts' contributions are summed in expert order with exact
    zeros in between, so both forms give the same value up to the matmuls' own rounding."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    weights, ids = block.gate(flat)  # model/moe.py Router: plain differentiable torch (grads via the weights)
    experts = block.experts
    n_exp = experts.gate_up_proj.shape[0]
    inter = experts.down_proj.shape[-1]
    if dense:
        mix = torch.zeros(flat.shape[0], n_exp, dtype=weights.dtype, device=flat.device).scatter(1, ids, weights)
        h = torch.matmul(flat.unsqueeze(0), experts.gate_up_proj.transpose(1, 2))          # [E, N, 2I]
        h = clamped_swiglu(h[..., :inter], h[..., inter:], experts.limit)
        y = torch.matmul(h, experts.down_proj.transpose(1, 2))                              # [E, N, D]
        out = (mix.t().unsqueeze(-1).to(flat.dtype) * y).sum(0)
    else:
        out = torch.zeros_like(flat)
        for e in range(n_exp):
            rows, slot = torch.where(ids == e)
            h = F.linear(flat[rows], experts.gate_up_proj[e])
            h = clamped_swiglu(h[:, :inter], h[:, inter:], experts.limit)
            y = F.linear(h, experts.down_proj[e]) * weights[rows, slot].unsqueeze(-1).to(flat.dtype)
            out = out.index_add(0, rows, y)
    if loads is not None:
        loads.append((block.gate, torch.bincount(ids.flatten(), minlength=n_exp)))
    if block.shared_experts is not None:
        out = out + dense_mlp(block.shared_experts, flat)
    return out.view(shape)


# ------------------------------------------------------------------------------------ KDA
def kda(attn, x: torch.Tensor) -> torch.Tensor:
    """KDA linear attention over full sequences x [B, T, D] (zero initial conv and recurrent state)."""
    b, t, _ = x.shape
    h, dh = attn.heads, attn.head_dim
    mixed = torch.cat([linear(x, attn.q_proj), linear(x, attn.k_proj), linear(x, attn.v_proj)], dim=-1)
    weight = attn.conv_weight                                                 # [C, 1, k] fp32
    k_size = weight.shape[-1]
    conv_in = F.pad(mixed.transpose(1, 2).to(weight.dtype), (k_size - 1, 0))
    mixed = F.silu(F.conv1d(conv_in, weight, groups=weight.shape[0])).transpose(1, 2).to(x.dtype)
    q, k, v = (y.reshape(b, t, h, dh) for y in mixed.split(h * dh, dim=-1))
    g = linear(linear(x, attn.f_a_proj), attn.f_b_proj).float() + attn.dt_bias.float()
    g = g.view(b, t, h, dh)
    rate = attn.A_log.float().exp().view(1, 1, -1, 1)
    if attn.lower_bound is not None:
        g = attn.lower_bound * torch.sigmoid(rate * g)
    else:
        g = -rate * torch.where(g > 20.0, g, torch.log1p(torch.exp(g)))
    beta = torch.sigmoid(linear(x, attn.b_proj))
    # the batch rides along the head dim: kda_chunked treats every head independently
    heads_first = lambda y: y.transpose(0, 1).reshape(t, b * h, *y.shape[3:])  # noqa: E731
    state = torch.zeros(b * h, dh, dh, dtype=torch.float32, device=x.device)
    out, _ = kda_chunked(heads_first(q), heads_first(k), heads_first(v), heads_first(g),
                         beta.transpose(0, 1).reshape(t, b * h), state, chunk=KDA_CHUNK)
    out = out.view(t, b, h, dh).transpose(0, 1)
    gate = linear(linear(x, attn.g_a_proj), attn.g_b_proj).view(b, t, h, dh)
    norm = attn.o_norm
    o = out.float()
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + norm.eps)
    o = (norm.weight.float() * o * torch.sigmoid(gate.float())).to(x.dtype)
    return linear(o.reshape(b, t, h * dh), attn.o_proj)
