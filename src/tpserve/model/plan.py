"""The start-up memory plan of one rank: weights (in their quantized layout, counted on the meta
model, so exact per rank), KV cache per token, KDA state per request, and how many concurrent
requests of `request_tokens` fit in what is left. A plan that cannot hold even one request is a
clear error before anything is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tpserve.model.config import ModelConfig

GiB = 2**30
REQUEST_TOKENS = 32768
ACTIVATION_RESERVE = 4 * GiB  # CUDA: left free for activations of a max_num_batched_tokens step


def cut_layers(cfg: ModelConfig, num_layers: int) -> ModelConfig:
    """The config cut to its first `num_layers` layers (benchmarks of the real config on one GPU)."""
    if not 1 <= num_layers <= cfg.num_hidden_layers:
        raise ValueError(f"num_layers must be in [1, {cfg.num_hidden_layers}], got {num_layers}")
    return cfg.with_overrides({"num_hidden_layers": num_layers})


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@dataclass(frozen=True)
class MemoryPlan:
    rank: int
    world: int
    device_bytes: int          # total memory of the device
    budget_bytes: int          # device_bytes x gpu_memory_utilization
    weight_bytes: int
    activation_bytes: int      # kept free for the activations of one step
    kv_bytes_per_token: float  # MLA latent + indexer keys, all MLA layers (replicated on every rank)
    kda_bytes_per_request: int  # KDA recurrent + conv state, this rank's heads
    request_tokens: int = REQUEST_TOKENS

    @property
    def per_request_bytes(self) -> float:
        return self.request_tokens * self.kv_bytes_per_token + self.kda_bytes_per_request

    @property
    def cache_bytes(self) -> int:
        return self.budget_bytes - self.weight_bytes - self.activation_bytes

    @property
    def requests_fit(self) -> int:
        return max(0, int(self.cache_bytes // self.per_request_bytes))

    def describe(self) -> str:
        return (f"rank {self.rank}/{self.world}: device {self.device_bytes / GiB:.1f} GiB, budget "
                f"{self.budget_bytes / GiB:.1f} GiB = weights {self.weight_bytes / GiB:.2f} GiB + activations "
                f"{self.activation_bytes / GiB:.1f} GiB + cache {self.cache_bytes / GiB:.2f} GiB; per "
                f"{self.request_tokens}-token request: KV {self.request_tokens * self.kv_bytes_per_token / GiB:.3f} "
                f"GiB + KDA state {self.kda_bytes_per_request / GiB:.3f} GiB -> {self.requests_fit} concurrent requests")

    def check(self) -> None:
        if self.requests_fit < 1:
            raise ValueError(f"memory plan does not fit: {self.describe()}; use more tensor-parallel ranks, a "
                             "quantized checkpoint (--quantization), or raise --gpu-memory-utilization")


def derived_bytes(model: nn.Module) -> int:
    """Tensors made from the weights after loading (model/build.py prepare_runtime), counted with them."""
    return sum(m.runtime_bytes() for m in model.modules() if hasattr(m, "runtime_bytes"))


def memory_plan(model: nn.Module, cfg: ModelConfig, *, rank: int, world: int, dtype: torch.dtype,
                device_bytes: int, utilization: float, activation_bytes: int, block_size: int = 64,
                request_tokens: int = REQUEST_TOKENS) -> MemoryPlan:
    """The plan for `model` (usually still on the meta device: nothing is allocated)."""
    from tpserve.model.cache import bytes_per_block, bytes_per_slot

    return MemoryPlan(rank=rank, world=world, device_bytes=int(device_bytes),
                      budget_bytes=int(device_bytes * utilization),
                      weight_bytes=param_bytes(model) + derived_bytes(model),
                      activation_bytes=int(activation_bytes),
                      kv_bytes_per_token=bytes_per_block(cfg, block_size, dtype) / block_size,
                      kda_bytes_per_request=bytes_per_slot(cfg, world, dtype), request_tokens=request_tokens)
