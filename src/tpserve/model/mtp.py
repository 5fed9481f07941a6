"""The MTP ("nextn") drafter: checkpoint layer `num_hidden_layers` of GLM-5.3-Flash, published layout.

One draft step at position p reads the main model's hidden state h at p (the mean of its mHC streams
after the final norm) and the embedding e of token p+1 (zero where p == 0), and predicts token p+2:

    x   = eh_proj(cat[enorm(e), hnorm(h)])       the two norms in fp32 with fp32 weights, one cast back
    r   = x + MLA(input_layernorm(x))            plain residual: the layer has no mHC (no hc_* tensors)
    out = shared_head.norm(r + MoE(post_attention_layernorm(r)))
    logits = lm_head(out)

`out` (normed) is also the hidden state the next chained depth reads. With `index_share_for_mtp_iteration`
(config) a chained depth skips the indexer and attends over the selection its sequence's catch-up row had
(the last verified position's): nothing drafted since is added. This is vLLM's
Glm5NextMultiTokenPredictorLayer (docs/checkpoints.md). The embedding and the LM head are the main
model's; the block is MLA with its own full indexer + MoE with shared experts, its linears split over
ranks as the main layers' are. Its MLA / indexer cache is layer `num_hidden_layers` of the cache (same
blocks and block tables as the main model's layers, so no second allocator is needed).
"""

from __future__ import annotations

import dataclasses

import torch

from tpserve.model.batch import CacheTensors, ForwardBatch
from tpserve.model.config import ModelConfig
from tpserve.model.glm5_next import DecoderLayer
from tpserve.model.layers import RMSNorm, ShardContext, replicated


def mtp_config(cfg: ModelConfig) -> ModelConfig:
    """The config with one more layer: the MTP block (MLA + full indexer, MoE)."""
    return dataclasses.replace(
        cfg, num_hidden_layers=cfg.num_hidden_layers + 1,
        layer_types=cfg.layer_types + ("indexed_attention",),
        mlp_layer_types=cfg.mlp_layer_types + ("sparse",),
        indexer_types=cfg.indexer_types + ("full",))


class SharedHead(torch.nn.Module):
    def __init__(self, ctx: ShardContext, cfg: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(ctx, cfg.hidden_size, cfg.rms_norm_eps)


def norm_fp32(x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    """enorm / hnorm as vLLM's fused_eh_norm computes them: normalised and scaled in fp32, cast once."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight.float()).to(x.dtype)


class MtpLayer(DecoderLayer):
    """The blocks of a DecoderLayer without mHC (index num_hidden_layers of mtp_config(cfg)) plus enorm,
    hnorm, eh_proj and shared_head.norm: its parameter names are the checkpoint's after `layers.{L}.`."""

    def __init__(self, ctx: ShardContext, cfg: ModelConfig):
        super().__init__(ctx, mtp_config(cfg), cfg.num_hidden_layers, mhc=False)
        d = cfg.hidden_size
        self.enorm = RMSNorm(ctx, d, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(ctx, d, cfg.rms_norm_eps)
        self.eh_proj = replicated(ctx, 2 * d, d)
        self.shared_head = SharedHead(ctx, cfg)
        self.fused = ctx.ops.kernels.fused_collectives and ctx.world > 1
        self.share_selection = cfg.index_share_for_mtp_iteration

    def forward(self, *args, **kwargs):
        raise TypeError("MtpLayer: call draft() (the layer has no mHC streams)")

    def draft(self, hidden: torch.Tensor, embedded: torch.Tensor, batch: ForwardBatch, cache: CacheTensors,
              selection: torch.Tensor | None = None,
              keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, D] (the main model's, or the previous depth's output), embedded [T, D] (embedding of
        the token after each row's position), selection [T, W] (index sharing: the rows to attend over, the
        indexer skipped) -> (out [T, D]: the LM head's input and the next depth's hidden, the selection used).
        keep [R]: only these rows' out is wanted (out [R, D]): every row still writes its cache rows, but the
        MoE runs on the kept rows alone (a prompt's catch-up keeps its last row). Draft steps never split the
        sequence across ranks (batch.sequence_parallel is False)."""
        batch.memo.clear()
        embedded = embedded.masked_fill((batch.positions == 0).unsqueeze(-1), 0.0)
        x = self.eh_proj(torch.cat([norm_fp32(embedded, self.enorm), norm_fp32(hidden, self.hnorm)], dim=-1))
        attn, selection = self.self_attn(self.input_layernorm(x), batch, cache, selection)
        if keep is not None:
            attn, x = attn[keep], x[keep]
            if keep.numel() == 0:
                return x, selection
        normed, r = self._add_norm(attn, x, self.post_attention_layernorm)
        out, _ = self._add_norm(self.mlp(normed), r, self.shared_head.norm)
        return out, selection

    def _add_norm(self, partial: torch.Tensor, residual: torch.Tensor,
                  norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(r), r) for r = residual + the block's rank-partial output summed over the ranks."""
        if self.fused:
            return self.comm.all_reduce_add_rmsnorm(partial, residual, norm.weight, norm.eps)
        r = residual + self.comm.all_reduce(partial)
        return norm(r), r
