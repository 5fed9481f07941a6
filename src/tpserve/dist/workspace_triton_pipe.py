"""Triton kernels of the pipelined all-reduce and the fused all-reduce + add + RMSNorm (CUDA
workspace; launched by workspace_peer.py; helpers and the one-round kernels: workspace_triton.py).

Pipelined all-reduce: ONE launch for a tensor of any size, a fixed grid of `P` programs (the same
for every call of a workspace, fixed at construction). The pipeline area of every rank's buffer
(after the one-round area) holds NSLOTS slots, each cut into P program regions of `region_bytes`:

    [pipe_flags, + PIPE_FLAG_BYTES)   int64 flags[3 kinds][PIPE_MAX_PROGRAMS][NSLOTS][MAX_WORLD]
    [pipe_data, + NSLOTS*P*region)    slot k, program p: [pipe_data + (k*P + p)*region_bytes, +region)

Rounds are numbered per program across calls (g = 1, 2, ...; pcnt[p] in rank-local device memory
counts the rounds program p has run: every rank launches the same grid with the same sizes, so
these agree without exchange, and CUDA graph replays continue them). Round g of program p uses
slot g % NSLOTS and covers elements [t*P*R + p*R, + R) of the flattened input (R elements per
region, t the round within the call). Per round, program p of rank r:

    1. claim: waits until DONE[p][k][q] >= g - NSLOTS in its own buffer for every peer q (q has
       finished reading round g - NSLOTS, the slot's previous user, from r's slot)
    2. copy-in: its piece of the (strided) input into its own slot region
    3. READY: stores g into READY[p][k][r] of every rank's buffer (st.release.sys), then waits
       for READY[p][k][q] >= g in its own buffer (ld.acquire.sys)
    4. one-shot (world 2): sums the region of every rank in rank order -> out;
       two-shot (world > 2): sums its 1/world slice -> own slot and out, REDUCED flags as in 3,
       then copies the other slices from their owners
    5. DONE: stores g into DONE[p][k][r] of every peer's buffer

No barrier across programs or rounds: a program runs up to NSLOTS rounds ahead of its peers, and
different programs are at different rounds, so copy-in, reduce and copy-out of different chunks
overlap across the GPU, with one launch instead of one per chunk. All-gather and reduce-scatter
larger than a slot use the same scheme (pipelined_allgather_kernel, pipelined_reducescatter_kernel:
READY then read, DONE). All pipelined kernels share the per-program round counters and flags. Numerics as everywhere: rank
order, float32 accumulation, rounded once (bitwise the same as the one-round kernels).

Fused all-reduce + residual add + RMSNorm (one round, the one-round area and its epoch
protocol): program p copies rows p, p+P, ... of `partial` into its slot, meets the same program
of every peer (_barrier), then per row: total = rank-order sum (rounded), new_residual =
round(residual + total), normed = round(weight * round(h * rsqrt(mean(h^2) + eps))) with
h = new_residual in float32; both outputs written by the same kernel (dist/fused.py: definition).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tpserve.dist.workspace_triton import (MAX_WORLD, _barrier, _base, _finish, _poll, _round,
                                           _signal, _slot, _src, _sum_peers, _trap_if)

__all__ = ["PIPE_FLAG_BYTES", "PIPE_MAX_PROGRAMS", "PIPE_SLOTS", "allreduce_add_rmsnorm_kernel",
           "pipelined_allgather_kernel", "pipelined_allreduce_kernel",
           "pipelined_reducescatter_kernel"]

PIPE_SLOTS = 4
PIPE_MAX_PROGRAMS = 32
PIPE_FLAG_BYTES = 3 * PIPE_MAX_PROGRAMS * PIPE_SLOTS * MAX_WORLD * 8
_MAXW = tl.constexpr(MAX_WORLD)
_MAXP = tl.constexpr(PIPE_MAX_PROGRAMS)
_READY = tl.constexpr(0)
_REDUCED = tl.constexpr(1)
_DONE = tl.constexpr(2)


@triton.jit
def _flag_off(kind, pid, k, q, NSLOTS: tl.constexpr):
    return (((kind * _MAXP + pid) * NSLOTS + k) * _MAXW + q) * 8


@triton.jit
def _wait_ge(addr, value, state_ptr, max_spin, trap, INTERP: tl.constexpr):
    seen = _poll(addr, INTERP)
    spins = 0
    while (seen < value) & (spins < max_spin):
        seen = _poll(addr, INTERP)
        spins += 1
    if seen < value:
        tl.store(state_ptr + 2, 1)
        _trap_if(trap, INTERP)


@triton.jit
def _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, kind, pid, k, value,
              RANK: tl.constexpr, WORLD: tl.constexpr, NSLOTS: tl.constexpr,
              INTERP: tl.constexpr):
    """Store `value` into flag (kind, pid, k, RANK) of every rank's buffer."""
    tl.debug_barrier()  # every thread's data accesses precede the release stores
    for q in tl.static_range(WORLD):
        peer = _base(B0, B1, B2, B3, B4, B5, B6, B7, q)
        _signal(peer + pipe_flags + _flag_off(kind, pid, k, RANK, NSLOTS), value, INTERP)


@triton.jit
def _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, kind, pid, k, value, state_ptr,
              max_spin, trap, RANK: tl.constexpr, WORLD: tl.constexpr, NSLOTS: tl.constexpr,
              INTERP: tl.constexpr):
    """Wait until flag (kind, pid, k, q) of this rank's buffer is >= value for every peer q."""
    mine = _base(B0, B1, B2, B3, B4, B5, B6, B7, RANK)
    for q in tl.static_range(WORLD):
        if q != RANK:
            _wait_ge(mine + pipe_flags + _flag_off(kind, pid, k, q, NSLOTS), value, state_ptr,
                     max_spin, trap, INTERP)
    tl.debug_barrier()


@triton.jit
def _region(B0, B1, B2, B3, B4, B5, B6, B7, P: tl.constexpr, off, DT: tl.constexpr):
    addr = _base(B0, B1, B2, B3, B4, B5, B6, B7, P) + off
    return tl.multiple_of(addr.to(tl.pointer_type(DT)), 16)


@triton.jit
def _sum_regions(B0, B1, B2, B3, B4, B5, B6, B7, off, idx, mask, WORLD: tl.constexpr,
                 DT: tl.constexpr, INTERP: tl.constexpr):
    """Sum over ranks 0, 1, ... of region[idx] at byte `off`, in float32, rounded once."""
    acc = tl.load(_region(B0, B1, B2, B3, B4, B5, B6, B7, 0, off, DT) + idx,
                  mask=mask).to(tl.float32)
    for q in tl.static_range(1, WORLD):
        acc += tl.load(_region(B0, B1, B2, B3, B4, B5, B6, B7, q, off, DT) + idx,
                       mask=mask).to(tl.float32)
    return _round(acc, DT, INTERP)


@triton.jit(do_not_specialize=["max_spin", "trap"])
def pipelined_allreduce_kernel(x_ptr, out_ptr, state_ptr, pcnt_ptr, B0, B1, B2, B3, B4, B5, B6,
                               B7, n, region_elems, region_bytes, pipe_flags, pipe_data,
                               max_spin, trap, d1, d2, d3, t0, t1, t2, t3,
                               RANK: tl.constexpr, WORLD: tl.constexpr, NSLOTS: tl.constexpr,
                               TWO_SHOT: tl.constexpr, CONTIG: tl.constexpr,
                               BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """out[i] = sum over ranks of x[i], i < n, in rounds of nprog * region_elems elements."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    per_round = region_elems * nprog
    rounds = tl.cdiv(n, per_round)
    first = tl.load(pcnt_ptr + pid)
    lanes = tl.arange(0, BLOCK)
    for t in range(rounds):
        g = first + t + 1
        k = g % NSLOTS
        start = t * per_round + pid * region_elems
        cnt = tl.minimum(region_elems, n - start)  # <= 0: nothing here, flags still move
        off = pipe_data + (k * nprog + pid) * region_bytes
        _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _DONE, pid, k, g - NSLOTS,
                  state_ptr, max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
        mine = _region(B0, B1, B2, B3, B4, B5, B6, B7, RANK, off, DT)
        for i0 in range(0, cnt, BLOCK):
            i = i0 + lanes
            m = i < cnt
            v = tl.load(x_ptr + _src(start + i, d1, d2, d3, t0, t1, t2, t3, CONTIG), mask=m)
            tl.store(mine + i, v, mask=m)
        _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _READY, pid, k, g, RANK, WORLD,
                  NSLOTS, INTERP)
        _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _READY, pid, k, g, state_ptr,
                  max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
        if TWO_SHOT:
            part = tl.cdiv(tl.cdiv(cnt, WORLD), 64) * 64
            for j0 in range(0, part, BLOCK):  # my slice of the region, from every rank
                j = RANK * part + j0 + lanes
                m = (j0 + lanes < part) & (j < cnt)
                r = _sum_regions(B0, B1, B2, B3, B4, B5, B6, B7, off, j, m, WORLD,
                               DT, INTERP)
                tl.store(mine + j, r, mask=m)
                tl.store(out_ptr + start + j, r, mask=m)
            _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _REDUCED, pid, k, g, RANK,
                      WORLD, NSLOTS, INTERP)
            _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _REDUCED, pid, k, g,
                      state_ptr, max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
            for j0 in range(0, part, BLOCK):  # the other slices from their owners
                for s in tl.static_range(WORLD):
                    if s != RANK:
                        j = s * part + j0 + lanes
                        m = (j0 + lanes < part) & (j < cnt)
                        src = _region(B0, B1, B2, B3, B4, B5, B6, B7, s, off, DT)
                        tl.store(out_ptr + start + j, tl.load(src + j, mask=m), mask=m)
        else:
            for i0 in range(0, cnt, BLOCK):
                i = i0 + lanes
                m = i < cnt
                r = _sum_regions(B0, B1, B2, B3, B4, B5, B6, B7, off, i, m, WORLD, DT,
                               INTERP)
                tl.store(out_ptr + start + i, r, mask=m)
        _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _DONE, pid, k, g, RANK, WORLD,
                  NSLOTS, INTERP)
    tl.store(pcnt_ptr + pid, first + rounds)


@triton.jit(do_not_specialize=["max_spin", "trap"])
def pipelined_allgather_kernel(x_ptr, out_ptr, state_ptr, pcnt_ptr, B0, B1, B2, B3, B4, B5, B6,
                               B7, n, region_elems, region_bytes, pipe_flags, pipe_data,
                               max_spin, trap, d1, d2, d3, t0, t1, t2, t3,
                               RANK: tl.constexpr, WORLD: tl.constexpr, NSLOTS: tl.constexpr,
                               CONTIG: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """out[s*n + i] = x_s[i] for every rank s, i < n; rounds and flags as the all-reduce's."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    per_round = region_elems * nprog
    rounds = tl.cdiv(n, per_round)
    first = tl.load(pcnt_ptr + pid)
    lanes = tl.arange(0, BLOCK)
    for t in range(rounds):
        g = first + t + 1
        k = g % NSLOTS
        start = t * per_round + pid * region_elems
        cnt = tl.minimum(region_elems, n - start)
        off = pipe_data + (k * nprog + pid) * region_bytes
        _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _DONE, pid, k, g - NSLOTS,
                  state_ptr, max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
        mine = _region(B0, B1, B2, B3, B4, B5, B6, B7, RANK, off, DT)
        for i0 in range(0, cnt, BLOCK):
            i = i0 + lanes
            m = i < cnt
            v = tl.load(x_ptr + _src(start + i, d1, d2, d3, t0, t1, t2, t3, CONTIG), mask=m)
            tl.store(mine + i, v, mask=m)
            tl.store(out_ptr + RANK * n + start + i, v, mask=m)
        _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _READY, pid, k, g, RANK, WORLD,
                  NSLOTS, INTERP)
        _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _READY, pid, k, g, state_ptr,
                  max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
        for i0 in range(0, cnt, BLOCK):
            i = i0 + lanes
            m = i < cnt
            for s in tl.static_range(WORLD):
                if s != RANK:
                    src = _region(B0, B1, B2, B3, B4, B5, B6, B7, s, off, DT)
                    tl.store(out_ptr + s * n + start + i, tl.load(src + i, mask=m), mask=m)
        _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _DONE, pid, k, g, RANK, WORLD,
                  NSLOTS, INTERP)
    tl.store(pcnt_ptr + pid, first + rounds)


@triton.jit(do_not_specialize=["max_spin", "trap"])
def pipelined_reducescatter_kernel(x_ptr, out_ptr, state_ptr, pcnt_ptr, B0, B1, B2, B3, B4, B5,
                                   B6, B7, n, region_elems, region_bytes, pipe_flags, pipe_data,
                                   max_spin, trap, d1, d2, d3, t0, t1, t2, t3,
                                   RANK: tl.constexpr, WORLD: tl.constexpr,
                                   NSLOTS: tl.constexpr, CONTIG: tl.constexpr,
                                   BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """out[i] = sum over ranks of x[RANK*n + i], i < n (n = slice length). A region holds the
    program's piece of all WORLD slices, `region_elems` (a multiple of 64) apart."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    per_round = region_elems * nprog
    rounds = tl.cdiv(n, per_round)
    first = tl.load(pcnt_ptr + pid)
    lanes = tl.arange(0, BLOCK)
    for t in range(rounds):
        g = first + t + 1
        k = g % NSLOTS
        start = t * per_round + pid * region_elems
        cnt = tl.minimum(region_elems, n - start)
        off = pipe_data + (k * nprog + pid) * region_bytes
        _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _DONE, pid, k, g - NSLOTS,
                  state_ptr, max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
        mine = _region(B0, B1, B2, B3, B4, B5, B6, B7, RANK, off, DT)
        for i0 in range(0, cnt, BLOCK):
            i = i0 + lanes
            m = i < cnt
            for s in tl.static_range(WORLD):
                src = _src(s * n + start + i, d1, d2, d3, t0, t1, t2, t3, CONTIG)
                tl.store(mine + s * region_elems + i, tl.load(x_ptr + src, mask=m), mask=m)
        _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _READY, pid, k, g, RANK, WORLD,
                  NSLOTS, INTERP)
        _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _READY, pid, k, g, state_ptr,
                  max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
        for i0 in range(0, cnt, BLOCK):
            i = i0 + lanes
            m = i < cnt
            r = _sum_regions(B0, B1, B2, B3, B4, B5, B6, B7, off, RANK * region_elems + i, m,
                             WORLD, DT, INTERP)
            tl.store(out_ptr + start + i, r, mask=m)
        _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _DONE, pid, k, g, RANK, WORLD,
                  NSLOTS, INTERP)
    tl.store(pcnt_ptr + pid, first + rounds)


@triton.jit(do_not_specialize=["max_spin", "trap", "eps"])
def allreduce_add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, normed_ptr, newres_ptr, state_ptr,
                                 cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7, rows, D, eps,
                                 slot_bytes, max_spin, trap, RANK: tl.constexpr,
                                 WORLD: tl.constexpr, BLOCK_D: tl.constexpr,
                                 INTERP: tl.constexpr):
    """Rows of D contiguous elements: (normed, new_residual) of dist/fused.py's definition."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT: tl.constexpr = normed_ptr.dtype.element_ty
    slot_off = (tl.load(state_ptr) % 2) * slot_bytes
    epoch = tl.load(cnt_ptr + pid)
    mine = _slot(B0, B1, B2, B3, B4, B5, B6, B7, RANK, slot_off, DT)
    cols = tl.arange(0, BLOCK_D)
    cm = cols < D
    for row in range(pid, rows, nprog):
        tl.store(mine + row * D + cols, tl.load(x_ptr + row * D + cols, mask=cm), mask=cm)
    _barrier(B0, B1, B2, B3, B4, B5, B6, B7, pid, epoch + 1, state_ptr, max_spin, trap,
             RANK, WORLD, INTERP)
    w = tl.load(w_ptr + cols, mask=cm).to(tl.float32)
    for row in range(pid, rows, nprog):
        idx = row * D + cols
        total = _sum_peers(B0, B1, B2, B3, B4, B5, B6, B7, slot_off, idx, cm, WORLD, DT, INTERP)
        res = tl.load(res_ptr + idx, mask=cm)
        new = _round(res.to(tl.float32) + total.to(tl.float32), DT, INTERP)
        tl.store(newres_ptr + idx, new, mask=cm)
        h = tl.where(cm, new.to(tl.float32), 0.0)
        r = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / D + eps)
        q = _round(h * r, DT, INTERP)
        tl.store(normed_ptr + idx, _round(w * q.to(tl.float32), DT, INTERP), mask=cm)
    _finish(state_ptr, cnt_ptr, pid, nprog, epoch + 1)

