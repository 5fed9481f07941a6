"""KDA (Kimi delta attention) in torch: the recurrences (the references of kda_fla.py) and the gate.

Per head, with state S [K, V] (fp32), log-decay g_t [K], beta_t, l2-normalised q_t, k_t:
    S <- diag(exp(g_t)) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T q_t / sqrt(K)

`kda_recurrent` steps token by token (decode). `kda_chunked` is the same map computed chunk by
chunk (prefill): within a chunk of C tokens with cumulative decay D_t = exp(G_t),
    (I + M) U = beta*V - (beta*K . D) S0,  M[t, j] = beta_t k_t^T diag(D_t / D_j) k_j  (j < t)
    O = (Q . D) S0 + tril(P) U,            P[t, j] = q_t^T diag(D_t / D_j) k_j
    S_C = D_C . S0 + (K . D_C / D)^T U
so each chunk is a unit-triangular solve and a few matmuls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta):
    q, k = l2norm(q.float()), l2norm(k.float())
    return q * (q.shape[-1] ** -0.5), k, v.float(), g.float(), beta.float()


def kda_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k, v, g: [T, H, K]; beta [T, H]; state [H, K, V] fp32 -> (out [T, H, V], new state)."""
    dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    s = state.float()
    out = torch.empty_like(v)
    for t in range(q.shape[0]):
        s = s * g[t].exp().unsqueeze(-1)
        u = (v[t] - (s * k[t].unsqueeze(-1)).sum(-2)) * beta[t].unsqueeze(-1)
        s = s + k[t].unsqueeze(-1) * u.unsqueeze(-2)
        out[t] = (s * q[t].unsqueeze(-1)).sum(-2)
    return out.to(dtype), s


def kda_recurrent_batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k, v, g [B, H, K]; beta [B, H]; states [B, H, K, V]."""
    dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    s = states.float() * g.exp().unsqueeze(-1)
    u = (v - (s * k.unsqueeze(-1)).sum(-2)) * beta.unsqueeze(-1)
    s = s + k.unsqueeze(-1) * u.unsqueeze(-2)
    return (s * q.unsqueeze(-1)).sum(-2).to(dtype), s


def kda_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                state: torch.Tensor, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as kda_recurrent, computed chunk by chunk."""
    dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    t_len = q.shape[0]
    pad = (-t_len) % chunk
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    n = q.shape[0] // chunk
    # [H, n, C, *]
    q, k, v, g = (x.view(n, chunk, *x.shape[1:]).permute(2, 0, 1, 3) for x in (q, k, v, g))
    beta = beta.view(n, chunk, -1).permute(2, 0, 1)
    big_g = g.cumsum(dim=2)                                       # G_t
    kb, vb = k * beta.unsqueeze(-1), v * beta.unsqueeze(-1)
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # decay[t, j] = exp(G_t - G_j) per channel, only needed for j <= t
    diff = (big_g.unsqueeze(-2) - big_g.unsqueeze(-3)).masked_fill(~incl[..., None], float("-inf")).exp()
    m = torch.einsum("hntc,hntjc,hnjc->hntj", kb, diff, k).masked_fill(~strict, 0.0)
    p = torch.einsum("hntc,hntjc,hnjc->hntj", q, diff, k).masked_fill(~incl, 0.0)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    solve = lambda rhs: torch.linalg.solve_triangular(eye + m, rhs, upper=False, unitriangular=True)  # noqa: E731
    w = solve(vb)                                                  # T beta V
    kc = solve(kb * big_g.exp())                                   # T (beta K . D)
    s = state.float()
    out = torch.empty_like(v)
    for i in range(n):
        d = big_g[:, i].exp()                                      # [H, C, K]
        u = w[:, i] - kc[:, i] @ s
        out[:, i] = (q[:, i] * d) @ s + p[:, i] @ u
        last = big_g[:, i, -1:]                                    # [H, 1, K]
        s = s * last.exp().transpose(-1, -2) + (k[:, i] * (last - big_g[:, i]).exp()).transpose(-1, -2) @ u
    out = out.permute(1, 2, 0, 3).reshape(n * chunk, -1, out.shape[-1])[:t_len]
    return out.to(dtype), s


def gate_beta(f: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor, b: torch.Tensor, head_dim: int,
              lower_bound: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA's forget gate and beta (kda_prep_triton.gate_beta's reference): f [T, H*K] (f_b_proj output),
    dt_bias [H*K], A_log [H], b [T, H] -> (log decay g [T, H, K] fp32, beta = sigmoid(b) in b.dtype). The gate is
    lower_bound * sigmoid(exp(A_log) * (f + dt_bias)), or without a lower bound -exp(A_log) * softplus(f + dt_bias)
    (softplus linear above 20)."""
    g = f.float() + dt_bias.float()
    g = g.view(f.shape[0], -1, head_dim)
    rate = a_log.float().exp().view(1, -1, 1)
    if lower_bound is not None:
        g = lower_bound * torch.sigmoid(rate * g)
    else:
        g = -rate * torch.where(g > 20.0, g, torch.log1p(torch.exp(g)))
    return g, torch.sigmoid(b)
