"""Communicator: the one door every tensor-parallel collective goes through.

The model calls `all_reduce`, `all_gather` and `reduce_scatter` on a Communicator and never
torch.distributed directly, so faster backends (the workspace all-reduce of dist/workspace)
plug in here. The backend is chosen per call from shape, dtype, layout and a size table only,
so every rank takes the same path.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class Communicator:
    """Collectives over one process group (world 1: every op is the identity)."""

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device):
        self.group = group
        self.device = torch.device(device)
        if group is None:
            self.rank, self.world_size = 0, 1
        else:
            self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)

    # -- the three collectives -------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over ranks (a new tensor; `x` may be overwritten)."""
        if self.world_size == 1:
            return x
        x = x.contiguous()
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Concatenation of every rank's `x` along `dim`, in rank order."""
        if self.world_size == 1:
            return x
        x = x.movedim(dim, 0).contiguous()
        out = x.new_empty((self.world_size * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x, group=self.group)
        return out.movedim(0, dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Rank r's slice r (of `world_size` equal slices along `dim`) of the sum over ranks."""
        if self.world_size == 1:
            return x
        if x.shape[dim] % self.world_size:
            raise ValueError(f"reduce_scatter: dim {dim} of size {x.shape[dim]} is not divisible "
                             f"by world size {self.world_size}")
        x = x.movedim(dim, 0).contiguous()
        out = x.new_empty((x.shape[0] // self.world_size, *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x, group=self.group)
        return out.movedim(0, dim)

    def close(self) -> None:
        """Release backend resources (workspaces); safe to call twice."""
