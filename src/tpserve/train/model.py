"""The trainable glm5_next: our model classes for parameters and names, train/blocks.py for math.

`TrainModel` holds a `Glm5NextModel` (main layers) and the MTP layer in the published GLM-5.3-Flash
layout (model/mtp.py's `MtpLayer`): decoder layer `num_hidden_layers` without mHC (MLA with a full
indexer + MoE with shared experts, plain residual) plus `enorm`, `hnorm`, `eh_proj` [hidden, 2*hidden]
and `shared_head.norm`; the LM head and the embedding are shared with the main model. Depth d of the
MTP chain reads the output of depth d-1 (depth 0 = the main model's output after its final norm) and
the embedding of token t+d, and predicts token t+d+1; its rows sit at positions t+d-1 (the engine's),
so depth 1 zeroes the embedding of row 0 (position 0), as the serving recipe does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from tpserve.model.config import ModelConfig
from tpserve.model.glm5_next import Glm5NextModel
from tpserve.model.layers import ShardContext
from tpserve.model.loader import checkpoint_name, old_mtp_layout
from tpserve.model.mtp import MtpLayer
from tpserve.model.weights import checkpoint_sources
from tpserve.train import attention, blocks


@dataclass
class Output:
    logits: torch.Tensor                      # [B, T, V] next-token logits
    hidden: torch.Tensor                      # [B, T, D] after the final norm (MTP depth 0 input)
    mtp_logits: list[torch.Tensor] = field(default_factory=list)   # depth d: [B, T, V], predicts t+d+1
    indexer_losses: list[torch.Tensor] = field(default_factory=list)
    loads: list = field(default_factory=list)   # (router, tokens per expert) per MoE call


class TrainModel(nn.Module):
    def __init__(self, cfg: ModelConfig, mtp: bool = True, device: str | torch.device = "cpu",
                 dense_moe: bool = False):
        super().__init__()
        self.dense_moe = dense_moe  # blocks.moe: every expert over every token (no host sync; for GPUs)
        ctx = ShardContext.single(torch.float32, device)
        with torch.device(device):
            self.model = Glm5NextModel(ctx, cfg)
            self.mtp = MtpLayer(ctx, cfg) if mtp else None
        self.cfg = cfg
        for p in self.parameters():
            p.requires_grad_(not _is_buffer_like(p, self))

    # ------------------------------------------------------------------ forward
    def forward(self, ids: torch.Tensor, mtp_depths: int = 0, aux: bool = False) -> Output:
        m, cfg = self.model, self.cfg
        x = F.embedding(ids, m.embed_tokens.weight)
        streams = x.unsqueeze(2).expand(-1, -1, cfg.hc_mult, -1).contiguous()
        out = Output(logits=None, hidden=None)  # type: ignore[arg-type]
        prev_mask = None
        for layer in m.layers:
            streams, mask = self._layer(layer, streams, prev_mask, out, aux)
            prev_mask = mask if layer.is_mla and cfg.shares_topk_forward(layer.self_attn.layer) else None
        out.hidden = blocks.rms_norm(streams.mean(dim=2), m.norm.weight, m.norm.eps)
        out.logits = F.linear(out.hidden, m.head_weight)
        hidden = out.hidden
        for d in range(1, mtp_depths + 1):
            hidden, logits = self.mtp_step(hidden, torch.roll(ids, -d, dims=1), out, aux, first_position=d - 1)
            out.mtp_logits.append(logits)
        return out

    def mtp_step(self, hidden: torch.Tensor, next_ids: torch.Tensor, out: Output | None = None,
                 aux: bool = False, first_position: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """One MTP depth (model/mtp.py's recipe): hidden [B, T, D] at rows t and token ids [B, T] of t+1,
        row t at position first_position + t -> (out, logits); out (after shared_head.norm) is the next
        depth's hidden."""
        if self.mtp is None:
            raise ValueError("mtp: this model was built without an MTP head")
        h, m = self.mtp, self.model
        e = F.embedding(next_ids, m.embed_tokens.weight)
        if first_position == 0:  # the embedding at position 0 is zero
            e = torch.cat([torch.zeros_like(e[:, :1]), e[:, 1:]], dim=1)
        x = F.linear(torch.cat([blocks.rms_norm_fp32(e, h.enorm.weight, h.enorm.eps),
                                blocks.rms_norm_fp32(hidden, h.hnorm.weight, h.hnorm.eps)], dim=-1), h.eh_proj.weight)
        out = out or Output(None, None)  # type: ignore[arg-type]
        a = blocks.rms_norm(x, h.input_layernorm.weight, h.input_layernorm.eps)
        y, _, loss = attention.mla(h.self_attn, a, None, aux)
        if loss is not None:
            out.indexer_losses.append(loss)
        r = x + y
        y = blocks.moe(h.mlp, blocks.rms_norm(r, h.post_attention_layernorm.weight, h.post_attention_layernorm.eps),
                       out.loads, dense=self.dense_moe)
        normed = blocks.rms_norm(r + y, h.shared_head.norm.weight, h.shared_head.norm.eps)
        return normed, F.linear(normed, m.head_weight)

    def _layer(self, layer, streams, prev_mask, out: Output, aux: bool):
        post, comb, x = blocks.hc_collapse(layer.attn_hc, streams)
        x = blocks.rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.eps)
        mask = None
        if layer.is_mla:
            y, mask, loss = attention.mla(layer.self_attn, x, prev_mask, aux)
            if loss is not None:
                out.indexer_losses.append(loss)
        else:
            y = blocks.kda(layer.self_attn, x)
        streams = blocks.hc_expand(y, streams, post, comb)
        post, comb, x = blocks.hc_collapse(layer.ffn_hc, streams)
        x = blocks.rms_norm(x, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps)
        if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts"):
            y = blocks.moe(layer.mlp, x, out.loads, dense=self.dense_moe)
        else:
            y = blocks.dense_mlp(layer.mlp, x)
        return blocks.hc_expand(y, streams, post, comb), mask

    # ------------------------------------------------------------------ names
    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor under the name transformers writes (MTP as layer num_hidden_layers)."""
        out: dict[str, torch.Tensor] = {}
        for name, (module, src) in checkpoint_sources(self.model).items():
            out[checkpoint_name(name)] = getattr(module, src.target)[src.index]
        if self.mtp is not None:
            for name, (module, src) in checkpoint_sources(self.mtp).items():
                out[checkpoint_name("mtp." + name, self.cfg.num_hidden_layers)] = getattr(module, src.target)[src.index]
        return {k: v.detach() for k, v in out.items()}


def _is_buffer_like(p: torch.Tensor, model: TrainModel) -> bool:
    """The router correction biases move by load balancing, not by gradient."""
    return any(p is r.e_score_correction_bias for r in routers(model))


def routers(model: TrainModel) -> list[nn.Module]:
    from tpserve.model.moe import Router

    return [m for m in model.modules() if isinstance(m, Router)]


@torch.no_grad()
def init_weights_(model: TrainModel, seed: int) -> None:
    """Deterministic init: unit-variance linear outputs, residual outputs scaled by 1/sqrt(2L),
    norms at 1, neutral mHC (base 0, scale 1), KDA decay parameters as in Kimi's init."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    depth = 2 * (model.cfg.num_hidden_layers + 1)
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        if name.endswith("A_log"):
            val = torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
        elif name.endswith("dt_bias"):
            dt = torch.empty(shape).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
            val = dt + torch.log(-torch.expm1(-dt))
        elif "norm" in name and name.endswith("weight") and p.dim() == 1:
            val = torch.ones(shape)
        elif name.endswith("k_norm.bias") or name.endswith("e_score_correction_bias") or name.endswith(".bias"):
            val = torch.zeros(shape)
        elif name.endswith("hc.base") or name.endswith("compress_ape"):
            val = torch.zeros(shape)
        elif name.endswith("hc.scale"):
            val = torch.ones(shape)
        elif name.endswith("hc.fn"):
            val = 0.02 * torch.randn(shape, generator=gen)
        elif name.endswith("conv_weight"):
            bound = 1.0 / math.sqrt(shape[-1])
            val = torch.empty(shape).uniform_(-bound, bound, generator=gen)
        elif "embed_tokens" in name:
            val = torch.randn(shape, generator=gen)
        else:
            val = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight") or name.endswith("down_proj"):
                val = val / math.sqrt(depth)
        p.copy_(val.to(p.dtype))


@torch.no_grad()
def load_checkpoint_(model: TrainModel, model_dir) -> None:
    """Fill the model from a safetensors checkpoint written under transformers' names."""
    from safetensors.torch import load_file

    from tpserve.model.loader import checkpoint_files

    want = model.checkpoint_tensors()
    seen = set()
    mtp_hc = f".layers.{model.cfg.num_hidden_layers}.hc_"
    for path in checkpoint_files(model_dir):
        for name, tensor in load_file(str(path)).items():
            if model.mtp is not None and mtp_hc in name:
                raise ValueError(old_mtp_layout(name, model.cfg.num_hidden_layers))
            if name not in want:
                continue
            if tuple(tensor.shape) != tuple(want[name].shape):
                raise ValueError(f"{name}: shape {list(tensor.shape)}, expected {list(want[name].shape)}")
            want[name].copy_(tensor.to(want[name].dtype))
            seen.add(name)
    missing = sorted(set(want) - seen)
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks {missing[:5]}")
