"""DSA indexer with k-pools (transformers' Glm5NextTextIndexer), replicated on every rank.

Per token it caches a key (LayerNorm(wk x)) and a gate vector (x @ compress_gate^T). When a
pool of `index_kpool` tokens fills, its pooled key (softmax(gate + ape) over the pool's tokens,
per channel, times the keys) is computed once and cached. A query scores every complete pool
it can see, keeps the best `index_topk / index_kpool` pools, expands them to token positions
and appends its unfinished tail. The selection is returned as positions [T, W] (-1 = none).

Why replicated: the indexer is small (wq_b 1536 -> 32x128, wk 4096 -> 128) and every rank
must attend to the same positions; computing it everywhere costs less than broadcasting it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tpserve.model.batch import CacheTensors, ForwardBatch
from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext, replicated
from tpserve.model.weights import REPLICATED, declare

QUERY_BLOCK = 2048  # prefill queries scored per step
# --prefill-together: a step's prefill rows select at once, not a sequence at a time, where every pool they see is
# kept (no sequence has more pools than the top-k: the selection is every visible pool, whatever the ties) and
# rows x pools x head_dim is at most this
BATCHED_SELECT_ELEMENTS = 1 << 24


class LayerNorm(nn.Module):
    def __init__(self, ctx: ShardContext, dim: int, eps: float):
        super().__init__()
        declare(self, "weight", (dim,), REPLICATED, dtype=ctx.dtype, world=ctx.world)
        declare(self, "bias", (dim,), REPLICATED, dtype=ctx.dtype, world=ctx.world)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def selection_width(cfg: ModelConfig) -> int:
    return cfg.index_topk + (cfg.index_kpool - 1 if cfg.index_kpool_always_select_tail else 0)


def token_rows(block_tables: torch.Tensor, token_seq: torch.Tensor, positions: torch.Tensor,
               block_size: int) -> torch.Tensor:
    """Flat cache rows of `positions` [N, M] (-1 allowed) of the sequences token_seq [N] owns,
    without materialising a per-token copy of the block tables."""
    safe = positions.clamp(min=0)
    blocks = block_tables[token_seq.unsqueeze(-1), safe // block_size]
    return blocks * block_size + safe % block_size


def cache_rows(block_tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat cache rows of token `positions` [B, N] (-1 allowed) through block tables [B, nb]."""
    safe = positions.clamp(min=0)
    blocks = block_tables.gather(1, safe // block_size)
    return blocks * block_size + safe % block_size


class Indexer(nn.Module):
    def __init__(self, ctx: ShardContext, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.ops = layer, ctx.ops
        self.together = ctx.ops.kernels.prefill_together
        # truthy with --indexer-backend triton: pool compression, decode scores and selection in
        # kernels/attention/indexer_triton.py (the decode top-k there too with --indexer-topk-backend triton)
        self.fused_pools = bool(ctx.ops.fill_pools)
        self.n_heads, self.head_dim, self.kpool = cfg.index_n_heads, cfg.index_head_dim, cfg.index_kpool
        self.pools_to_keep = cfg.index_topk // cfg.index_kpool
        self.tail = cfg.index_kpool_always_select_tail
        self.width = selection_width(cfg)
        self.wq_b = replicated(ctx, cfg.q_lora_rank, self.n_heads * self.head_dim)
        self.wk = replicated(ctx, cfg.hidden_size, self.head_dim)
        self.k_norm = LayerNorm(ctx, self.head_dim, 1e-6)
        self.weights_proj = replicated(ctx, cfg.hidden_size, self.n_heads)
        declare(self, "index_kpool_compress_ape", (self.kpool, self.head_dim), REPLICATED, dtype=ctx.dtype,
                world=ctx.world)
        declare(self, "index_kpool_compress_gate", (self.head_dim, cfg.hidden_size), REPLICATED,
                dtype=ctx.dtype, world=ctx.world)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, q_resid: torch.Tensor, batch: ForwardBatch,
                cache: CacheTensors) -> torch.Tensor:
        """-> selected positions [T, W] (long, -1 padded)."""
        keys_flat = cache.index_k[self.layer].view(-1, self.head_dim)
        gates_flat = cache.index_gate[self.layer].view(-1, self.head_dim)
        keys_flat[batch.slot_mapping] = self.k_norm(self.wk(x)).to(keys_flat.dtype)
        gates_flat[batch.slot_mapping] = F.linear(x, self.index_kpool_compress_gate).to(gates_flat.dtype)
        self._fill_pools(batch, cache)
        q = self.wq_b(q_resid).view(x.shape[0], self.n_heads, self.head_dim)
        w = self.weights_proj(x).float() * (self.n_heads ** -0.5)
        nd = batch.decode_tokens
        if nd == x.shape[0]:
            return self._select_tokens(q, w, batch, cache)
        out = torch.full((x.shape[0], self.width), -1, dtype=torch.long, device=x.device)
        if nd:
            out[:nd] = self._select_tokens(q[:nd], w[:nd], batch, cache)
        prefill = range(batch.decode_seqs, batch.num_seqs)
        pools = max(map(batch.total_len, prefill)) // self.kpool
        if self.together and len(prefill) > 1 and pools <= self.pools_to_keep \
                and (x.shape[0] - nd) * max(pools, 1) * self.head_dim <= BATCHED_SELECT_ELEMENTS:
            out[nd:] = self._select_prefill(q[nd:], w[nd:], batch, cache, pools)
            return out
        for i in prefill:
            a, b = batch.cu_seqlens[i], batch.cu_seqlens[i + 1]
            pos = batch.positions[a:b]
            n_pools = batch.total_len(i) // self.kpool
            pool_keys = self._pool_keys(batch.block_tables[i:i + 1], n_pools, cache)[0]
            for c in range(a, b, QUERY_BLOCK):  # bounded memory for long prompts
                d = min(c + QUERY_BLOCK, b)
                scores = self._scores(q[c:d], w[c:d], pool_keys)                   # [n, P]
                visible = (torch.arange(n_pools, device=x.device) + 1) * self.kpool <= pos[c - a:d - a, None] + 1
                out[c:d] = self._expand(scores, visible, pos[c - a:d - a])
        return out

    # ------------------------------------------------------------------ pools
    def _fill_pools(self, batch: ForwardBatch, cache: CacheTensors) -> None:
        """Compute the pooled key of every pool that this step completes, on the device.

        Every token computes the pool that ends at it; tokens that end no pool write theirs to the
        reserved dummy block's pool row (the last one), so no host loop or host read is needed."""
        pool_flat = cache.pool_k[self.layer].view(-1, self.head_dim)
        if self.fused_pools:  # the pools' rows found in the kernel; tokens that complete none write nothing
            self.ops.fill_pools(cache.index_k[self.layer].view(-1, self.head_dim),
                                cache.index_gate[self.layer].view(-1, self.head_dim), self.index_kpool_compress_ape,
                                batch.positions, batch.token_seq, batch.block_tables, cache.block_size, pool_flat)
            return
        rows, target = batch.memoized(("fill_pools", self.kpool, cache.block_size, pool_flat.shape[0]),
                                      lambda: self._fill_rows(batch, cache.block_size, pool_flat.shape[0] - 1))
        keys = cache.index_k[self.layer].view(-1, self.head_dim)[rows]
        gates = cache.index_gate[self.layer].view(-1, self.head_dim)[rows]
        probs = (gates.float() + self.index_kpool_compress_ape.float()).softmax(dim=1).to(keys.dtype)
        pooled = (probs * keys).sum(dim=1)
        pool_flat[target] = pooled.to(pool_flat.dtype)

    def _fill_rows(self, batch: ForwardBatch, block_size: int, dummy_row: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (cache rows [T, kpool] of the pool ending at each token, the pool row each token writes:
        its pool's where the token completes one, else `dummy_row`)."""
        pos = batch.positions
        first = (pos + 1 - self.kpool).clamp(min=0)
        toks = first.unsqueeze(-1) + torch.arange(self.kpool, device=pos.device)      # [T, kpool]
        rows = token_rows(batch.block_tables, batch.token_seq, toks, block_size)
        completes = (pos + 1) % self.kpool == 0
        dummy = torch.full_like(rows[:, 0], dummy_row)
        return rows, torch.where(completes, rows[:, 0] // self.kpool, dummy)  # block * (bs / kpool) + offset / kpool

    def _pool_keys(self, block_tables: torch.Tensor, n_pools: int, cache: CacheTensors) -> torch.Tensor:
        """Pooled keys of pools 0..n_pools-1 for each row of block_tables -> [B, n_pools, dim]."""
        starts = (torch.arange(n_pools, device=block_tables.device) * self.kpool).expand(block_tables.shape[0], -1)
        rows = cache_rows(block_tables, starts, cache.block_size) // self.kpool
        return cache.pool_k[self.layer].view(-1, self.head_dim)[rows]

    # -------------------------------------------------------------- scoring
    def _scores(self, q: torch.Tensor, w: torch.Tensor, pool_keys: torch.Tensor) -> torch.Tensor:
        """q [n, H, d], w [n, H], pool_keys [.., P, d] -> index scores [n, P] (fp32)."""
        s = torch.matmul(q.float(), pool_keys.transpose(-1, -2).float())           # [n, H, P]
        s = F.relu(s * self.head_dim ** -0.5)
        return torch.matmul(w.unsqueeze(-2), s).squeeze(-2)

    def _expand(self, scores: torch.Tensor, visible: torch.Tensor | None, pos: torch.Tensor,
                batch: ForwardBatch | None = None) -> torch.Tensor:
        """Top pools among the visible ones, as token positions, plus the tail -> [n, W] (the tail from
        `batch`'s memo when it is given: decode rows, the same in every layer). visible None: the fused
        decode path (scores of invisible pools are float32's lowest already; the expansion is one kernel)."""
        n, n_pools = scores.shape
        k = min(self.pools_to_keep, n_pools)
        if visible is None and k > 0:  # positions, validity and tail in one kernel
            chosen = self.ops.top_pools(scores, pos, k, self.kpool)
            return self.ops.expand_selection(chosen, pos, self.width, self.pools_to_keep, self.kpool, self.tail)
        out = torch.full((n, self.width), -1, dtype=torch.long, device=scores.device)
        if k > 0:
            masked = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
            chosen = masked.topk(k, dim=-1).indices                                 # [n, k]
            ok = visible.gather(-1, chosen)
            toks = (chosen * self.kpool).unsqueeze(-1) + torch.arange(self.kpool, device=scores.device)
            toks = toks.masked_fill(~ok.unsqueeze(-1), -1).flatten(-2)
            out[:, :toks.shape[1]] = toks
        if self.tail and self.kpool > 1:
            tail = self._tail(pos) if batch is None else batch.memoized(("tail", n, self.kpool),
                                                                        lambda: self._tail(pos))
            out[:, self.pools_to_keep * self.kpool:] = tail
        return out

    def _tail(self, pos: torch.Tensor) -> torch.Tensor:
        """The unfinished pool's positions before each query (its own included) [n, kpool - 1], -1 padded."""
        count = (pos + 1) % self.kpool
        offs = torch.arange(self.kpool - 1, device=pos.device)
        tail = (pos + 1 - count).unsqueeze(-1) + offs
        return tail.masked_fill(offs >= count.unsqueeze(-1), -1)

    def _select_tokens(self, q: torch.Tensor, w: torch.Tensor, batch: ForwardBatch,
                       cache: CacheTensors) -> torch.Tensor:
        """Decode / verify tokens (the first q.shape[0] rows): each scores the pools of its own
        sequence, invisible pools masked; in a graph step over the block table's whole width."""
        n = q.shape[0]
        pos = batch.positions[:n]
        if batch.fixed_shapes:
            n_pools = batch.block_tables.shape[1] * cache.block_size // self.kpool
        else:  # the reference's width: exact ties between pool scores are broken by top-k's algorithm,
            # which depends on the width (tie choices can differ from the fixed-width graph step)
            n_pools = max(batch.total_len(i) for i in range(batch.decode_seqs)) // self.kpool
        if self.fused_pools:
            scores = self.ops.pool_scores(q, w, pos, batch.token_seq[:n], batch.block_tables,
                                          cache.pool_k[self.layer].view(-1, self.head_dim), cache.block_size,
                                          self.kpool, n_pools)
            return self._expand(scores, None, pos, batch)
        rows, visible = batch.memoized(("select", n, n_pools, self.kpool, cache.block_size),
                                       lambda: self._select_rows(batch, n, n_pools, cache.block_size))
        pool_keys = cache.pool_k[self.layer].view(-1, self.head_dim)[rows]            # [n, P, d]
        scores = self._scores(q.unsqueeze(1), w.unsqueeze(1), pool_keys.unsqueeze(1)).squeeze(1)
        return self._expand(scores, visible, pos, batch)

    def _select_prefill(self, q: torch.Tensor, w: torch.Tensor, batch: ForwardBatch, cache: CacheTensors,
                        n_pools: int) -> torch.Tensor:
        """Every prefill row (after the decode rows) scores the first n_pools pools of its own sequence, the
        ones it cannot see masked, as decode rows do."""
        nd, n = batch.decode_tokens, q.shape[0]
        rows, visible = batch.memoized(("select_prefill", n, n_pools, self.kpool, cache.block_size),
                                       lambda: self._select_rows(batch, n, n_pools, cache.block_size, first=nd))
        pool_keys = cache.pool_k[self.layer].view(-1, self.head_dim)[rows]            # [n, P, d]
        scores = self._scores(q.unsqueeze(1), w.unsqueeze(1), pool_keys.unsqueeze(1)).squeeze(1)
        return self._expand(scores, visible, batch.positions[nd:nd + n])

    def _select_rows(self, batch: ForwardBatch, n: int, n_pools: int, block_size: int, first: int = 0):
        """-> (pool rows [n, n_pools] of the sequence of each of the n tokens from row `first`, which of them it
        sees [n, n_pools])."""
        pos = batch.positions[first:first + n]
        starts = (torch.arange(n_pools, device=pos.device) * self.kpool).expand(n, -1)
        rows = token_rows(batch.block_tables, batch.token_seq[first:first + n], starts, block_size) // self.kpool
        visible = (torch.arange(n_pools, device=pos.device) + 1) * self.kpool <= pos.unsqueeze(-1) + 1
        return rows, visible
