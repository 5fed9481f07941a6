"""The CPU workspace collectives: all-reduce (one-shot, two-shot, pipelined chunked, neighbour-only
ring), all-gather and reduce-scatter through every rank's POSIX shared-memory segment (shm.py).

Slots and flags. Each rank's data area is cut into `slots` (4) equal slots. A call moves its data
in *rounds* of at most one slot; rounds are numbered globally (g = 1, 2, ... over the life of the
workspace, the same on every rank because every rank issues the same calls with the same shapes)
and round g uses slot g % slots. Every slot k has three sequence flags in its owner's header:
READY[k] (the owner's input of round g is in slot k), REDUCED[k] (the owner's reduced part of
round g is in slot k) and DONE[k] (the owner has finished reading round g from its peers' slot k).
A flag holds the last round number it announced and only grows, so "peer p's READY[k] >= g" says
exactly that round g is there. Before writing round g into its slot k, a rank waits until every
rank that reads that slot has DONE[k] >= g - slots (it has finished round g - slots, the previous
user of the slot). No barrier anywhere: ranks run up to `slots` rounds apart.

Pipelining. A call is a list of stages (copy-in, reduce, copy-out); at step t a rank runs stage j
on round t - j, so round t+1 is copied in while peers still reduce round t and round t-1 is
copied out (the shared-memory equivalent of a persistent kernel with several slots in flight).
`_pipeline` is the one loop every collective goes through; the stages are per path:

    oneshot   copy-in, sum all peers' slots -> DONE
    twoshot   copy-in, sum my 1/world slice of all slots -> my slot (REDUCED), copy the other
              slices from their owners -> DONE
    chunked   twoshot stages over many rounds (a tensor larger than a slot)
    ring      neighbour-only: rank r reads its left neighbour (r-1) only. Chain: rank 0 puts its
              input (in the accumulation dtype) into its slot, rank r adds its own to the left's
              partial and passes it on, rank world-1 rounds the total (the result); then the
              result is relayed w-1 -> 0 -> 1 -> ... -> w-2. The addition order is the same as
              the mesh paths' (rank 0, 1, 2, ... in the accumulation dtype, rounded once), so
              ring and mesh give bitwise the same result.

The reduce-scatter's copy-in is a callback (`_reduce_scatter`): a plain reduce-scatter copies
the input's pieces in; `reduce_scatter_moe_combine` computes an MoE's combine of each piece's rows
straight into the slot (collectives/fused.py), so the combined [T, D] tensor is never written whole.

A tensor larger than a slot is sent in rounds of whole rows: `row_blocks` splits the leading
dimension into runs of rows that fit, and a row that alone does not fit is split along its own
leading dimension, recursively. The split depends on the shape alone, so every rank cuts the same
pieces; inputs are read through the caller's strided view (no extra copy).

Numerics: the sum runs in rank order 0, 1, 2, ... on every rank; bf16/fp16 are accumulated in
float32 and rounded once at the end; float32 and wider are summed in their own dtype. Every path
(one-shot, two-shot, chunked, ring) therefore gives bitwise the same result on every rank.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator

import torch

from tpserve.collectives import fused
from tpserve.collectives.shm import FLAG_WORDS, HEADER_BYTES, ShmSegments, WorkspaceUnavailable
from tpserve.collectives.workspace_group import GroupOps

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32,
                    torch.int64)
_LOW_PRECISION = (torch.bfloat16, torch.float16)
SLOTS = 4
MAX_SLOTS = 16
READY, REDUCED, DONE = 0, 1, 2
TOPOLOGIES = ("mesh", "ring")


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


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW_PRECISION else dtype


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


def _word(kind: int, slot: int) -> int:
    return FLAG_WORDS + kind * MAX_SLOTS + slot


class CpuWorkspace:
    """Collectives through shared memory; every method is collective over the group."""

    def __init__(self, ops: GroupOps, workspace_bytes: int, *, timeout_s: float = 300.0,
                 topology: str = "mesh", slots: int = SLOTS):
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}, got {topology!r}")
        if not 3 <= slots <= MAX_SLOTS:
            raise ValueError(f"slots must be in 3..{MAX_SLOTS}, got {slots}")
        self.rank, self.world_size = ops.rank, ops.world_size
        self.topology, self.slots = topology, slots
        self.left = (self.rank - 1) % self.world_size
        self.right = (self.rank + 1) % self.world_size
        slot_bytes = (max(0, workspace_bytes - HEADER_BYTES) // slots) // 64 * 64
        if slot_bytes < 128 * self.world_size:
            raise WorkspaceUnavailable(f"workspace of {workspace_bytes} bytes is too small for "
                                       f"{self.world_size} ranks")
        peers = None if topology == "mesh" else {self.left, self.right}
        self.seg = ShmSegments(ops, slots * slot_bytes, timeout_s=timeout_s, peers=peers)
        self.slot_bytes = self.capacity_bytes = slot_bytes
        self._round = 0
        self._views: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}

    # -- helpers ------------------------------------------------------------------------------
    def capacity(self, dtype: torch.dtype) -> int:
        """Elements of `dtype` that one round carries per rank (mesh paths)."""
        return self.slot_bytes // dtype.itemsize

    def ring_capacity(self, dtype: torch.dtype) -> int:
        """Elements per ring round: a slot holds the partial sum (accumulation dtype) and the
        result (dtype) side by side."""
        return (self.slot_bytes - 64) // (accumulation_dtype(dtype).itemsize + dtype.itemsize)

    def supports(self, x: torch.Tensor) -> bool:
        return x.dtype in SUPPORTED_DTYPES and x.device.type == "cpu"

    def fits(self, op: str, x: torch.Tensor) -> bool:
        """Whether `op` on `x` takes a single round (else it is chunked)."""
        cap = self.capacity(x.dtype)
        if op == "reduce_scatter":  # every rank's slot holds all world_size slices of a round
            return x.numel() // self.world_size <= cap // self.world_size
        return x.numel() <= cap

    def _view(self, rank: int, slot: int, dtype: torch.dtype, numel: int,
              offset: int = 0) -> torch.Tensor:
        """`numel` elements of `dtype` at byte `offset` of `rank`'s slot `slot`."""
        key = (rank, slot, dtype)
        whole = self._views.get(key)
        if whole is None:
            data = self.seg.data[rank]
            if data is None:
                raise RuntimeError(f"rank {self.rank} does not map rank {rank}'s workspace")
            start = slot * self.slot_bytes
            whole = data[start:start + self.slot_bytes].view(dtype)
            self._views[key] = whole
        first = offset // dtype.itemsize
        if first + numel > whole.numel():
            raise ValueError(f"{numel} x {dtype} at {offset} do not fit a "
                             f"{self.slot_bytes}-byte slot")
        return whole[first:first + numel]

    def _pipeline(self, rounds: int, stages: list[Callable[[int, int, int], None]]) -> None:
        """Run stage j on round t - j at step t: stage(i, g, slot) for round i of this call,
        g its global number, slot = g % slots."""
        first = self._round + 1
        self._round += rounds
        for t in range(rounds + len(stages) - 1):
            for j, stage in enumerate(stages):
                i = t - j
                if 0 <= i < rounds:
                    g = first + i
                    stage(i, g, g % self.slots)

    def _claim(self, g: int, slot: int, readers: list[int]) -> None:
        """Wait until every reader of my slot `slot` is done with its previous round."""
        if g > self.slots:
            for p in readers:
                self.seg.wait(p, _word(DONE, slot), g - self.slots)

    def _peers(self) -> list[int]:
        return [p for p in range(self.world_size) if p != self.rank]

    @staticmethod
    def _check(x: torch.Tensor) -> None:
        if x.device.type != "cpu":
            raise ValueError(f"CPU workspace got a tensor on {x.device}")
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"CPU workspace does not support {x.dtype}")

    def _need_mesh(self, what: str) -> None:
        if self.topology != "mesh":
            raise ValueError(f"{what} reads every peer; this workspace is {self.topology}-only")

    # -- all-reduce ---------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, *, two_shot: bool = True,
                   ring: bool | None = None) -> torch.Tensor:
        """Sum over ranks into a new contiguous tensor (x is only read). `ring`: the
        neighbour-only path (default: when the topology is ring)."""
        self._check(x)
        ring = self.topology == "ring" if ring is None else ring
        if not ring:
            self._need_mesh("the mesh all-reduce")
        src = x.reshape(1) if x.dim() == 0 else x
        out = torch.empty(src.shape, dtype=x.dtype)
        if x.numel():
            cap = self.ring_capacity(x.dtype) if ring else self.capacity(x.dtype)
            pieces = [(src[idx][lo:hi], out[idx][lo:hi].view(-1))
                      for idx, lo, hi in row_blocks(tuple(src.shape), cap)]
            if ring:
                self._ring_all_reduce(pieces)
            else:
                self._mesh_all_reduce(pieces, two_shot or len(pieces) > 1)
        return out.view(x.shape)

    def _mesh_all_reduce(self, pieces: list[tuple[torch.Tensor, torch.Tensor]],
                         two_shot: bool) -> None:
        seg, world, me, peers = self.seg, self.world_size, self.rank, self._peers()

        def copy_in(i: int, g: int, k: int) -> None:
            block = pieces[i][0]
            self._claim(g, k, peers)
            self._view(me, k, block.dtype, block.numel()).view(block.shape).copy_(block)
            seg.publish(_word(READY, k), g)

        def bufs(k: int, block: torch.Tensor) -> list[torch.Tensor]:
            return [self._view(p, k, block.dtype, block.numel()) for p in range(world)]

        def reduce_all(i: int, g: int, k: int) -> None:
            block, out = pieces[i]
            for p in peers:
                seg.wait(p, _word(READY, k), g)
            sum_in_rank_order(bufs(k, block), out)
            seg.publish(_word(DONE, k), g)

        def bounds(n: int) -> list[int]:
            return [s * n // world for s in range(world + 1)]

        def reduce_mine(i: int, g: int, k: int) -> None:
            block, out = pieces[i]
            for p in peers:
                seg.wait(p, _word(READY, k), g)
            b = bounds(block.numel())
            lo, hi = b[me], b[me + 1]
            if hi > lo:  # my slice, summed from every slot, kept in my slot for the others
                sum_in_rank_order([buf[lo:hi] for buf in bufs(k, block)], out[lo:hi])
                self._view(me, k, block.dtype, block.numel())[lo:hi].copy_(out[lo:hi])
            seg.publish(_word(REDUCED, k), g)

        def copy_out(i: int, g: int, k: int) -> None:
            block, out = pieces[i]
            b, views = bounds(block.numel()), bufs(k, block)
            for s in peers:
                seg.wait(s, _word(REDUCED, k), g)
                if b[s + 1] > b[s]:
                    out[b[s]:b[s + 1]].copy_(views[s][b[s]:b[s + 1]])
            seg.publish(_word(DONE, k), g)

        stages = [copy_in, reduce_mine, copy_out] if two_shot else [copy_in, reduce_all]
        self._pipeline(len(pieces), stages)

    def _ring_all_reduce(self, pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        seg, world, me, left, right = (self.seg, self.world_size, self.rank, self.left,
                                       self.right)
        last = world - 1

        def areas(rank: int, k: int, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            n, acc = block.numel(), accumulation_dtype(block.dtype)
            off = -(-n * acc.itemsize // 64) * 64
            return (self._view(rank, k, acc, n).view(block.shape),
                    self._view(rank, k, block.dtype, n, off))

        # the ring itself only needs the right neighbour (the one reader of my slot) to be done
        # with a slot; on a mesh workspace, where mesh calls (read by every peer) may have used
        # the slot before, wait for every peer
        readers = [right] if self.topology == "ring" else self._peers()

        def chain(i: int, g: int, k: int) -> None:  # partial sums 0 -> 1 -> ... -> world-1
            block, out = pieces[i]
            self._claim(g, k, readers)
            mine_acc, mine_res = areas(me, k, block)
            if me == 0:
                mine_acc.copy_(block)
                seg.publish(_word(READY, k), g)
                return
            seg.wait(left, _word(READY, k), g)
            left_acc = areas(left, k, block)[0]
            if me < last:
                torch.add(left_acc, block, out=mine_acc)
                seg.publish(_word(READY, k), g)
                return
            if out.dtype in _LOW_PRECISION:
                out.view(block.shape).copy_(left_acc + block)
            else:
                torch.add(left_acc, block, out=out.view(block.shape))
            seg.publish(_word(DONE, k), g)  # the last rank reads nothing more of round g
            mine_res.copy_(out)
            seg.publish(_word(REDUCED, k), g)

        def relay(i: int, g: int, k: int) -> None:  # the result world-1 -> 0 -> 1 -> ...
            if me == last:
                return
            block, out = pieces[i]
            seg.wait(left, _word(REDUCED, k), g)
            out.copy_(areas(left, k, block)[1])
            seg.publish(_word(DONE, k), g)
            if me != last - 1:  # world-1 already has it
                areas(me, k, block)[1].copy_(out)
                seg.publish(_word(REDUCED, k), g)

        self._pipeline(len(pieces), [chain, relay])

    # -- all-gather ---------------------------------------------------------------------------
    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Every rank's x concatenated along `dim` in rank order (same layout as comm.py's)."""
        self._check(x)
        self._need_mesh("the workspace all-gather")
        seg, world, me, peers = self.seg, self.world_size, self.rank, self._peers()
        xp = x.movedim(dim, 0)
        shape = tuple(xp.shape)
        out = torch.empty((world * shape[0], *shape[1:]), dtype=x.dtype)
        outs = out.view(world, *shape)
        pieces = list(row_blocks(shape, self.capacity(x.dtype)))

        def copy_in(i: int, g: int, k: int) -> None:
            idx, lo, hi = pieces[i]
            src = xp[idx][lo:hi]
            self._claim(g, k, peers)
            self._view(me, k, x.dtype, src.numel()).view(src.shape).copy_(src)
            seg.publish(_word(READY, k), g)

        def copy_out(i: int, g: int, k: int) -> None:
            idx, lo, hi = pieces[i]
            for p in range(world):
                dst = outs[p][idx][lo:hi]
                if p != me:
                    seg.wait(p, _word(READY, k), g)
                dst.copy_(self._view(p, k, x.dtype, dst.numel()).view(dst.shape))
            seg.publish(_word(DONE, k), g)

        self._pipeline(len(pieces), [copy_in, copy_out])
        return out.movedim(0, dim)

    # -- reduce-scatter -----------------------------------------------------------------------
    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Slice `rank` (of world_size equal slices along `dim`) of the sum over ranks."""
        self._check(x)
        self._need_mesh("the workspace reduce-scatter")
        world = self.world_size
        xp = x.movedim(dim, 0)
        if xp.shape[0] % world:
            raise ValueError(f"reduce_scatter: dim {dim} of size {xp.shape[0]} is not divisible "
                             f"by world size {world}")
        xs = xp.unflatten(0, (world, xp.shape[0] // world))

        def fill(s: int, idx: tuple[int, ...], lo: int, hi: int, dst: torch.Tensor) -> None:
            dst.copy_(xs[s][idx][lo:hi])

        return self._reduce_scatter(tuple(xs.shape[1:]), x.dtype, fill).movedim(0, dim)

    # the combine arithmetic the fused reduce-scatter below reproduces (collectives/fused.moe_combine)
    MOE_COMBINE = "torch"

    def fits_moe_combine(self, x: torch.Tensor) -> bool:
        """Whether `reduce_scatter_moe_combine` serves a reduce-scatter of x (any size here)."""
        return self.supports(x) and x.dim() == 2 and self.topology == "mesh"

    def reduce_scatter_moe_combine(self, y: torch.Tensor, order: torch.Tensor,
                                   weights: torch.Tensor,
                                   shared: torch.Tensor | None) -> torch.Tensor:
        """reduce_scatter(pad_rows(fused.moe_combine(y, order, weights, shared))) with the combine
        as the copy-in: each round's rows are combined straight into my slot, bitwise as the
        whole combine would give them (fused.moe_combine_block)."""
        fused.check_moe_args(y, order, weights, shared)
        self._check(y)
        self._need_mesh("the workspace reduce-scatter")
        t, d = weights.shape[0], y.shape[1]
        per = -(-t // self.world_size)  # rows of each rank's slice, the last ones padding
        inv = fused.inverse_order(order).view(weights.shape)

        def fill(s: int, idx: tuple[int, ...], lo: int, hi: int, dst: torch.Tensor) -> None:
            if idx:  # one row, columns lo:hi
                rows, cols, dst = (s * per + idx[0], s * per + idx[0] + 1), (lo, hi), dst.view(1, -1)
            else:
                rows, cols = (s * per + lo, s * per + hi), (0, d)
            fused.moe_combine_block(dst, y, inv, weights, shared, rows, cols)

        return self._reduce_scatter((per, d), y.dtype, fill)

    def _reduce_scatter(self, shape: tuple[int, ...], dtype: torch.dtype,
                        fill: Callable[[int, tuple[int, ...], int, int, torch.Tensor], None]
                        ) -> torch.Tensor:
        """The reduce-scatter of a [world, *shape] input that `fill(s, idx, lo, hi, dst)` writes
        piece by piece: slice s's `[idx][lo:hi]` into dst (a view of my slot, that piece's shape)."""
        seg, world, me, peers = self.seg, self.world_size, self.rank, self._peers()
        out = torch.empty(shape, dtype=dtype)
        pieces = list(row_blocks(shape, self.capacity(dtype) // world))

        def copy_in(i: int, g: int, k: int) -> None:
            idx, lo, hi = pieces[i]
            piece = out[idx][lo:hi]
            n = piece.numel()
            self._claim(g, k, peers)
            mine = self._view(me, k, dtype, world * n)
            for s in range(world):
                fill(s, idx, lo, hi, mine[s * n:(s + 1) * n].view(piece.shape))
            seg.publish(_word(READY, k), g)

        def reduce(i: int, g: int, k: int) -> None:
            idx, lo, hi = pieces[i]
            piece = out[idx][lo:hi]
            n = piece.numel()
            for p in peers:
                seg.wait(p, _word(READY, k), g)
            parts = [self._view(p, k, dtype, world * n)[me * n:(me + 1) * n]
                     for p in range(world)]
            sum_in_rank_order(parts, piece.view(-1))
            seg.publish(_word(DONE, k), g)

        self._pipeline(len(pieces), [copy_in, reduce])
        return out

    def abort(self, reason: str) -> None:
        self.seg.abort(reason)

    def close(self) -> None:
        self._views = {}
        self.seg.close()
