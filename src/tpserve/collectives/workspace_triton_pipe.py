"""Triton kernels of the pipelined all-reduce / all-gather / reduce-scatter, the pipelined fused
MoE combine + reduce-scatter and the fused all-reduce + add + RMSNorm and all-reduce + mHC expand
(CUDA workspace; launched by workspace_peer.py; helpers and the one-round kernels:
workspace_triton.py).

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

Software pipelining: at step t a program runs stages 1-3 of round t, 4 of round t-1 and (two-shot)
the copy-out of round t-2, so its wait for the peers' READY of one round is covered by copying
the next round in, and the rounds of different programs and ranks drift apart freely (up to
NSLOTS rounds): no barrier across programs or rounds, one launch instead of one per chunk.
`pipelined_kernel` serves all-reduce (MODE AR1 / AR2), all-gather (AG: READY, copy every peer's
region out, DONE) and reduce-scatter (RS: a region holds the program's piece of every slice;
READY, sum slice RANK, DONE), all sharing the per-program round counters and flags. Numerics as
everywhere: rank order, float32 accumulation, rounded once (bitwise the same as the one-round
kernels).

Pipelined fused MoE combine + reduce-scatter (`pipelined_moe_combine_kernel`, any size; the
one-round kernel, workspace_triton.reducescatter_moe_combine_kernel, serves what fits a slot): the
RS mode above with the combine as its copy-in. The input is the padded combine [world*per, D]
(collectives/fused.py), never materialised: in round t program p computes elements [start, start + cnt)
of every slice s (flat in slice s's [per, D] rows) straight into its slot region, with
combine_sorted's column tiles (BLOCK_D) that overlap the piece, each stored masked to it (a tile
on a round's edge is computed in both rounds, the same bits), by workspace_triton's
`moe_combined_tile`, the one-round kernel's own arithmetic; claim, READY, the sum of slice RANK
and DONE are the RS mode's (`_claim`, `_combine`), and the rounds count on the same per-program
counters. So the result is bitwise the one-round kernel's, and combine_sorted (+ shared), padded
and reduce-scattered.

Fused all-reduce + residual add + RMSNorm (one round, the one-round area and its epoch
protocol): program p copies rows p, p+P, ... of `partial` into its slot, meets the same program
of every peer (_barrier), then per row: total = rank-order sum (rounded), new_residual =
round(residual + total), normed = round(weight * round(h * rsqrt(mean(h^2) + eps))) with
h = new_residual in float32; both outputs written by the same kernel (collectives/fused.py: definition).

Fused all-reduce + mHC expand (the same one round): the work is cut into tiles of a row's columns;
program p copies tiles p, p+P, ... of `partial` in, meets the same program of every peer, then per
tile: total = rank-order sum (rounded; bitwise the all-reduce's), new streams = round(round(post
(x) total) + round(comb^T @ streams)) with the matmul in float32 over m = 0, 1, ... and post / comb
rounded to the streams' dtype first (collectives/fused.py: definition and error bound).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tpserve.collectives.workspace_triton import (MAX_WORLD, _barrier, _base, _finish, _poll, _round, _round_start,
                                           _signal, _src, _sum_peers, _trap_if, moe_combined_tile)

__all__ = ["AG", "AR1", "AR2", "PIPE_FLAG_BYTES", "PIPE_MAX_PROGRAMS", "PIPE_SLOTS", "RS",
           "allreduce_add_rmsnorm_kernel", "allreduce_hc_expand_kernel", "pipelined_kernel",
           "pipelined_moe_combine_kernel"]

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


AR1, AR2, AG, RS = 0, 1, 2, 3  # MODE: all-reduce in one-shot rounds (world 2) or two-shot
_AR2 = tl.constexpr(AR2)        # rounds (world > 2), all-gather, reduce-scatter
_AG = tl.constexpr(AG)
_RS = tl.constexpr(RS)


@triton.jit
def _round_geometry(t, first, n, region_elems, region_bytes, pipe_data, pid, nprog,
                    NSLOTS: tl.constexpr):
    """(g, slot, first element, element count, byte offset of the region) of call round t."""
    g = first + t + 1
    k = g % NSLOTS
    start = t * region_elems * nprog + pid * region_elems
    cnt = tl.minimum(region_elems, n - start)  # <= 0: nothing here, the flags still move
    off = pipe_data + (k * nprog + pid) * region_bytes
    return g, k, start, cnt, off


@triton.jit
def _claim(B0, B1, B2, B3, B4, B5, B6, B7, t, first, n, region_elems, region_bytes, pipe_flags,
           pipe_data, pid, nprog, state_ptr, max_spin, trap, RANK: tl.constexpr,
           WORLD: tl.constexpr, NSLOTS: tl.constexpr, INTERP: tl.constexpr):
    """Start of round t's copy-in: its _round_geometry, once every peer is DONE reading the
    slot's previous round (g - NSLOTS) from my region."""
    g, k, start, cnt, off = _round_geometry(t, first, n, region_elems, region_bytes, pipe_data,
                                            pid, nprog, NSLOTS)
    _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _DONE, pid, k, g - NSLOTS,
              state_ptr, max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
    return g, k, start, cnt, off


@triton.jit
def _copy_in(x_ptr, out_ptr, B0, B1, B2, B3, B4, B5, B6, B7, t, first, n, region_elems,
             region_bytes, pipe_flags, pipe_data, pid, nprog, state_ptr, max_spin, trap,
             d1, d2, d3, t0, t1, t2, t3, MODE: tl.constexpr, RANK: tl.constexpr,
             WORLD: tl.constexpr, NSLOTS: tl.constexpr, CONTIG: tl.constexpr,
             BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """Stage 1 of round t: claim my slot region, copy my input piece in, announce READY."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    g, k, start, cnt, off = _claim(B0, B1, B2, B3, B4, B5, B6, B7, t, first, n, region_elems,
                                   region_bytes, pipe_flags, pipe_data, pid, nprog, state_ptr,
                                   max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
    mine = _region(B0, B1, B2, B3, B4, B5, B6, B7, RANK, off, DT)
    lanes = tl.arange(0, BLOCK)
    for i0 in range(0, cnt, BLOCK):
        i = i0 + lanes
        m = i < cnt
        if MODE == _RS:  # every slice's piece, region_elems apart
            for s in tl.static_range(WORLD):
                src = _src(s * n + start + i, d1, d2, d3, t0, t1, t2, t3, CONTIG)
                tl.store(mine + s * region_elems + i, tl.load(x_ptr + src, mask=m), mask=m)
        else:
            v = tl.load(x_ptr + _src(start + i, d1, d2, d3, t0, t1, t2, t3, CONTIG), mask=m)
            tl.store(mine + i, v, mask=m)
            if MODE == _AG:
                tl.store(out_ptr + RANK * n + start + i, v, mask=m)
    _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _READY, pid, k, g, RANK, WORLD,
              NSLOTS, INTERP)


@triton.jit
def _combine(out_ptr, B0, B1, B2, B3, B4, B5, B6, B7, t, first, n, region_elems, region_bytes,
             pipe_flags, pipe_data, pid, nprog, state_ptr, max_spin, trap, MODE: tl.constexpr,
             RANK: tl.constexpr, WORLD: tl.constexpr, NSLOTS: tl.constexpr,
             BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """Stage 2 of round t: once every peer is READY, read their regions; DONE (two-shot:
    REDUCED, my reduced slice in my region for the others)."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    g, k, start, cnt, off = _round_geometry(t, first, n, region_elems, region_bytes, pipe_data,
                                            pid, nprog, NSLOTS)
    _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _READY, pid, k, g, state_ptr,
              max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
    lanes = tl.arange(0, BLOCK)
    if MODE == _AR2:
        mine = _region(B0, B1, B2, B3, B4, B5, B6, B7, RANK, off, DT)
        part = tl.cdiv(tl.cdiv(cnt, WORLD), 64) * 64
        for j0 in range(0, part, BLOCK):  # my slice of the region, from every rank
            j = RANK * part + j0 + lanes
            m = (j0 + lanes < part) & (j < cnt)
            r = _sum_regions(B0, B1, B2, B3, B4, B5, B6, B7, off, j, m, WORLD, DT, INTERP)
            tl.store(mine + j, r, mask=m)
            tl.store(out_ptr + start + j, r, mask=m)
        _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _REDUCED, pid, k, g, RANK,
                  WORLD, NSLOTS, INTERP)
    else:
        for i0 in range(0, cnt, BLOCK):
            i = i0 + lanes
            m = i < cnt
            if MODE == _AG:
                for s in tl.static_range(WORLD):
                    if s != RANK:
                        src = _region(B0, B1, B2, B3, B4, B5, B6, B7, s, off, DT)
                        tl.store(out_ptr + s * n + start + i, tl.load(src + i, mask=m), mask=m)
            elif MODE == _RS:
                r = _sum_regions(B0, B1, B2, B3, B4, B5, B6, B7, off, RANK * region_elems + i,
                                 m, WORLD, DT, INTERP)
                tl.store(out_ptr + start + i, r, mask=m)
            else:
                r = _sum_regions(B0, B1, B2, B3, B4, B5, B6, B7, off, i, m, WORLD, DT, INTERP)
                tl.store(out_ptr + start + i, r, mask=m)
        _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _DONE, pid, k, g, RANK, WORLD,
                  NSLOTS, INTERP)


@triton.jit
def _copy_out(out_ptr, B0, B1, B2, B3, B4, B5, B6, B7, t, first, n, region_elems, region_bytes,
              pipe_flags, pipe_data, pid, nprog, state_ptr, max_spin, trap, RANK: tl.constexpr,
              WORLD: tl.constexpr, NSLOTS: tl.constexpr, BLOCK: tl.constexpr,
              INTERP: tl.constexpr):
    """Stage 3 of a two-shot round: the other ranks' reduced slices; DONE."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    g, k, start, cnt, off = _round_geometry(t, first, n, region_elems, region_bytes, pipe_data,
                                            pid, nprog, NSLOTS)
    _hear_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _REDUCED, pid, k, g, state_ptr,
              max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
    lanes = tl.arange(0, BLOCK)
    part = tl.cdiv(tl.cdiv(cnt, WORLD), 64) * 64
    for j0 in range(0, part, BLOCK):
        for s in tl.static_range(WORLD):
            if s != RANK:
                j = s * part + j0 + lanes
                m = (j0 + lanes < part) & (j < cnt)
                src = _region(B0, B1, B2, B3, B4, B5, B6, B7, s, off, DT)
                tl.store(out_ptr + start + j, tl.load(src + j, mask=m), mask=m)
    _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _DONE, pid, k, g, RANK, WORLD,
              NSLOTS, INTERP)


@triton.jit(do_not_specialize=["max_spin", "trap"])
def pipelined_kernel(x_ptr, out_ptr, state_ptr, pcnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7, n,
                     region_elems, region_bytes, pipe_flags, pipe_data, max_spin, trap,
                     d1, d2, d3, t0, t1, t2, t3, MODE: tl.constexpr, RANK: tl.constexpr,
                     WORLD: tl.constexpr, NSLOTS: tl.constexpr, CONTIG: tl.constexpr,
                     BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """MODE AR1/AR2: out[i] = sum over ranks of x[i]; AG: out[s*n + i] = x_s[i];
    RS: out[i] = sum over ranks of x[RANK*n + i]; i < n. Software-pipelined: at step t this
    program copies round t in, combines round t-1 and (two-shot) copies round t-2 out."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rounds = tl.cdiv(n, region_elems * nprog)
    first = tl.load(pcnt_ptr + pid)
    for step in range(rounds + 2):  # the last two steps only drain the later stages
        if step < rounds:
            _copy_in(x_ptr, out_ptr, B0, B1, B2, B3, B4, B5, B6, B7, step, first, n,
                     region_elems, region_bytes, pipe_flags, pipe_data, pid, nprog, state_ptr,
                     max_spin, trap, d1, d2, d3, t0, t1, t2, t3, MODE, RANK, WORLD, NSLOTS,
                     CONTIG, BLOCK, INTERP)
        if (step >= 1) & (step <= rounds):
            _combine(out_ptr, B0, B1, B2, B3, B4, B5, B6, B7, step - 1, first, n, region_elems,
                     region_bytes, pipe_flags, pipe_data, pid, nprog, state_ptr, max_spin, trap,
                     MODE, RANK, WORLD, NSLOTS, BLOCK, INTERP)
        if MODE == _AR2:
            if step >= 2:
                _copy_out(out_ptr, B0, B1, B2, B3, B4, B5, B6, B7, step - 2, first, n,
                          region_elems, region_bytes, pipe_flags, pipe_data, pid, nprog,
                          state_ptr, max_spin, trap, RANK, WORLD, NSLOTS, BLOCK, INTERP)
    tl.store(pcnt_ptr + pid, first + rounds)


@triton.jit
def _moe_combine_in(y_ptr, inv_ptr, w_ptr, shared_ptr, out_ptr, B0, B1, B2, B3, B4, B5, B6, B7,
                    t, first, T, D, per, region_elems, region_bytes, pipe_flags, pipe_data, pid,
                    nprog, state_ptr, max_spin, trap, RANK: tl.constexpr, WORLD: tl.constexpr,
                    NSLOTS: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                    BLOCK_D: tl.constexpr, HAS_SHARED: tl.constexpr, INTERP: tl.constexpr):
    """Stage 1 of round t of the fused MoE combine + reduce-scatter: _copy_in's RS mode with the
    combine as the copy: claim my slot region, compute elements [start, start + cnt) of every
    slice s (flat in its [per, D] rows: padded tokens s*per ...) into it, region_elems apart,
    announce READY. Work: combine_sorted's column tiles (BLOCK_D) that overlap the piece, each
    stored masked to it (a tile on a round's edge is computed in both rounds, the same bits)."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    n = per * D
    g, k, start, cnt, off = _claim(B0, B1, B2, B3, B4, B5, B6, B7, t, first, n, region_elems,
                                   region_bytes, pipe_flags, pipe_data, pid, nprog, state_ptr,
                                   max_spin, trap, RANK, WORLD, NSLOTS, INTERP)
    mine = _region(B0, B1, B2, B3, B4, B5, B6, B7, RANK, off, DT)
    tiles = tl.cdiv(D, BLOCK_D)
    end = start + cnt
    last = tl.maximum(end, start + 1) - 1  # the piece's last element (cnt <= 0: no tiles)
    lo = (start // D) * tiles + (start % D) // BLOCK_D
    hi = tl.where(cnt > 0, (last // D) * tiles + (last % D) // BLOCK_D + 1, lo)
    lanes = tl.arange(0, BLOCK_D)
    for u in range(lo, hi):
        r = u // tiles
        d = (u % tiles) * BLOCK_D + lanes
        dm = d < D
        e = r * D + d
        m = dm & (e >= start) & (e < end)
        for s in tl.static_range(WORLD):
            v = moe_combined_tile(y_ptr, inv_ptr, w_ptr, shared_ptr, s * per + r, T, d, dm, D,
                                  TOP_K, K_PAD, HAS_SHARED, DT, INTERP)
            tl.store(mine + s * region_elems + (e - start), v, mask=m)
    _tell_all(B0, B1, B2, B3, B4, B5, B6, B7, pipe_flags, _READY, pid, k, g, RANK, WORLD,
              NSLOTS, INTERP)


@triton.jit(do_not_specialize=["max_spin", "trap"])
def pipelined_moe_combine_kernel(y_ptr, inv_ptr, w_ptr, shared_ptr, out_ptr, state_ptr, pcnt_ptr,
                                 B0, B1, B2, B3, B4, B5, B6, B7, T, D, per, region_elems,
                                 region_bytes, pipe_flags, pipe_data, max_spin, trap,
                                 RANK: tl.constexpr, WORLD: tl.constexpr, NSLOTS: tl.constexpr,
                                 TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                                 BLOCK_D: tl.constexpr, HAS_SHARED: tl.constexpr,
                                 BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """out [per, D] = sum over ranks of rows [RANK*per, (RANK+1)*per) of the padded combine (as
    workspace_triton.reducescatter_moe_combine_kernel, any size): pipelined_kernel's RS mode, its
    copy-in the combine. At step t this program combines round t into its slot and sums round
    t-1; rounds, slots and flags are pipelined_kernel's (the same per-program counters)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n = per * D
    rounds = tl.cdiv(n, region_elems * nprog)
    first = tl.load(pcnt_ptr + pid)
    for step in range(rounds + 1):  # the last step only sums the last round
        if step < rounds:
            _moe_combine_in(y_ptr, inv_ptr, w_ptr, shared_ptr, out_ptr, B0, B1, B2, B3, B4, B5,
                            B6, B7, step, first, T, D, per, region_elems, region_bytes,
                            pipe_flags, pipe_data, pid, nprog, state_ptr, max_spin, trap, RANK,
                            WORLD, NSLOTS, TOP_K, K_PAD, BLOCK_D, HAS_SHARED, INTERP)
        if step >= 1:
            _combine(out_ptr, B0, B1, B2, B3, B4, B5, B6, B7, step - 1, first, n, region_elems,
                     region_bytes, pipe_flags, pipe_data, pid, nprog, state_ptr, max_spin, trap,
                     _RS, RANK, WORLD, NSLOTS, BLOCK, INTERP)
    tl.store(pcnt_ptr + pid, first + rounds)


@triton.jit(do_not_specialize=["max_spin", "trap", "eps"])
def allreduce_add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, normed_ptr, newres_ptr, state_ptr,
                                 cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7, rows, D, eps,
                                 slot_bytes, max_spin, trap, RANK: tl.constexpr,
                                 WORLD: tl.constexpr, BLOCK_D: tl.constexpr,
                                 INTERP: tl.constexpr):
    """Rows of D contiguous elements: (normed, new_residual) of collectives/fused.py's definition."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT: tl.constexpr = normed_ptr.dtype.element_ty
    slot_off, epoch, mine = _round_start(state_ptr, cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7, pid, slot_bytes,
                                         RANK, DT)
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



@triton.jit(do_not_specialize=["max_spin", "trap"])
def allreduce_hc_expand_kernel(x_ptr, s_ptr, post_ptr, comb_ptr, out_ptr, state_ptr, cnt_ptr,
                               B0, B1, B2, B3, B4, B5, B6, B7, rows, D, slot_bytes, max_spin,
                               trap, RANK: tl.constexpr, WORLD: tl.constexpr, HC: tl.constexpr,
                               HC_P2: tl.constexpr, BLOCK_D: tl.constexpr,
                               INTERP: tl.constexpr):
    """x [rows, D], streams and out [rows, HC, D], post [rows, HC], comb [rows, HC, HC], all
    contiguous: out = new streams of collectives/fused.py's all-reduce + mHC expand. Tiles of
    BLOCK_D columns of a row are the units of work (no reduction along D)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    slot_off, epoch, mine = _round_start(state_ptr, cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7, pid, slot_bytes,
                                         RANK, DT)
    tiles = tl.cdiv(D, BLOCK_D)
    lanes = tl.arange(0, BLOCK_D)
    for unit in range(pid, rows * tiles, nprog):
        cols = (unit % tiles) * BLOCK_D + lanes
        idx = (unit // tiles) * D + cols
        tl.store(mine + idx, tl.load(x_ptr + idx, mask=cols < D), mask=cols < D)
    _barrier(B0, B1, B2, B3, B4, B5, B6, B7, pid, epoch + 1, state_ptr, max_spin, trap,
             RANK, WORLD, INTERP)
    hs = tl.arange(0, HC_P2)
    hm = hs < HC
    for unit in range(pid, rows * tiles, nprog):
        row = unit // tiles
        cols = (unit % tiles) * BLOCK_D + lanes
        cm = cols < D
        total = _sum_peers(B0, B1, B2, B3, B4, B5, B6, B7, slot_off, row * D + cols, cm, WORLD,
                           DT, INTERP).to(tl.float32)
        p = tl.load(post_ptr + row * HC + hs, mask=hm, other=0.0).to(tl.float32)
        p = _round(p, DT, INTERP).to(tl.float32)  # post.to(dtype)
        a = _round(p[:, None] * total[None, :], DT, INTERP).to(tl.float32)  # post (x) total
        acc = tl.zeros((HC_P2, BLOCK_D), dtype=tl.float32)  # comb^T @ streams, m = 0, 1, ...
        for m in tl.static_range(HC):
            c = tl.load(comb_ptr + (row * HC + m) * HC + hs, mask=hm, other=0.0).to(tl.float32)
            c = _round(c, DT, INTERP).to(tl.float32)  # comb[row, m, :].to(dtype)
            s = tl.load(s_ptr + (row * HC + m) * D + cols, mask=cm, other=0.0).to(tl.float32)
            acc += c[:, None] * s[None, :]
        new = _round(a + _round(acc, DT, INTERP).to(tl.float32), DT, INTERP)
        tl.store(out_ptr + (row * HC + hs[:, None]) * D + cols[None, :], new,
                 mask=hm[:, None] & cm[None, :])
    _finish(state_ptr, cnt_ptr, pid, nprog, epoch + 1)
