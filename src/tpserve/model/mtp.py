"""The MTP ("nextn") drafter: checkpoint layer `num_hidden_layers` of GLM-5.3-Flash.

One draft step at position p reads the main model's hidden state at p (after its final norm) and
the embedding of token p+1, and predicts token p+2:

    x = eh_proj(cat[enorm(embed(token p+1)), hnorm(hidden p)])  -> decoder block (MLA with a full
    indexer + MoE, with mHC streams) -> mean of the streams = the next depth's hidden
    logits = lm_head(shared_head.norm(that hidden))

Chaining k steps drafts k tokens: depth d reads depth d-1's hidden. The embedding and the LM head
are the main model's. The block's MLA / indexer cache is layer `num_hidden_layers` of the cache
(same blocks and block tables as the main model's layers, so no second allocator is needed).
This is the layout `train/model.py` trains and writes (the built-in demo model has it).
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


class MtpLayer(DecoderLayer):
    """A DecoderLayer (index num_hidden_layers of mtp_config(cfg)) plus enorm, hnorm, eh_proj and
    shared_head.norm: its parameter names are the checkpoint's after `layers.{L}.`."""

    def __init__(self, ctx: ShardContext, cfg: ModelConfig):
        super().__init__(ctx, mtp_config(cfg), cfg.num_hidden_layers)
        d = cfg.hidden_size
        self.hc_mult = cfg.hc_mult
        self.enorm = RMSNorm(ctx, d, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(ctx, d, cfg.rms_norm_eps)
        self.eh_proj = replicated(ctx, 2 * d, d)
        self.shared_head = SharedHead(ctx, cfg)

    def draft(self, hidden: torch.Tensor, embedded: torch.Tensor, batch: ForwardBatch,
              cache: CacheTensors) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, D] (depth d-1), embedded [T, D] (embedding of token p+1) -> (hidden [T, D] of
        depth d, its shared_head.norm rows [T, D] for the LM head)."""
        batch.memo.clear()
        x = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))
        streams = x.unsqueeze(1).expand(-1, self.hc_mult, -1).contiguous()
        streams, _ = self(streams, batch, cache, None)
        new_hidden = streams.mean(dim=1)
        return new_hidden, self.shared_head.norm(new_hidden)
