"""Triton kernel of the neighbour-only ring all-reduce (CUDA workspace; launched by
workspace_peer.py; the CPU twin is workspace.CpuWorkspace._ring_all_reduce).

For boxes linked in a ring, where not every pair of GPUs can talk: rank r only ever reads or
writes its own buffer and those of its neighbours, left = r-1 and right = r+1 (mod world); the
other addresses it is handed are never touched. Protocol, per round (a piece of the tensor):

    chain   rank 0 stores its input, in float32, as the partial sum in its region; rank r reads
            its left neighbour's partial, adds its own input (float32) and stores the new partial;
            rank world-1 rounds the total once to the dtype: the result
    relay   the result goes world-1 -> 0 -> 1 -> ... -> world-2, each rank copying it out of its
            left neighbour's region (and, but for world-2, into its own for its right neighbour)

So every element is summed in rank order 0, 1, 2, ... in float32 and rounded once, exactly as the
mesh kernels (workspace_triton._sum_peers, workspace_triton_pipe._sum_regions) sum it: ring and
mesh give bitwise the same result on every rank.

Pipelining, slots and regions are workspace_triton_pipe.py's: ONE launch of the same fixed grid of
P programs, the pipeline data area (NSLOTS slots of P program regions), round g of program p in
slot g % NSLOTS covering elements [t*P*R + p*R, + R) of the flattened (strided) input. A region
holds the float32 partial of R elements and, after it (256-byte aligned), the R-element result.
The ring keeps its own per-program round counters (rcnt) and its own flags (`ring_flags`, laid out
as the pipeline flags: int64 [3 kinds][PIPE_MAX_PROGRAMS][NSLOTS][MAX_WORLD], writer's rank last),
all pushed to the one rank that waits on them and polled in the waiter's own buffer:

    READY[p][k][left]    in r's buffer: left's partial of round g is in its region (from left)
    REDUCED[p][k][left]  in r's buffer: left's result of round g is in its region (from left)
    DONE[p][k][right]    in r's buffer: right has finished reading round g from r (from right)

Before writing round g into slot k, a rank waits for its one reader, the right neighbour, to be
DONE with round g - NSLOTS. At step t a program runs the chain of round t and the relay of round
t - (NSLOTS - 1), so NSLOTS - 1 rounds are in flight around the ring and no wait ever depends on a
later step (no deadlock; no barrier across programs or rounds).

Sharing the pipeline area with the mesh pipelined kernels (a mesh workspace may run both, e.g. in
the bench). The mesh kernels do not wait for the ring and the ring cannot write their flags to
non-neighbours, so the ring fences both ends of a call, reading only its own buffer: on entry each
program waits until every peer is DONE (the mesh pipeline's own DONE flags, which the peers push
into this buffer) with the last NSLOTS mesh rounds of its regions (pcnt, read only; skipped when
no mesh round ran since the ring's last fence, rcnt[PIPE_MAX_PROGRAMS + p]); on exit it waits
until its right neighbour is DONE with the call's last round. A mesh call that follows finds
nobody still reading its regions; a ring call that follows a mesh call does not overwrite what a
peer still reads. Where only neighbours are mapped, no mesh kernel runs and the entry fence finds
nothing to wait for.

No host synchronisation and no allocation (the counters are advanced on the device): a call can be
captured in a CUDA graph. A wait that exceeds max_spin polls sets state[2] and, if `trap`, aborts
(workspace_triton_pipe._wait_ge).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tpserve.collectives.workspace_triton import _base, _round, _signal, _src
from tpserve.collectives.workspace_triton_pipe import (_DONE, _MAXP, _READY, _REDUCED, PIPE_FLAG_BYTES,
                                                PIPE_MAX_PROGRAMS, _flag_off, _hear_all, _region,
                                                _round_geometry, _wait_ge)

__all__ = ["RING_COUNTERS", "RING_FLAG_BYTES", "ring_kernel", "ring_region_elems"]

RING_FLAG_BYTES = PIPE_FLAG_BYTES  # the same flag layout, a separate area
RING_COUNTERS = 2 * PIPE_MAX_PROGRAMS  # int64 rcnt: rounds per program, then the fenced pcnt
ACC_BYTES = 4                      # the partial sum is float32 for every supported dtype
_ACC = tl.constexpr(ACC_BYTES)


def ring_region_elems(region_bytes: int, itemsize: int) -> int:
    """Elements a program region carries per ring round: the float32 partial and the result side
    by side, a multiple of 64 (the result starts 256-byte aligned); 0 if the region is too small."""
    return int(region_bytes) // (ACC_BYTES + int(itemsize)) // 64 * 64


@triton.jit
def _tell(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, kind, pid, k, value, TO: tl.constexpr,
          RANK: tl.constexpr, NSLOTS: tl.constexpr, INTERP: tl.constexpr):
    """Store `value` into flag (kind, pid, k, RANK) of rank TO's buffer (a neighbour)."""
    tl.debug_barrier()  # every thread's data accesses precede the release store
    peer = _base(B0, B1, B2, B3, B4, B5, B6, B7, TO)
    _signal(peer + ring_flags + _flag_off(kind, pid, k, RANK, NSLOTS), value, INTERP)


@triton.jit
def _hear(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, kind, pid, k, value, state_ptr, max_spin,
          trap, FROM: tl.constexpr, RANK: tl.constexpr, NSLOTS: tl.constexpr,
          INTERP: tl.constexpr):
    """Wait until flag (kind, pid, k, FROM) of this rank's own buffer is >= value."""
    mine = _base(B0, B1, B2, B3, B4, B5, B6, B7, RANK)
    _wait_ge(mine + ring_flags + _flag_off(kind, pid, k, FROM, NSLOTS), value, state_ptr,
             max_spin, trap, INTERP)
    tl.debug_barrier()


@triton.jit
def _chain(x_ptr, out_ptr, B0, B1, B2, B3, B4, B5, B6, B7, t, first, n, region_elems,
           region_bytes, ring_flags, pipe_data, pid, nprog, state_ptr, max_spin, trap,
           d1, d2, d3, t0, t1, t2, t3, RANK: tl.constexpr, WORLD: tl.constexpr,
           NSLOTS: tl.constexpr, CONTIG: tl.constexpr, BLOCK: tl.constexpr,
           INTERP: tl.constexpr):
    """Round t's partial sums 0 -> 1 -> ... -> world-1; world-1 rounds the total (the result)."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    LEFT: tl.constexpr = (RANK + WORLD - 1) % WORLD
    RIGHT: tl.constexpr = (RANK + 1) % WORLD
    LAST: tl.constexpr = WORLD - 1
    g, k, start, cnt, off = _round_geometry(t, first, n, region_elems, region_bytes, pipe_data,
                                            pid, nprog, NSLOTS)
    # claim: my one reader (right) has finished round g - NSLOTS of this slot
    _hear(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, _DONE, pid, k, g - NSLOTS, state_ptr,
          max_spin, trap, RIGHT, RANK, NSLOTS, INTERP)
    my_acc = _region(B0, B1, B2, B3, B4, B5, B6, B7, RANK, off, tl.float32)
    my_res = _region(B0, B1, B2, B3, B4, B5, B6, B7, RANK, off + region_elems * _ACC, DT)
    lanes = tl.arange(0, BLOCK)
    if RANK == 0:
        for i0 in range(0, cnt, BLOCK):
            i = i0 + lanes
            m = i < cnt
            v = tl.load(x_ptr + _src(start + i, d1, d2, d3, t0, t1, t2, t3, CONTIG), mask=m)
            tl.store(my_acc + i, v.to(tl.float32), mask=m)
        _tell(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, _READY, pid, k, g, RIGHT, RANK,
              NSLOTS, INTERP)
    else:
        _hear(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, _READY, pid, k, g, state_ptr,
              max_spin, trap, LEFT, RANK, NSLOTS, INTERP)
        left_acc = _region(B0, B1, B2, B3, B4, B5, B6, B7, LEFT, off, tl.float32)
        for i0 in range(0, cnt, BLOCK):
            i = i0 + lanes
            m = i < cnt
            v = tl.load(x_ptr + _src(start + i, d1, d2, d3, t0, t1, t2, t3, CONTIG), mask=m)
            acc = tl.load(left_acc + i, mask=m) + v.to(tl.float32)
            if RANK == LAST:
                r = _round(acc, DT, INTERP)
                tl.store(out_ptr + start + i, r, mask=m)
                tl.store(my_res + i, r, mask=m)
            else:
                tl.store(my_acc + i, acc, mask=m)
        if RANK == LAST:  # it reads nothing more of round g; the result goes on to rank 0
            _tell(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, _DONE, pid, k, g, LEFT, RANK,
                  NSLOTS, INTERP)
            _tell(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, _REDUCED, pid, k, g, RIGHT, RANK,
                  NSLOTS, INTERP)
        else:
            _tell(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, _READY, pid, k, g, RIGHT, RANK,
                  NSLOTS, INTERP)


@triton.jit
def _relay(out_ptr, B0, B1, B2, B3, B4, B5, B6, B7, t, first, n, region_elems, region_bytes,
           ring_flags, pipe_data, pid, nprog, state_ptr, max_spin, trap, RANK: tl.constexpr,
           WORLD: tl.constexpr, NSLOTS: tl.constexpr, BLOCK: tl.constexpr,
           INTERP: tl.constexpr):
    """Round t's result world-1 -> 0 -> 1 -> ... -> world-2 (not run by world-1)."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    LEFT: tl.constexpr = (RANK + WORLD - 1) % WORLD
    RIGHT: tl.constexpr = (RANK + 1) % WORLD
    PASS_ON: tl.constexpr = RANK != WORLD - 2  # world-1, my right, already has it
    g, k, start, cnt, off = _round_geometry(t, first, n, region_elems, region_bytes, pipe_data,
                                            pid, nprog, NSLOTS)
    _hear(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, _REDUCED, pid, k, g, state_ptr, max_spin,
          trap, LEFT, RANK, NSLOTS, INTERP)
    res_off = off + region_elems * _ACC
    left_res = _region(B0, B1, B2, B3, B4, B5, B6, B7, LEFT, res_off, DT)
    my_res = _region(B0, B1, B2, B3, B4, B5, B6, B7, RANK, res_off, DT)
    lanes = tl.arange(0, BLOCK)
    for i0 in range(0, cnt, BLOCK):
        i = i0 + lanes
        m = i < cnt
        v = tl.load(left_res + i, mask=m)
        tl.store(out_ptr + start + i, v, mask=m)
        if PASS_ON:
            tl.store(my_res + i, v, mask=m)
    _tell(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, _DONE, pid, k, g, LEFT, RANK, NSLOTS,
          INTERP)
    if PASS_ON:
        _tell(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, _REDUCED, pid, k, g, RIGHT, RANK,
              NSLOTS, INTERP)


@triton.jit(do_not_specialize=["max_spin", "trap"])
def ring_kernel(x_ptr, out_ptr, state_ptr, pcnt_ptr, rcnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7, n,
                region_elems, region_bytes, pipe_flags, pipe_data, ring_flags, max_spin, trap,
                d1, d2, d3, t0, t1, t2, t3, RANK: tl.constexpr, WORLD: tl.constexpr,
                NSLOTS: tl.constexpr, CONTIG: tl.constexpr, BLOCK: tl.constexpr,
                INTERP: tl.constexpr):
    """out[i] = sum over ranks of x[i], i < n, through neighbours only. At step t this program
    runs the chain of round t and the relay of round t - (NSLOTS - 1). rcnt_ptr: RING_COUNTERS
    int64 (rank-local): this program's ring rounds so far, and the mesh rounds (pcnt) it last
    fenced."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    RIGHT: tl.constexpr = (RANK + 1) % WORLD
    LAG: tl.constexpr = NSLOTS - 1
    rounds = tl.cdiv(n, region_elems * nprog)
    first = tl.load(rcnt_ptr + pid)
    # entry fence: every peer is done reading the last NSLOTS mesh pipeline rounds of my regions
    # (their DONE flags in my own buffer; nothing to wait for if no mesh kernel ever ran)
    mesh = tl.load(pcnt_ptr + pid)
    if mesh != tl.load(rcnt_ptr + _MAXP + pid):  # mesh rounds ran since the last fence
        for j in tl.static_range(NSLOTS):
            gm = mesh + 1 + j
            _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _DONE, pid, gm % NSLOTS,
                      gm - NSLOTS, state_ptr, max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
        tl.store(rcnt_ptr + _MAXP + pid, mesh)
    for step in range(rounds + LAG):  # the last LAG steps only drain the relay
        if step < rounds:
            _chain(x_ptr, out_ptr, B0, B1, B2, B3, B4, B5, B6, B7, step, first, n, region_elems,
                   region_bytes, ring_flags, pipe_data, pid, nprog, state_ptr, max_spin, trap,
                   d1, d2, d3, t0, t1, t2, t3, RANK, WORLD, NSLOTS, CONTIG, BLOCK, INTERP)
        if RANK != WORLD - 1:
            if (step >= LAG) & (step - LAG < rounds):
                _relay(out_ptr, B0, B1, B2, B3, B4, B5, B6, B7, step - LAG, first, n,
                       region_elems, region_bytes, ring_flags, pipe_data, pid, nprog, state_ptr,
                       max_spin, trap, RANK, WORLD, NSLOTS, BLOCK, INTERP)
    # exit fence: my right neighbour has read the call's last round (so all of it) from me
    if rounds > 0:
        g = first + rounds
        _hear(B0, B1, B2, B3, B4, B5, B6, B7, ring_flags, _DONE, pid, g % NSLOTS, g, state_ptr,
              max_spin, trap, RIGHT, RANK, NSLOTS, INTERP)
    tl.store(rcnt_ptr + pid, first + rounds)
