"""Small building blocks: the shard context, linear layers with a declared split, norms."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tpserve.collectives.comm import Communicator
from tpserve.model.quant_methods import Bf16Linear
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
    """y = x W^T (+ b); W declared with its full shape [out, in] and a Shard. The weight layout,
    loading and forward belong to `self.quant` (model/quant_methods.py: bf16, fp8, nvfp4, ...).
    `decode_gemv` (set_gemv_backend): 16-bit weights take kernels/linear/gemv_triton.py at 1-16 rows; `quant_gemv_cuda`
    (set_gemv_backend's `quant`): FP8 / NVFP4 weights take the CUDA GEMVs at decode where they are the default
    (kernels/quant/gemv_cuda.py; one NVFP4 row kernels/quant/nvfp4_m1_cuda.py)."""

    decode_gemv = False
    quant_gemv_cuda = False
    pdl = False  # set_pdl: the Triton GEMV launched as a programmatic dependent (kernels/launch/pdl_triton.py)

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
    """transformers' Glm5NextTextRMSNorm: normalise in fp32, cast back, then scale. `norm_backend`
    "triton": one fused kernel (kernels/norms/norm_triton.py; set_norm_backend sets a whole model's)."""

    norm_backend = "torch"
    pdl = False  # set_pdl

    def __init__(self, ctx: ShardContext, dim: int, eps: float):
        super().__init__()
        declare(self, "weight", (dim,), REPLICATED, dtype=ctx.dtype, world=ctx.world)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm_backend == "triton":
            return norm_triton().rms_norm(x, self.weight, self.eps, self.pdl)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class GatedRMSNorm(nn.Module):
    """KDA output norm: fp32 RMSNorm over the head dim, scaled, times sigmoid(gate)."""

    norm_backend = "torch"
    pdl = False  # set_pdl

    def __init__(self, ctx: ShardContext, dim: int, eps: float):
        super().__init__()
        declare(self, "weight", (dim,), REPLICATED, dtype=ctx.dtype, world=ctx.world)
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if self.norm_backend == "triton":
            return norm_triton().gated_rms_norm(x, gate, self.weight, self.eps, self.pdl)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight.float() * h
        return (h * torch.sigmoid(gate.float())).to(dtype)


def norm_triton():
    """kernels/norms/norm_triton.py, imported on first use (Triton is there only where the backend is triton)."""
    from tpserve.kernels.norms import norm_triton as module

    return module


def set_gemv_backend(model: nn.Module, backend: str, quant: str = "triton") -> None:
    """Every Linear of `model` takes the Triton decode GEMV where it fits ("triton") or cuBLAS ("torch"); with
    quantized weights the CUDA GEMVs (`quant` "cuda": kernels/quant/gemv_cuda.py, nvfp4_m1.py) or the Triton one
    ("triton")."""
    if backend not in ("triton", "torch"):
        raise ValueError(f"gemv_backend: expected triton or torch, got {backend!r}")
    if quant not in ("cuda", "triton"):
        raise ValueError(f"quant_gemv_backend: expected cuda or triton, got {quant!r}")
    for m in model.modules():
        if isinstance(m, Linear):
            m.decode_gemv, m.quant_gemv_cuda = backend == "triton", quant == "cuda"


def set_pdl(model: nn.Module, on: bool) -> None:
    """Every module of `model` with a `pdl` switch (Linear's GEMVs, the norms, the mHC's kernels, the dense MLPs'
    SwiGLU, KDA's conv and gate, the router's top-k) launches its kernels as programmatic dependents of the kernel
    before (kernels/launch/pdl_triton.py; mma_gemv through kernels/launch/ex_cuda.py; sm_90+: engine/setup.pdl decides)."""
    for m in model.modules():
        if hasattr(type(m), "pdl"):
            m.pdl = bool(on)


def set_norm_backend(model: nn.Module, backend: str) -> None:
    """Every norm of `model` (RMSNorm, GatedRMSNorm, the mHC stream norm / collapse / expand) on
    `backend`: "triton" (fused kernels, cuda) or "torch"."""
    if backend not in ("triton", "torch"):
        raise ValueError(f"norm_backend: expected triton or torch, got {backend!r}")
    for m in model.modules():
        if hasattr(m, "norm_backend"):
            m.norm_backend = backend
