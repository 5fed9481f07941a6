"""mHC hyper-connections: `hc_mult` residual streams per token.

Per block a projection of the (normalised, flattened) streams gives pre / post / comb
weights; comb is made doubly stochastic by Sinkhorn steps (`ops.hc_weights`: kernels/norms/mhc.py's torch
ops or one Triton kernel). `collapse` gives the block input, `expand` mixes the block output back into the
streams (`ops.hc_stream_norm`, `hc_collapse`, `hc_expand`: torch, or one kernel each with --norm-backend
triton). In steps with prefill tokens `ops.hc_project` (--mhc-project-backend triton) runs the stream norm and
the projection as one kernel on bf16 streams (its weight split into bf16 parts once, by `prepare_runtime`).
Replicated on every rank (it is tiny: fn is [(2+N)*N, N*hidden]); all of its math runs in fp32, as in
transformers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tpserve.kernels.norms.ref import hc_expand
from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext
from tpserve.model.weights import REPLICATED, declare


class HyperConnection(nn.Module):
    def __init__(self, ctx: ShardContext, cfg: ModelConfig):
        super().__init__()
        self.ops = ctx.ops
        self.project_parts: torch.Tensor | None = None  # prepare_runtime: fn split for the fused projection
        self.stream_dtype = ctx.dtype
        n = cfg.hc_mult
        self.n, self.iters, self.hc_eps, self.norm_eps = n, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps
        width = (2 + n) * n
        # kept in fp32 (the projection runs in fp32): no fp32 copy of it per call, one kernel less per block
        declare(self, "fn", (width, n * cfg.hidden_size), REPLICATED, dtype=ctx.dtype, world=ctx.world, fp32=True)
        declare(self, "base", (width,), REPLICATED, dtype=ctx.dtype, world=ctx.world, fp32=True)
        declare(self, "scale", (3,), REPLICATED, dtype=ctx.dtype, world=ctx.world, fp32=True)

    @property
    def projects_fused(self) -> bool:
        """Prefill steps take the fused projection (kernels/norms/hc_project_triton.py: bf16 streams only)."""
        return bool(self.ops.hc_project) and self.stream_dtype == torch.bfloat16

    def prepare_runtime(self) -> None:
        """After the weights are in (model/build.py): the fused projection's weight, on cuda."""
        if self.projects_fused and self.fn.is_cuda:
            from tpserve.kernels.norms.mhc import project_weight  # (with the Triton projection only)

            self.project_parts = project_weight(self.fn, torch.bfloat16)

    def runtime_bytes(self) -> int:
        """What prepare_runtime will allocate (model/plan.py counts it with the weights)."""
        return 3 * self.fn.numel() * 2 if self.projects_fused else 0

    def forward(self, streams: torch.Tensor, prefill: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """streams [T, N, D] -> (post [T, N] fp32, comb [T, N, N] fp32, block input [T, D]). prefill: the step
        has prefill tokens (the fused projection's steps; decode and verify steps keep the two kernels)."""
        ops, flat = self.ops, streams.reshape(streams.shape[0], -1)
        if prefill and self.project_parts is not None:
            mixed = ops.hc_project(flat, self.project_parts, self.norm_eps)
        else:
            mixed = F.linear(ops.hc_stream_norm(flat, self.norm_eps), self.fn)
        pre, post, comb = ops.hc_weights(mixed, self.base, self.scale, self.n, self.iters, self.hc_eps)
        return post, comb, ops.hc_collapse(pre, streams)

    def mix(self, block_out: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
            comb: torch.Tensor) -> torch.Tensor:
        """`expand` through this block's ops (one kernel with --norm-backend triton)."""
        return self.ops.hc_expand(block_out, residual, post, comb)

    @staticmethod
    def expand(block_out: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
               comb: torch.Tensor) -> torch.Tensor:
        """New streams [T, N, D] = post (x) block_out + comb^T @ residual (kernels/norms/ref.hc_expand: the
        arithmetic Communicator.all_reduce_hc_expand fuses with the all-reduce)."""
        return hc_expand(block_out, residual, post, comb)
