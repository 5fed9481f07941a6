"""Differentiable full-sequence MLA (NoPE) with the DSA indexer's k-pool selection.

The selection follows transformers' Glm5NextTextIndexer for unpadded sequences: pools of
`index_kpool` tokens from position 0, a query sees a pool once the pool's last token is at or
before it, keeps the `index_topk / index_kpool` best-scoring visible pools and (with
`index_kpool_always_select_tail`) its own unfinished pool. The selection itself carries no
gradient (as in transformers); the indexer learns from `indexer_loss`: the KL divergence from
the main attention's probability mass per pool (dense, detached) to the indexer's softmax over
the visible pools, with the indexer's inputs detached (DeepSeek-V3.2's warm-up objective).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tpserve.train.blocks import linear, rms_norm


def _pool_scores(ix, x: torch.Tensor, q_resid: torch.Tensor) -> torch.Tensor:
    """Indexer scores [B, T, P] of every query against every complete pool (fp32)."""
    b, t, _ = x.shape
    kp, hd = ix.kpool, ix.head_dim
    n_pools = t // kp
    keys = F.layer_norm(linear(x, ix.wk), (hd,), ix.k_norm.weight, ix.k_norm.bias, ix.k_norm.eps)
    gates = F.linear(x, ix.index_kpool_compress_gate)
    keys = keys[:, :n_pools * kp].view(b, n_pools, kp, hd)
    gates = gates[:, :n_pools * kp].view(b, n_pools, kp, hd)
    probs = (gates.float() + ix.index_kpool_compress_ape.float()).softmax(dim=2).to(keys.dtype)
    pool_keys = (probs * keys).sum(dim=2)                                        # [B, P, hd]
    q = linear(q_resid, ix.wq_b).view(b, t, ix.n_heads, hd)
    s = torch.matmul(q.float(), pool_keys.float().unsqueeze(1).transpose(-1, -2))  # [B, T, H, P]
    s = F.relu(s * hd ** -0.5)
    w = linear(x, ix.weights_proj).float() * (ix.n_heads ** -0.5)
    return torch.matmul(w.unsqueeze(-2), s).squeeze(-2)


def _visible(t: int, kp: int, n_pools: int, device) -> torch.Tensor:
    pos = torch.arange(t, device=device)
    return (torch.arange(n_pools, device=device) + 1) * kp <= pos[:, None] + 1      # [T, P]


def selection_mask(ix, x: torch.Tensor, q_resid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (bool mask [B, T, T] of the keys each query attends to, pool scores [B, T, P])."""
    b, t, _ = x.shape
    kp = ix.kpool
    n_pools = t // kp
    with torch.no_grad():
        scores = _pool_scores(ix, x, q_resid)
        visible = _visible(t, kp, n_pools, x.device)
        mask = torch.zeros(b, t, t + 1, dtype=torch.bool, device=x.device)
        k = min(ix.pools_to_keep, n_pools)
        if k > 0:
            masked = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
            chosen = masked.topk(k, dim=-1).indices                                 # [B, T, k]
            ok = visible.expand(b, -1, -1).gather(-1, chosen)
            toks = (chosen * kp).unsqueeze(-1) + torch.arange(kp, device=x.device)
            toks = toks.masked_fill(~ok.unsqueeze(-1), t).flatten(-2)
            mask.scatter_(2, toks, True)
        if ix.tail and kp > 1:
            pos = torch.arange(t, device=x.device)
            count = (pos + 1) % kp
            offs = torch.arange(kp - 1, device=x.device)
            tail = (pos + 1 - count).unsqueeze(-1) + offs
            tail = tail.masked_fill(offs >= count.unsqueeze(-1), t)
            mask.scatter_(2, tail.expand(b, -1, -1), True)
    return mask[..., :t], scores


def indexer_loss(ix, x: torch.Tensor, q_resid: torch.Tensor, attn_probs: torch.Tensor) -> torch.Tensor:
    """KL(attention mass per visible pool || indexer softmax), mean over queries that see a pool.

    attn_probs: dense causal attention [B, H, T, T] (detached)."""
    b, t, _ = x.shape
    kp = ix.kpool
    n_pools = t // kp
    if n_pools == 0:
        return x.new_zeros(())
    scores = _pool_scores(ix, x.detach(), q_resid.detach())
    visible = _visible(t, kp, n_pools, x.device)
    mass = attn_probs.sum(1)[..., :n_pools * kp].reshape(b, t, n_pools, kp).sum(-1)   # [B, T, P]
    mass = mass.masked_fill(~visible, 0.0)
    rows = visible.any(-1)                                                           # [T]
    target = mass / mass.sum(-1, keepdim=True).clamp_min(1e-9)
    logp = scores.masked_fill(~visible, float("-inf")).log_softmax(-1)
    kl = (target * (target.clamp_min(1e-9).log() - logp.masked_fill(~visible, 0.0))).sum(-1)
    return kl[:, rows].mean()


def mla(attn, x: torch.Tensor, prev_mask: torch.Tensor | None,
        want_indexer_loss: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> (output [B, T, D], selection mask [B, T, T], indexer loss or None)."""
    b, t, _ = x.shape
    h, nope, vd = attn.heads, attn.nope, attn.v_dim
    q_resid = rms_norm(linear(x, attn.q_a_proj), attn.q_a_layernorm.weight, attn.q_a_layernorm.eps)
    q = linear(q_resid, attn.q_b_proj).view(b, t, h, nope).transpose(1, 2)
    latent = linear(x, attn.kv_a_proj_with_mqa)[..., :attn.rank]
    latent = rms_norm(latent, attn.kv_a_layernorm.weight, attn.kv_a_layernorm.eps)
    kv = linear(latent, attn.kv_b_proj).view(b, t, h, nope + vd)
    k, v = (y.transpose(1, 2) for y in kv.split([nope, vd], dim=-1))
    if attn.indexer is not None:
        mask, _ = selection_mask(attn.indexer, x, q_resid)
    elif prev_mask is None:
        raise ValueError(f"layer {attn.layer}: a shared indexer layer needs the previous layer's selection")
    else:
        mask = prev_mask
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1), scale=attn.scaling)
    out = linear(out.transpose(1, 2).reshape(b, t, h * vd), attn.o_proj)
    aux = None
    if want_indexer_loss and attn.indexer is not None:
        with torch.no_grad():
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            logits = torch.matmul(q, k.transpose(-1, -2)).float() * attn.scaling
            probs = logits.masked_fill(~causal, float("-inf")).softmax(-1)
        aux = indexer_loss(attn.indexer, x, q_resid, probs)
    return out, mask, aux
