"""The CPU workspace collectives: all-reduce (one-shot, two-shot, chunked), all-gather and
reduce-scatter through every rank's POSIX shared-memory segment (shm.py).

A *round* moves at most one slot's worth of data: each rank copies its piece into its own slot
(through the caller's strided view, so non-contiguous inputs need no extra copy), `barrier()`,
then every rank reads what it needs from all slots. Rounds alternate between the two slots of
each segment (round parity), which is what makes one barrier per round enough: a rank can only
start writing slot k of round i+2 after passing the barrier of round i+1, and each peer reached
that barrier only after it had finished reading round i. Two-shot adds one barrier in the middle.

A tensor larger than a slot is sent in rounds of whole rows: `row_blocks` splits the leading
dimension into runs of rows that fit, and a row that alone does not fit is split along its own
leading dimension, recursively (1-D tensors simply in runs of elements). The split depends on the
shape alone, so every rank cuts the same pieces. Memory used: the workspace and the output.

Numerics: the sum runs in rank order 0, 1, 2, ... on every rank (each rank computes exactly the
same expression on the same bytes, so results are bitwise identical everywhere). bf16/fp16 are
accumulated in float32 and rounded once at the end; float32 and wider are summed in their own
dtype. One-shot, two-shot and chunked therefore give bitwise the same result.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

from tpserve.dist.shm import HEADER_BYTES, ShmSegments, WorkspaceUnavailable
from tpserve.dist.workspace_group import GroupOps

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32,
                    torch.int64)
_LOW_PRECISION = (torch.bfloat16, torch.float16)


def row_blocks(shape: tuple[int, ...], cap: int) -> Iterator[tuple[tuple[int, ...], int, int]]:
    """Pieces `t[idx][lo:hi]` of a tensor of `shape`, in row-major order, each <= `cap` elements.

    Together the pieces cover the tensor exactly once and each is contiguous in a contiguous
    tensor of `shape`. Needs len(shape) >= 1 and cap >= 1.
    """
    if cap < 1:
        raise ValueError(f"row_blocks: cap must be >= 1, got {cap}")
    if len(shape) == 0 or math.prod(shape) == 0:
        return
    row = math.prod(shape[1:])
    if row <= cap:
        step = cap // row
        for lo in range(0, shape[0], step):
            yield (), lo, min(lo + step, shape[0])
        return
    for i in range(shape[0]):
        for idx, lo, hi in row_blocks(shape[1:], cap):
            yield (i, *idx), lo, hi


def sum_in_rank_order(parts: list[torch.Tensor], out: torch.Tensor) -> None:
    """out = parts[0] + parts[1] + ... (float32 accumulation for bf16/fp16), 1-D, same length."""
    if len(parts) == 1:
        out.copy_(parts[0])
    elif out.dtype in _LOW_PRECISION:
        acc = parts[0].float()
        for p in parts[1:]:
            acc.add_(p)
        out.copy_(acc)
    else:
        torch.add(parts[0], parts[1], out=out)
        for p in parts[2:]:
            out.add_(p)


class CpuWorkspace:
    """Collectives through shared memory; every method is collective over the group."""

    def __init__(self, ops: GroupOps, workspace_bytes: int, *, timeout_s: float = 300.0):
        self.rank, self.world_size = ops.rank, ops.world_size
        slot_bytes = (max(0, workspace_bytes - HEADER_BYTES) // 2) // 64 * 64
        if slot_bytes < 64 * self.world_size:
            raise WorkspaceUnavailable(f"workspace of {workspace_bytes} bytes is too small for "
                                       f"{self.world_size} ranks")
        self.seg = ShmSegments(ops, slot_bytes, timeout_s=timeout_s)
        self.capacity_bytes = slot_bytes
        self._round = 0

    # -- helpers ------------------------------------------------------------------------------
    def capacity(self, dtype: torch.dtype) -> int:
        """Elements of `dtype` that one round carries per rank."""
        return self.capacity_bytes // dtype.itemsize

    def supports(self, x: torch.Tensor) -> bool:
        return x.dtype in SUPPORTED_DTYPES and x.device.type == "cpu"

    def fits(self, op: str, x: torch.Tensor) -> bool:
        """Whether `op` on `x` takes a single round (else it is chunked)."""
        cap = self.capacity(x.dtype)
        if op == "reduce_scatter":  # every rank's slot holds all world_size slices of a round
            return x.numel() // self.world_size <= cap // self.world_size
        return x.numel() <= cap

    def _next_slot(self) -> int:
        slot = self._round & 1
        self._round += 1
        return slot

    @staticmethod
    def _check(x: torch.Tensor) -> None:
        if x.device.type != "cpu":
            raise ValueError(f"CPU workspace got a tensor on {x.device}")
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"CPU workspace does not support {x.dtype}")

    # -- all-reduce ---------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, *, two_shot: bool) -> torch.Tensor:
        """Sum over ranks into a new contiguous tensor (x is only read)."""
        self._check(x)
        src = x.reshape(1) if x.dim() == 0 else x
        out = torch.empty(src.shape, dtype=x.dtype)
        if x.numel() <= self.capacity(x.dtype):  # one round: skip the piece bookkeeping
            if x.numel():
                self._all_reduce_round(src, out.view(-1), two_shot)
            return out.view(x.shape)
        for idx, lo, hi in row_blocks(tuple(src.shape), self.capacity(x.dtype)):
            self._all_reduce_round(src[idx][lo:hi], out[idx][lo:hi].view(-1), two_shot)
        return out.view(x.shape)

    def _all_reduce_round(self, block: torch.Tensor, out: torch.Tensor, two_shot: bool) -> None:
        seg, dt, n, world = self.seg, block.dtype, block.numel(), self.world_size
        slot = self._next_slot()
        mine = seg.slot(self.rank, slot, dt, n)
        mine.view(block.shape).copy_(block)
        seg.barrier()
        bufs = [seg.slot(p, slot, dt, n) for p in range(world)]
        if not two_shot:
            sum_in_rank_order(bufs, out)
            return
        bounds = [s * n // world for s in range(world + 1)]
        lo, hi = bounds[self.rank], bounds[self.rank + 1]
        if hi > lo:  # reduce-scatter phase: my slice, summed from every slot, kept in my slot
            sum_in_rank_order([b[lo:hi] for b in bufs], out[lo:hi])
            mine[lo:hi].copy_(out[lo:hi])
        seg.barrier()
        for s in range(world):  # all-gather phase: every other slice from its owner
            if s != self.rank and bounds[s + 1] > bounds[s]:
                out[bounds[s]:bounds[s + 1]].copy_(bufs[s][bounds[s]:bounds[s + 1]])

    # -- all-gather ---------------------------------------------------------------------------
    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Every rank's x concatenated along `dim` in rank order (same layout as comm.py's)."""
        self._check(x)
        xp = x.movedim(dim, 0)
        shape = tuple(xp.shape)
        out = torch.empty((self.world_size * shape[0], *shape[1:]), dtype=x.dtype)
        outs = out.view(self.world_size, *shape)
        for idx, lo, hi in row_blocks(shape, self.capacity(x.dtype)):
            src = xp[idx][lo:hi]
            n, slot = src.numel(), self._next_slot()
            self.seg.slot(self.rank, slot, x.dtype, n).view(src.shape).copy_(src)
            self.seg.barrier()
            for p in range(self.world_size):
                outs[p][idx][lo:hi].copy_(self.seg.slot(p, slot, x.dtype, n).view(src.shape))
        return out.movedim(0, dim)

    # -- reduce-scatter -----------------------------------------------------------------------
    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Slice `rank` (of world_size equal slices along `dim`) of the sum over ranks."""
        self._check(x)
        world = self.world_size
        xp = x.movedim(dim, 0)
        if xp.shape[0] % world:
            raise ValueError(f"reduce_scatter: dim {dim} of size {xp.shape[0]} is not divisible "
                             f"by world size {world}")
        xs = xp.unflatten(0, (world, xp.shape[0] // world))
        shape = tuple(xs.shape[1:])
        out = torch.empty(shape, dtype=x.dtype)
        for idx, lo, hi in row_blocks(shape, self.capacity(x.dtype) // world):
            piece = out[idx][lo:hi]
            n, slot = piece.numel(), self._next_slot()
            mine = self.seg.slot(self.rank, slot, x.dtype, world * n)
            for s in range(world):
                mine[s * n:(s + 1) * n].view(piece.shape).copy_(xs[s][idx][lo:hi])
            self.seg.barrier()
            me = self.rank
            parts = [self.seg.slot(p, slot, x.dtype, world * n)[me * n:(me + 1) * n]
                     for p in range(world)]
            sum_in_rank_order(parts, piece.view(-1))
        return out.movedim(0, dim)

    def abort(self, reason: str) -> None:
        self.seg.abort(reason)

    def close(self) -> None:
        self.seg.close()
