"""Small collectives over the process group, used while building workspaces and loading tables.

Everything here moves a few int64 values through the group's own backend (gloo: CPU tensors,
NCCL: tensors on the rank's GPU). Building a workspace takes several steps that can fail on one
rank only (a full /dev/shm, a CUDA error); `agree` turns such local outcomes into one decision
that every rank sees, so no rank goes on to a path its peers abandoned (which would hang).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_INT63 = (1 << 63) - 1


class GroupOps:
    """int64 collectives over `group` (never None: world-1 communicators need none)."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        backend = str(dist.get_backend(group)).lower()
        # a pure NCCL group only moves CUDA tensors; anything with gloo takes CPU tensors
        use_cuda = backend == "nccl" and torch.device(device).type == "cuda"
        self.tensor_device = torch.device(device) if use_cuda else torch.device("cpu")
        self.backend = backend

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.tensor_device)

    def broadcast_ints(self, values: list[int]) -> list[int]:
        """Group rank 0's `values` on every rank (all ranks pass a list of the same length)."""
        t = self._tensor([int(v) & _INT63 for v in values])
        dist.broadcast(t, src=dist.get_global_rank(self.group, 0), group=self.group)
        return [int(v) for v in t.cpu().tolist()]

    def all_gather_ints(self, values: list[int]) -> list[list[int]]:
        """Every rank's `values` (same length on all ranks), in rank order."""
        t = self._tensor([int(v) & _INT63 for v in values])
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t, group=self.group)
        return [[int(v) for v in o.cpu().tolist()] for o in out]

    def agree(self, ok: bool) -> bool:
        """True on every rank iff `ok` was true on every rank."""
        t = self._tensor([1 if ok else 0])
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return bool(int(t.item()))

    def barrier(self) -> None:
        self.agree(True)
