"""MLA with NoPE and DSA sparse selection (transformers' Glm5NextTextAttention), heads split.

Only the normalised 512-wide latent is cached (replicated on every rank, paged in blocks).
Prefill chunks expand the latent of the whole context into per-head keys/values and run SDPA
under the selection mask (dense), or absorb kv_b_proj like decode tokens and attend over their selected rows
only (sparse: `--mla-prefill`, auto from 8,192 positions); decode and verify tokens (also inside a mixed step)
absorb kv_b_proj into the query and attend over their selected latent rows only (with `--mla-decode-backend
triton` read from the paged cache in place by kernels/attention/mla_triton.py, else gathered by torch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from tpserve.model import merged
from tpserve.model.batch import CacheTensors, ForwardBatch
from tpserve.model.config import ModelConfig
from tpserve.model.indexer import Indexer, cache_rows, token_rows
from tpserve.model.layers import RMSNorm, ShardContext, column, replicated, row

QUERY_BLOCK = 1024  # prefill queries attended per SDPA call
SPARSE_QUERY_BLOCK = 256  # sparse prefill queries per gather of their selected latent rows (torch form)
FUSED_QUERY_BLOCK = 4096  # sparse prefill queries per kernel call (Triton: nothing gathered; bounds q / o in latent)
# dense prefill's SDPA backends: not cuDNN's, which builds a plan for every new shape (on an H100 0.4-0.65 s a
# call the first time a prompt length is met: every new length would wait for it); the efficient kernel takes masks
DENSE_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
# dense prefill (--prefill-together): a step's prefill sequences whose contexts total at most this many positions
# attend in one SDPA call a query block (their keys side by side, each query masked to its own sequence's
# selection), not one call each: a step of many short prompts was bound by the host's launches
BATCHED_PREFILL_POSITIONS = 8192


# --mla-prefill auto: a prefill chunk whose sequence reaches this many positions takes the sparse path (dense
# measured faster at 4k positions, sparse at 8k and beyond: BENCHMARKS.md, sparse MLA prefill)
SPARSE_PREFILL_FROM = 8192


class MlaAttention(nn.Module):
    merged_linears = {"qkv_a": ("q_a_proj", "kv_a_proj_with_mqa")}  # model/merged.py

    def __init__(self, ctx: ShardContext, cfg: ModelConfig, layer: int):
        super().__init__()
        self.prefill_mode = ctx.ops.kernels.mla_prefill
        self.together = ctx.ops.kernels.prefill_together
        self.sparse_mla = ctx.ops.sparse_mla  # truthy: kernels/attention/mla_triton.py reads the paged latent in place
        d, bias = cfg.hidden_size, cfg.attention_bias
        self.layer = layer
        self.heads = ctx.split(cfg.num_attention_heads, "num_attention_heads")
        self.nope, self.v_dim, self.rank = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        self.scaling = cfg.qk_head_dim ** -0.5
        self.q_a_proj = replicated(ctx, d, cfg.q_lora_rank, bias=bias)
        self.q_a_layernorm = RMSNorm(ctx, cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = column(ctx, cfg.q_lora_rank, cfg.num_attention_heads * cfg.qk_head_dim)
        self.kv_a_proj_with_mqa = replicated(ctx, d, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(ctx, cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = column(ctx, cfg.kv_lora_rank, cfg.num_attention_heads * (self.nope + self.v_dim))
        self.o_proj = row(ctx, cfg.num_attention_heads * self.v_dim, d, bias=bias)
        self.indexer = Indexer(ctx, cfg, layer) if cfg.indexer_is_full(layer) else None

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: CacheTensors,
                prev_selection: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (partial output [T, D], selection [T, W] used here)."""
        t = x.shape[0]
        qa, kva = merged.outputs(self, "qkv_a", x, contiguous=True)
        q_resid = self.q_a_layernorm(qa)
        q = self.q_b_proj(q_resid).view(t, self.heads, self.nope)
        latent = self.kv_a_layernorm(kva[..., :self.rank])
        latent_flat = cache.latent[self.layer].view(-1, self.rank)
        latent_flat[batch.slot_mapping] = latent.to(latent_flat.dtype)
        if prev_selection is not None:  # a shared-indexer layer, or the MTP layer's chained depths
            selection = prev_selection
        elif self.indexer is not None:
            selection = self.indexer(x, q_resid, batch, cache)
        else:
            raise ValueError(f"layer {self.layer}: a shared indexer layer needs the previous layer's selection")
        nd = batch.decode_tokens
        bs = cache.block_size
        if nd == t:
            out = self._sparse(q, selection, batch.token_seq, batch.block_tables, latent_flat, bs)
        else:
            out = torch.empty(t, self.heads * self.v_dim, dtype=x.dtype, device=x.device)
            if nd:
                out[:nd] = self._sparse(q[:nd], selection[:nd], batch.token_seq, batch.block_tables, latent_flat, bs)
            prefill = range(batch.decode_seqs, batch.num_seqs)
            if self.together and len(prefill) > 1 and not any(self._sparse_prefill(batch, i) for i in prefill) \
                    and sum(map(batch.total_len, prefill)) <= BATCHED_PREFILL_POSITIONS:
                out[nd:] = self._prefill_batched(q[nd:], selection[nd:], batch, latent_flat, bs)
            else:
                for i in prefill:
                    a, b = batch.cu_seqlens[i], batch.cu_seqlens[i + 1]
                    if self._sparse_prefill(batch, i):
                        step = FUSED_QUERY_BLOCK if self.sparse_mla else SPARSE_QUERY_BLOCK
                        for c in range(a, b, step):  # bounded memory: block x width x latent rows
                            d = min(c + step, b)
                            out[c:d] = self._sparse(q[c:d], selection[c:d], batch.token_seq[c:d],
                                                    batch.block_tables, latent_flat, bs, prefill=True)
                    else:
                        out[a:b] = self._prefill_seq(q[a:b], selection[a:b], batch.block_tables[i:i + 1],
                                                     batch.total_len(i), latent_flat, bs)
        return self.o_proj(out), selection

    def _sparse_prefill(self, batch: ForwardBatch, i: int) -> bool:
        return self.prefill_mode == "sparse" or (self.prefill_mode == "auto"
                                                 and batch.total_len(i) >= SPARSE_PREFILL_FROM)

    def _kv_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.kv_b_proj.weight.view(self.heads, self.nope + self.v_dim, self.rank)
        return w[:, :self.nope], w[:, self.nope:]

    def _prefill_seq(self, q: torch.Tensor, sel: torch.Tensor, block_table: torch.Tensor, total: int,
                     latent_flat: torch.Tensor, block_size: int) -> torch.Tensor:
        rows = cache_rows(block_table, torch.arange(total, device=q.device).unsqueeze(0), block_size)[0]
        return self._attend(q, torch.where(sel >= 0, sel, total), rows, latent_flat)

    def _prefill_batched(self, q: torch.Tensor, sel: torch.Tensor, batch: ForwardBatch, latent_flat: torch.Tensor,
                         block_size: int) -> torch.Tensor:
        """Dense attention of every prefill row (after the decode rows) at once: the contexts of their sequences
        side by side as keys, each query masked to its selected positions shifted to its sequence's place."""
        rows, shift, total = batch.memoized(("mla_contexts", block_size), lambda: _contexts(batch, block_size))
        return self._attend(q, torch.where(sel >= 0, sel + shift.unsqueeze(1), total), rows, latent_flat)

    def _attend(self, q: torch.Tensor, cols: torch.Tensor, rows: torch.Tensor,
                latent_flat: torch.Tensor) -> torch.Tensor:
        """SDPA of queries q [n, H, d] over keys / values expanded from the latent cache rows `rows` [K], each query
        attending the key columns cols [n, W] names (K: none)."""
        n, total = q.shape[0], rows.shape[0]
        kv = self.kv_b_proj(latent_flat[rows].to(q.dtype)).view(total, self.heads, self.nope + self.v_dim)
        k, v = (x.transpose(0, 1).unsqueeze(0) for x in kv.split([self.nope, self.v_dim], dim=-1))
        out = torch.empty(n, self.heads * self.v_dim, dtype=q.dtype, device=q.device)
        with sdpa_kernel(DENSE_SDPA):
            for a in range(0, n, QUERY_BLOCK):  # bounded memory for long prompts
                b = min(a + QUERY_BLOCK, n)
                mask = torch.zeros(b - a, total + 1, dtype=torch.bool, device=q.device)
                mask.scatter_(1, cols[a:b], True)
                o = F.scaled_dot_product_attention(q[a:b].transpose(0, 1).unsqueeze(0), k, v,
                                                   attn_mask=mask[None, None, :, :total], scale=self.scaling)
                out[a:b] = o[0].transpose(0, 1).reshape(b - a, self.heads * self.v_dim)
        return out

    def _sparse(self, q: torch.Tensor, sel: torch.Tensor, token_seq: torch.Tensor, block_tables: torch.Tensor,
                latent_flat: torch.Tensor, block_size: int, prefill: bool = False) -> torch.Tensor:
        """Attention in latent space over each token's selected cache rows only (kv_b_proj absorbed
        into the query and the output): decode / verify tokens, and prefill queries when sparse.
        q [N, H, d], sel [N, W], token_seq [>= N] (the owning sequence of each row)."""
        w_uk, w_uv = self._kv_weights()
        q_lat = torch.einsum("bhd,hdc->bhc", q, w_uk)
        if self.sparse_mla:
            from tpserve.kernels.attention.mla_triton import DECODE, PREFILL  # (with the Triton kernel only)

            o_lat = self.sparse_mla(q_lat, sel, token_seq[:q.shape[0]], block_tables, latent_flat, block_size,
                                    self.scaling, config=PREFILL if prefill else DECODE)
        else:
            rows = token_rows(block_tables, token_seq[:q.shape[0]], sel, block_size)
            lat = latent_flat[rows].to(q.dtype)                                      # [N, W, c]
            scores = torch.einsum("bhc,bwc->bhw", q_lat, lat).float() * self.scaling
            scores = scores.masked_fill((sel < 0).unsqueeze(1), float("-inf"))
            # a query with nothing selected (no complete pool yet and no tail) attends to nothing: output 0,
            # as SDPA gives for a fully masked row
            probs = scores.softmax(dim=-1).masked_fill((sel < 0).all(-1)[:, None, None], 0.0).to(q.dtype)
            o_lat = torch.einsum("bhw,bwc->bhc", probs, lat)
        return torch.einsum("bhc,hvc->bhv", o_lat, w_uv).reshape(q.shape[0], self.heads * self.v_dim)


def _contexts(batch: ForwardBatch, block_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The prefill sequences' contexts side by side -> (their cache rows [K], each prefill row's offset into them
    [prefill rows], K)."""
    prefill = range(batch.decode_seqs, batch.num_seqs)
    totals = torch.tensor([batch.total_len(i) for i in prefill])
    starts = totals.cumsum(0) - totals
    owner = torch.tensor(prefill).repeat_interleave(totals)
    positions = torch.arange(int(totals.sum())) - starts.repeat_interleave(totals)
    shift = starts.repeat_interleave(torch.tensor([batch.seq_len(i) for i in prefill]))
    dev = batch.block_tables.device
    owner, positions, shift = (t.to(dev, non_blocking=True) for t in (owner, positions, shift))
    rows = token_rows(batch.block_tables, owner, positions.unsqueeze(-1), block_size).squeeze(-1)
    return rows, shift, int(totals.sum())
