"""GLM-5.3-Flash text model: embedding, hybrid decoder layers with mHC, mean head, LM head.

Tensor parallel: vocab-parallel embedding and LM head, head-split attention, split MLP/experts;
each block's partial output is summed with one all-reduce, fused with the mHC expand that follows
it (Communicator.all_reduce_hc_expand; --fused-collectives). With sequence parallelism the mHC
streams stay split by token across ranks: all-gather before a block, reduce-scatter after; an MoE
block on the grouped experts path then has its combine done inside the reduce-scatter
(Communicator.reduce_scatter_moe_combine; --fused-collectives).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tpserve.collectives.fused import pad_rows
from tpserve.model.batch import CacheTensors, ForwardBatch
from tpserve.model.config import ModelConfig
from tpserve.model.kda import KdaAttention
from tpserve.model.layers import RMSNorm, ShardContext
from tpserve.model.mhc import HyperConnection
from tpserve.model.mla import MlaAttention
from tpserve.model.mlp import DenseMLP
from tpserve.model.moe import MoE, SortedMoeOutput
from tpserve.model.weights import Shard, declare

VOCAB_SHARD = Shard(dim=0, pad=True)


class DecoderLayer(nn.Module):
    """A decoder layer with mHC around its blocks; mhc=False builds the blocks alone (the MTP layer,
    model/mtp.py, is a plain-residual block: no hc_* tensors)."""

    def __init__(self, ctx: ShardContext, cfg: ModelConfig, layer: int, mhc: bool = True):
        super().__init__()
        self.is_mla = cfg.layer_types[layer] == "indexed_attention"
        if self.is_mla:
            self.self_attn = MlaAttention(ctx, cfg, layer)
        else:
            self.self_attn = KdaAttention(ctx, cfg, layer)
        if cfg.mlp_layer_types[layer] == "sparse":
            self.mlp = MoE(ctx, cfg)
        else:
            self.mlp = DenseMLP(ctx, cfg.hidden_size, cfg.intermediate_size, cfg.swiglu_limit)
        self.input_layernorm = RMSNorm(ctx, cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(ctx, cfg.hidden_size, cfg.rms_norm_eps)
        if mhc:
            self.attn_hc = HyperConnection(ctx, cfg)
            self.ffn_hc = HyperConnection(ctx, cfg)
        self.comm = ctx.comm
        self.fused_expand = ctx.ops.kernels.fused_collectives and self.comm.world_size > 1
        # with sequence parallelism: the MoE's combine inside the reduce-scatter (grouped experts)
        self.fold_moe = self.fused_expand and isinstance(self.mlp, MoE)

    def forward(self, streams: torch.Tensor, batch: ForwardBatch, cache: CacheTensors,
                prev_selection: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        selection = None
        post, comb, x = self.attn_hc(streams, batch.has_prefill)
        x = self._gather(self.input_layernorm(x), batch)
        if self.is_mla:
            out, selection = self.self_attn(x, batch, cache, prev_selection)
        else:
            out = self.self_attn(x, batch, cache)
        streams = self._reduce_expand(self.attn_hc, out, streams, post, comb, batch)
        post, comb, x = self.ffn_hc(streams, batch.has_prefill)
        x = self._gather(self.post_attention_layernorm(x), batch)
        fold = self.fold_moe and batch.sequence_parallel
        out = self.mlp.forward_unreduced(x) if fold else self.mlp(x)
        streams = self._reduce_expand(self.ffn_hc, out, streams, post, comb, batch)
        return streams, selection

    def _gather(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        if not batch.sequence_parallel:
            return x
        return self.comm.all_gather(x, dim=0)[:batch.num_tokens]

    def _reduce_expand(self, hc: HyperConnection, partial: torch.Tensor | SortedMoeOutput,
                       streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                       batch: ForwardBatch) -> torch.Tensor:
        """The streams after a block: its rank-partial output summed and mixed in by the mHC
        expand; one fused collective with --fused-collectives at TP > 1 without sequence
        parallelism (the same arithmetic: collectives/fused.py). With it, an MoE's uncombined output
        (SortedMoeOutput, only under sequence parallelism) is combined by the reduce-scatter."""
        if self.fused_expand and not batch.sequence_parallel:
            return self.comm.all_reduce_hc_expand(partial, streams, post, comb)
        return hc.mix(self._reduce(partial, batch), streams, post, comb)

    def _reduce(self, partial: torch.Tensor | SortedMoeOutput, batch: ForwardBatch) -> torch.Tensor:
        if isinstance(partial, SortedMoeOutput):  # (sequence parallel only)
            return self.comm.reduce_scatter_moe_combine(partial.y, partial.order, partial.weights,
                                                        partial.shared, combine=partial.combine)
        if not batch.sequence_parallel:
            return self.comm.all_reduce(partial)
        return self.comm.reduce_scatter(pad_rows(partial, self.comm.world_size), dim=0)


class VocabTable(nn.Module):
    """[vocab, hidden] table split by vocab rows across ranks (padded to a multiple of the world)."""

    def __init__(self, ctx: ShardContext, cfg: ModelConfig):
        super().__init__()
        declare(self, "weight", (cfg.vocab_size, cfg.hidden_size), VOCAB_SHARD, dtype=ctx.dtype, world=ctx.world)


class Glm5NextModel(nn.Module):
    def __init__(self, ctx: ShardContext, cfg: ModelConfig):
        super().__init__()
        self.cfg, self.ctx = cfg, ctx
        self.vocab_per_rank = -(-cfg.vocab_size // ctx.world)
        self.embed_tokens = VocabTable(ctx, cfg)
        self.layers = nn.ModuleList(DecoderLayer(ctx, cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(ctx, cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else VocabTable(ctx, cfg)

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed_weight if self.lm_head is None else self.lm_head.weight

    def embed(self, ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        comm = self.ctx.comm
        if comm.world_size == 1:
            return F.embedding(ids, self.embed_weight)
        local = ids - self.ctx.rank * self.vocab_per_rank
        inside = (local >= 0) & (local < self.vocab_per_rank)
        x = F.embedding(local.clamp(0, self.vocab_per_rank - 1), self.embed_weight) * inside.unsqueeze(-1)
        if batch.sequence_parallel:
            return comm.reduce_scatter(pad_rows(x, comm.world_size), dim=0)
        return comm.all_reduce(x)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: CacheTensors) -> torch.Tensor:
        """-> next-token logits [len(batch.logits_indices), vocab] in fp32."""
        return self.forward_hidden(batch, cache)[0]

    @torch.inference_mode()
    def forward_hidden(self, batch: ForwardBatch, cache: CacheTensors) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (logits as `forward` gives them, hidden [T, D] after the final norm: the MTP drafter's input)."""
        batch.memo.clear()
        x = self.embed(batch.input_ids, batch)
        streams = x.unsqueeze(1).expand(-1, self.cfg.hc_mult, -1).contiguous()
        selection = None
        for layer in self.layers:
            streams, produced = layer(streams, batch, cache, selection)
            selection = produced if layer.is_mla and self.cfg.shares_topk_forward(layer.self_attn.layer) else None
        hidden = self.norm(streams.mean(dim=1))
        if batch.sequence_parallel:
            hidden = self.ctx.comm.all_gather(hidden, dim=0)[:batch.num_tokens]
        return self.lm_logits(hidden[batch.logits_indices]), hidden

    def lm_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """LM head on normed rows [N, D] -> fp32 logits [N, vocab] (gathered across ranks)."""
        logits = F.linear(rows, self.head_weight)
        if self.ctx.world > 1:
            logits = self.ctx.comm.all_gather(logits, dim=-1)
        return logits[:, :self.cfg.vocab_size].float()
