"""Small building blocks: the shard context, linear layers with a declared split, norms."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tpserve.dist.comm import Communicator
from tpserve.model.weights import COLUMN, REPLICATED, ROW, Shard, declare


@dataclass(frozen=True)
class ShardContext:
    """Where this copy of the model lives: rank, world, dtype and its Communicator."""

    rank: int
    world: int
    dtype: torch.dtype
    comm: Communicator

    @classmethod
    def single(cls, dtype: torch.dtype, device: str | torch.device = "cpu") -> "ShardContext":
        return cls(0, 1, dtype, Communicator(None, torch.device(device)))

    def split(self, n: int, what: str) -> int:
        if n % self.world:
            raise ValueError(f"{what} ({n}) is not divisible by tensor_parallel_size={self.world}")
        return n // self.world


class Linear(nn.Module):
    """y = x W^T (+ b); W declared with its full shape [out, in] and a Shard."""

    def __init__(self, ctx: ShardContext, in_features: int, out_features: int, shard: Shard = REPLICATED,
                 bias: bool = False):
        super().__init__()
        declare(self, "weight", (out_features, in_features), shard, dtype=ctx.dtype, world=ctx.world)
        if bias:  # a row-parallel bias is added once, after the reduction (by rank 0 only)
            bias_shard = REPLICATED if shard.dim != 0 else Shard(dim=0, parts=shard.parts)
            declare(self, "bias", (out_features,), bias_shard, dtype=ctx.dtype, world=ctx.world)
            self.bias_on_this_rank = shard.dim != 1 or ctx.rank == 0
        else:
            self.bias = None
            self.bias_on_this_rank = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias if self.bias_on_this_rank else None)


def column(ctx: ShardContext, i: int, o: int, *, parts: tuple[int, ...] | None = None,
           bias: bool = False) -> Linear:
    return Linear(ctx, i, o, Shard(dim=0, parts=parts) if parts else COLUMN, bias)


def row(ctx: ShardContext, i: int, o: int, bias: bool = False) -> Linear:
    return Linear(ctx, i, o, ROW, bias)


def replicated(ctx: ShardContext, i: int, o: int, bias: bool = False) -> Linear:
    return Linear(ctx, i, o, REPLICATED, bias)


class RMSNorm(nn.Module):
    """transformers' Glm5NextTextRMSNorm: normalise in fp32, cast back, then scale."""

    def __init__(self, ctx: ShardContext, dim: int, eps: float):
        super().__init__()
        declare(self, "weight", (dim,), REPLICATED, dtype=ctx.dtype, world=ctx.world)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class GatedRMSNorm(nn.Module):
    """KDA output norm: fp32 RMSNorm over the head dim, scaled, times sigmoid(gate)."""

    def __init__(self, ctx: ShardContext, dim: int, eps: float):
        super().__init__()
        declare(self, "weight", (dim,), REPLICATED, dtype=ctx.dtype, world=ctx.world)
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight.float() * h
        return (h * torch.sigmoid(gate.float())).to(dtype)


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit)."""
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)
