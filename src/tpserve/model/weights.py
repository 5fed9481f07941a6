"""Declared parameters: each knows its full (checkpoint) shape and how it is split across ranks.

Modules create their weights with `declare(module, name, full_shape, shard, dtype)`; the loader
checks every checkpoint tensor against the declared full shape and stores this rank's slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Shard:
    """How a full tensor is split over `world` ranks.

    dim None: replicated. Otherwise the tensor is cut along `dim`; when `parts` is given the
    dim is a concatenation of blocks of those sizes (e.g. fused gate|up) and each block is cut
    separately, so rank r holds block-slices [b0_r, b1_r, ...]. `pad_to` rounds the dim up to
    a multiple of the world size first (vocab-parallel tables; padding rows are zero).
    """

    dim: int | None = None
    parts: tuple[int, ...] | None = None
    pad: bool = False

    def local_shape(self, full: tuple[int, ...], world: int) -> tuple[int, ...]:
        if self.dim is None or world == 1 and not self.pad:
            return full
        shape = list(full)
        if self.pad:
            shape[self.dim] = -(-full[self.dim] // world)
            return tuple(shape)
        parts = self.parts or (full[self.dim],)
        shape[self.dim] = sum(p // world for p in parts)
        return tuple(shape)

    def check_divisible(self, full: tuple[int, ...], world: int, what: str) -> None:
        if self.dim is None or self.pad:
            return
        for p in self.parts or (full[self.dim],):
            if p % world:
                raise ValueError(f"{what}: size {p} along dim {self.dim} is not divisible by "
                                 f"tensor_parallel_size={world}")

    def take(self, full, rank: int, world: int, full_shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """This rank's piece of `full`: a tensor, or anything indexable by slices (a safetensors
        slice), so only the needed rows are read from disk."""
        shape = tuple(full.shape) if full_shape is None else full_shape
        if self.dim is None:
            return full[...] if not isinstance(full, torch.Tensor) else full
        lead = (slice(None),) * self.dim
        if self.pad:
            n = shape[self.dim]
            per = -(-n // world)
            start, stop = min(rank * per, n), min((rank + 1) * per, n)
            piece = full[lead + (slice(start, stop),)]
            if stop - start < per:
                pad_shape = list(shape)
                pad_shape[self.dim] = per - (stop - start)
                piece = torch.cat([piece, piece.new_zeros(pad_shape)], dim=self.dim)
            return piece
        pieces, offset = [], 0
        for p in self.parts or (shape[self.dim],):
            per = p // world
            pieces.append(full[lead + (slice(offset + rank * per, offset + (rank + 1) * per),)])
            offset += p
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=self.dim)


REPLICATED = Shard()
COLUMN = Shard(dim=0)  # nn.Linear weight [out, in]: split outputs
ROW = Shard(dim=1)     # split inputs (the result is a partial sum)


@dataclass(frozen=True)
class Source:
    """One checkpoint tensor: its full shape, how it is split, and where this rank's piece goes
    (`module.<target>[index]`); `repeat` > 1 repeats each element of the piece that many times along its last
    dim first (scales stored per wider group than the layout the kernels read)."""

    full_shape: tuple[int, ...]
    shard: Shard
    target: str
    index: tuple = ()
    repeat: int = 1


def _sources(module: nn.Module) -> dict[str, Source]:
    if "_sources" not in module.__dict__:
        module._sources = {}
    return module._sources


def declare(module: nn.Module, name: str, full_shape: tuple[int, ...], shard: Shard, *,
            dtype: torch.dtype, world: int, fp32: bool = False) -> nn.Parameter:
    """Create `module.<name>` (uninitialised, this rank's shape), loaded from checkpoint tensor `name`."""
    shard.check_divisible(full_shape, world, f"{type(module).__name__}.{name}")
    local = shard.local_shape(full_shape, world)
    param = nn.Parameter(torch.empty(local, dtype=torch.float32 if fp32 else dtype), requires_grad=False)
    module.register_parameter(name, param)
    _sources(module)[name] = Source(tuple(full_shape), shard, name)
    return param


def add_source(module: nn.Module, name: str, full_shape: tuple[int, ...], shard: Shard, target: str,
               index: tuple, world: int, repeat: int = 1) -> None:
    """Checkpoint tensor `name` fills `module.<target>[index]` (e.g. one expert of a fused tensor)."""
    shard.check_divisible(full_shape, world, f"{type(module).__name__}.{name}")
    _sources(module)[name] = Source(tuple(full_shape), shard, target, index, repeat)


def checkpoint_sources(model: nn.Module) -> dict[str, tuple[nn.Module, Source]]:
    """Every checkpoint tensor the model expects, by its dotted name."""
    out: dict[str, tuple[nn.Module, Source]] = {}
    for prefix, module in model.named_modules():
        for name, src in module.__dict__.get("_sources", {}).items():
            out[f"{prefix}.{name}" if prefix else name] = (module, src)
    return out
