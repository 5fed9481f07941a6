"""Small building blocks: the shard context, linear layers with a declared split, norms."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn

from tpserve.collectives.comm import Communicator
from tpserve.kernels.choice import Kernels
from tpserve.kernels.registry import Ops, resolve
from tpserve.model.quant_methods import Bf16Linear
from tpserve.model.weights import COLUMN, REPLICATED, ROW, Shard, declare


@dataclass(frozen=True)
class ShardContext:
    """Where this copy of the model lives: rank, world, dtype and its Communicator; and the ops its modules run
    (kernels/registry.py: resolved once from the switches, every module calls `ctx.ops.<op>`)."""

    rank: int
    world: int
    dtype: torch.dtype
    comm: Communicator
    ops: Ops = field(default_factory=resolve)  # the torch references

    @classmethod
    def single(cls, dtype: torch.dtype, device: str | torch.device = "cpu",
               kernels: Kernels | None = None) -> "ShardContext":
        return cls(0, 1, dtype, Communicator(None, torch.device(device)), resolve(kernels or Kernels()))

    def with_kernels(self, kernels: Kernels) -> "ShardContext":
        """This context with the ops these switches resolve to."""
        return dataclasses.replace(self, ops=resolve(kernels))

    def split(self, n: int, what: str) -> int:
        if n % self.world:
            raise ValueError(f"{what} ({n}) is not divisible by tensor_parallel_size={self.world}")
        return n // self.world


class Linear(nn.Module):
    """y = x W^T (+ b); W declared with its full shape [out, in] and a Shard. The weight layout,
    loading and forward belong to `self.quant` (model/quant_methods.py: bf16, fp8, nvfp4, ...), whose forward
    runs `ctx.ops.linear` (kernels/quant/dispatch.py: the kernel for the format and the rows)."""

    def __init__(self, ctx: ShardContext, in_features: int, out_features: int, shard: Shard = REPLICATED,
                 bias: bool = False):
        super().__init__()
        self.ctx, self.in_features, self.out_features, self.shard = ctx, in_features, out_features, shard
        self.qualname: str | None = None
        self.quant = Bf16Linear()
        self.quant.create(self, ctx, in_features, out_features, shard)
        if bias:  # a row-parallel bias is added once, after the reduction (by rank 0 only)
            bias_shard = REPLICATED if shard.dim != 0 else Shard(dim=0, parts=shard.parts)
            declare(self, "bias", (out_features,), bias_shard, dtype=ctx.dtype, world=ctx.world)
            self.bias_on_this_rank = shard.dim != 1 or ctx.rank == 0
        else:
            self.bias = None
            self.bias_on_this_rank = False

    def set_quant(self, method, qualname: str | None = None) -> None:
        """Replace the weight layout (before the weights are materialised and loaded)."""
        if qualname is not None:
            self.qualname = qualname
        for name in ("weight", "weight_scale_inv", "weight_scale", "weight_scale_2"):
            if name in self._parameters:
                del self._parameters[name]
            self.__dict__.get("_sources", {}).pop(name, None)
        self.quant = method
        method.create(self, self.ctx, self.in_features, self.out_features, self.shard)

    def dense_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight [out_local, in_local] as a plain tensor (dequantized for quantized layouts)."""
        return self.quant.dense_weight(self, dtype or self.ctx.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant.forward(self, x, self.bias if self.bias_on_this_rank else None)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, quant={self.quant.describe()}"


def column(ctx: ShardContext, i: int, o: int, *, parts: tuple[int, ...] | None = None,
           bias: bool = False) -> Linear:
    return Linear(ctx, i, o, Shard(dim=0, parts=parts) if parts else COLUMN, bias)


def row(ctx: ShardContext, i: int, o: int, bias: bool = False) -> Linear:
    return Linear(ctx, i, o, ROW, bias)


def replicated(ctx: ShardContext, i: int, o: int, bias: bool = False) -> Linear:
    return Linear(ctx, i, o, REPLICATED, bias)


class RMSNorm(nn.Module):
    """transformers' Glm5NextTextRMSNorm: normalise in fp32, cast back, then scale (`ctx.ops.rms_norm`)."""

    def __init__(self, ctx: ShardContext, dim: int, eps: float):
        super().__init__()
        declare(self, "weight", (dim,), REPLICATED, dtype=ctx.dtype, world=ctx.world)
        self.eps = eps
        self.op = ctx.ops.rms_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """KDA output norm: fp32 RMSNorm over the head dim, scaled, times sigmoid(gate) (`ctx.ops.gated_rms_norm`)."""

    def __init__(self, ctx: ShardContext, dim: int, eps: float):
        super().__init__()
        declare(self, "weight", (dim,), REPLICATED, dtype=ctx.dtype, world=ctx.world)
        self.eps = eps
        self.op = ctx.ops.gated_rms_norm

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.op(x, gate, self.weight, self.eps)
