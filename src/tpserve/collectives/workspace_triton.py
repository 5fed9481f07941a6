"""Triton kernels of the CUDA workspace collectives (launched by workspace_peer.py).

Every rank owns one buffer in peer-mapped memory (torch symmetric memory, ipc.py); its address
in every process is passed as the scalars B0..B7 (rank order; unused ones 0). Buffer layout:

    [0, FLAG_BYTES)               int64 flags[MAX_PROGRAMS][MAX_WORLD]
    [DATA_OFFSET, + 2*slot_bytes) two data slots (double buffering by call parity)

Synchronisation is by flags only (no peer atomics, so it also runs over PCIe): program `pid` of
rank r announces "I reached barrier value v" by storing v into flags[pid][r] of every peer's
buffer with st.release.sys, and waits until its own flags[pid][q] >= v for every q with
ld.acquire.sys. Values are per-program epochs: counters[pid] (rank-local device memory) counts the
barriers program pid has passed; every rank launches the same kernels with the same grids in the
same order, so the counters agree across ranks without ever being exchanged. The kernels read and
advance them on the device, so a CUDA graph replay continues the sequence (graph-safe, no host
sync). A program only reads data that the same program index wrote on the peers, so one
per-program barrier is enough inside a call.

Reuse across calls: call i uses data slot (i mod 2), i = state[0], which the last program to
finish (a local atomic ticket in state[1]) advances. A rank can only start call i+2 (same slot)
after its call i+1 passed a barrier with every peer, and a peer reaches call i+1 only after its
call i, reads included, has completed (kernels on one stream run in order). So no rank overwrites
a slot that a peer may still read. Requirement: a rank issues its collectives on one stream.

A wait that exceeds `max_spin` polls gives up: it sets state[2] = 1 and, if `trap` != 0, aborts
the kernel (a CUDA error on the host: a loud failure instead of wrong sums). The engine default
waits about as long as NCCL's own timeout and traps; the start-up self-test and the bench wait
seconds and only set the flag, so a broken path is reported instead of hanging the GPU. With
INTERP (Triton's CPU interpreter, used by the tests) the flag accesses are plain volatile
loads/stores.

Numerics: per element, sum over ranks in rank order in float32, rounded once to the output dtype.

`reducescatter_moe_combine_kernel` is the reduce-scatter whose copy-in is an MoE's combine
(collectives/fused.py), for a padded combine that fits one slot: each rank computes its combined rows
with kernels/moe/route_triton.combine_sorted's own tile code straight into its slot (plus the shared
experts' output, rounded as torch adds; `moe_combined_tile`), then sums its slice as
`reducescatter_kernel` does: bitwise combine_sorted + add + reduce-scatter. Larger ones:
workspace_triton_pipe.pipelined_moe_combine_kernel, the same tile code in the pipelined rounds.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tpserve.kernels.moe.route_triton import combine_sorted_tile

MAX_WORLD = 8
MAX_PROGRAMS = 128
FLAG_BYTES = MAX_PROGRAMS * MAX_WORLD * 8
DATA_OFFSET = FLAG_BYTES  # a multiple of 256
_MAXW = tl.constexpr(MAX_WORLD)
_DATA = tl.constexpr(DATA_OFFSET)


@triton.jit
def _base(B0, B1, B2, B3, B4, B5, B6, B7, P: tl.constexpr):
    addr = B0
    if P == 1:
        addr = B1
    if P == 2:
        addr = B2
    if P == 3:
        addr = B3
    if P == 4:
        addr = B4
    if P == 5:
        addr = B5
    if P == 6:
        addr = B6
    if P == 7:
        addr = B7
    return addr


@triton.jit
def _slot(B0, B1, B2, B3, B4, B5, B6, B7, P: tl.constexpr, slot_off, DT: tl.constexpr):
    """Typed pointer to rank P's current data slot (16-byte aligned: lets loads vectorise)."""
    addr = _base(B0, B1, B2, B3, B4, B5, B6, B7, P) + _DATA + slot_off
    return tl.multiple_of(addr.to(tl.pointer_type(DT)), 16)


@triton.jit
def _round_start(state_ptr, cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7, pid, slot_bytes, RANK: tl.constexpr,
                 DT: tl.constexpr):
    """A kernel's start of a round: -> (this round's slot offset (the two data slots alternate by
    round), this program's epoch, a typed pointer to this rank's slot)."""
    slot_off = (tl.load(state_ptr) % 2) * slot_bytes
    epoch = tl.load(cnt_ptr + pid)
    return slot_off, epoch, _slot(B0, B1, B2, B3, B4, B5, B6, B7, RANK, slot_off, DT)


@triton.jit
def _signal(addr, value, INTERP: tl.constexpr):
    ptr = addr.to(tl.pointer_type(tl.int64))
    if INTERP:
        tl.store(ptr, value)
    else:
        tl.inline_asm_elementwise("st.release.sys.global.b64 [$1], $2;\n\tmov.u32 $0, 0;",
                                  "=r,l,l", [ptr, value], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _poll(addr, INTERP: tl.constexpr):
    ptr = addr.to(tl.pointer_type(tl.int64))
    if INTERP:
        seen = tl.load(ptr, volatile=True)
    else:
        seen = tl.inline_asm_elementwise("ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [ptr],
                                         dtype=tl.int64, is_pure=False, pack=1)
    return seen


@triton.jit
def _trap_if(flag, INTERP: tl.constexpr):
    """Abort the kernel (a CUDA error the host sees) when flag != 0."""
    if not INTERP:
        tl.inline_asm_elementwise("{\n\t.reg .pred %p_trap;\n\tsetp.ne.s32 %p_trap, $1, 0;\n\t"
                                  "@%p_trap trap;\n\tmov.u32 $0, 0;\n\t}",
                                  "=r,r", [flag], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _barrier(B0, B1, B2, B3, B4, B5, B6, B7, pid, value, state_ptr, max_spin, trap,
             RANK: tl.constexpr, WORLD: tl.constexpr, INTERP: tl.constexpr):
    """Program `pid` of every rank reaches `value`; this program's prior writes are published."""
    tl.debug_barrier()  # every thread's data writes precede the release stores below
    for q in tl.static_range(WORLD):
        peer = _base(B0, B1, B2, B3, B4, B5, B6, B7, q)
        _signal(peer + (pid * _MAXW + RANK) * 8, value, INTERP)
    mine = _base(B0, B1, B2, B3, B4, B5, B6, B7, RANK)
    for q in tl.static_range(WORLD):
        flag = mine + (pid * _MAXW + q) * 8
        seen = _poll(flag, INTERP)
        spins = 0
        while (seen < value) & (spins < max_spin):
            seen = _poll(flag, INTERP)
            spins += 1
        if seen < value:
            tl.store(state_ptr + 2, 1)
            _trap_if(trap, INTERP)
    tl.debug_barrier()


@triton.jit
def _finish(state_ptr, cnt_ptr, pid, nprog, epoch):
    """Store this program's epoch; the last program to finish flips the slot parity."""
    tl.store(cnt_ptr + pid, epoch)
    tl.debug_barrier()
    ticket = tl.atomic_add(state_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if ticket == nprog - 1:
        tl.store(state_ptr + 1, 0)
        tl.store(state_ptr, tl.load(state_ptr) + 1)


@triton.jit
def _src(k, d1, d2, d3, t0, t1, t2, t3, CONTIG: tl.constexpr):
    """Element offset of logical (row-major) index k in a tensor of <= 4 dims with strides t."""
    if CONTIG:
        off = k
    else:
        r = k.to(tl.int64)
        i3 = r % d3
        r = r // d3
        i2 = r % d2
        r = r // d2
        i1 = r % d1
        i0 = r // d1
        off = i0 * t0 + i1 * t1 + i2 * t2 + i3 * t3
    return off


@triton.jit
def _copy_in(x_ptr, mine, base, n, pid, nprog, d1, d2, d3, t0, t1, t2, t3, CONTIG: tl.constexpr,
             BLOCK: tl.constexpr):
    """mine[i] = x[base + i] (logical index, through _src) for i < n, this program's share."""
    lanes = tl.arange(0, BLOCK)
    for i0 in range(pid * BLOCK, n, nprog * BLOCK):
        i = i0 + lanes
        m = i < n
        tl.store(mine + i, tl.load(x_ptr + _src(base + i, d1, d2, d3, t0, t1, t2, t3, CONTIG), mask=m), mask=m)


@triton.jit
def _round(acc, DT: tl.constexpr, INTERP: tl.constexpr):
    """float32 -> DT, round to nearest even (the GPU's cvt.rn; the interpreter truncates bf16,
    so there the rounding is done on the bits)."""
    if INTERP and DT == tl.bfloat16:
        bits = acc.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        out = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        out = acc.to(DT)
    return out


@triton.jit
def _add_rn(a, b, INTERP: tl.constexpr):
    """a + b in float32, rounded on its own: never contracted with a product that feeds it into one
    fused multiply-add (which rounds once where torch, adding a stored product, rounds twice)."""
    if INTERP:
        out = a + b
    else:
        out = tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b],
                                        dtype=tl.float32, is_pure=True, pack=1)
    return out


@triton.jit
def _sum_peers(B0, B1, B2, B3, B4, B5, B6, B7, slot_off, idx, mask,
               WORLD: tl.constexpr, DT: tl.constexpr, INTERP: tl.constexpr):
    """Sum over ranks 0, 1, ... of slot[idx], in float32, rounded once to DT."""
    acc = tl.load(_slot(B0, B1, B2, B3, B4, B5, B6, B7, 0, slot_off, DT) + idx,
                  mask=mask).to(tl.float32)
    for q in tl.static_range(1, WORLD):
        acc += tl.load(_slot(B0, B1, B2, B3, B4, B5, B6, B7, q, slot_off, DT) + idx,
                       mask=mask).to(tl.float32)
    return _round(acc, DT, INTERP)


@triton.jit(do_not_specialize=["max_spin", "trap"])
def allreduce_kernel(x_ptr, out_ptr, state_ptr, cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7,
                     base, n, slot_bytes, max_spin, trap, d1, d2, d3, t0, t1, t2, t3,
                     RANK: tl.constexpr, WORLD: tl.constexpr, TWO_SHOT: tl.constexpr,
                     CONTIG: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """out[base + i] = sum over ranks of x[base + i], i < n (one round through the slots)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    slot_off, epoch, mine = _round_start(state_ptr, cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7, pid, slot_bytes,
                                         RANK, DT)
    lanes = tl.arange(0, BLOCK)
    if TWO_SHOT:
        part = tl.cdiv(tl.cdiv(n, WORLD), 64) * 64  # slice s is [s*part, (s+1)*part) & < n
        for j0 in range(pid * BLOCK, part, nprog * BLOCK):
            j = j0 + lanes
            for s in tl.static_range(WORLD):
                g = s * part + j
                m = (j < part) & (g < n)
                v = tl.load(x_ptr + _src(base + g, d1, d2, d3, t0, t1, t2, t3, CONTIG), mask=m)
                tl.store(mine + g, v, mask=m)
        _barrier(B0, B1, B2, B3, B4, B5, B6, B7, pid, epoch + 1, state_ptr, max_spin, trap,
                 RANK, WORLD, INTERP)
        for j0 in range(pid * BLOCK, part, nprog * BLOCK):  # reduce-scatter: my slice
            j = j0 + lanes
            g = RANK * part + j
            m = (j < part) & (g < n)
            r = _sum_peers(B0, B1, B2, B3, B4, B5, B6, B7, slot_off, g, m, WORLD, DT, INTERP)
            tl.store(mine + g, r, mask=m)
            tl.store(out_ptr + base + g, r, mask=m)
        _barrier(B0, B1, B2, B3, B4, B5, B6, B7, pid, epoch + 2, state_ptr, max_spin, trap,
                 RANK, WORLD, INTERP)
        for j0 in range(pid * BLOCK, part, nprog * BLOCK):  # all-gather: the other slices
            j = j0 + lanes
            for s in tl.static_range(WORLD):
                if s != RANK:
                    g = s * part + j
                    m = (j < part) & (g < n)
                    src = _slot(B0, B1, B2, B3, B4, B5, B6, B7, s, slot_off, DT)
                    tl.store(out_ptr + base + g, tl.load(src + g, mask=m), mask=m)
        _finish(state_ptr, cnt_ptr, pid, nprog, epoch + 2)
    else:
        _copy_in(x_ptr, mine, base, n, pid, nprog, d1, d2, d3, t0, t1, t2, t3, CONTIG, BLOCK)
        _barrier(B0, B1, B2, B3, B4, B5, B6, B7, pid, epoch + 1, state_ptr, max_spin, trap,
                 RANK, WORLD, INTERP)
        for i0 in range(pid * BLOCK, n, nprog * BLOCK):
            i = i0 + lanes
            m = i < n
            r = _sum_peers(B0, B1, B2, B3, B4, B5, B6, B7, slot_off, i, m, WORLD, DT, INTERP)
            tl.store(out_ptr + base + i, r, mask=m)
        _finish(state_ptr, cnt_ptr, pid, nprog, epoch + 1)


@triton.jit(do_not_specialize=["max_spin", "trap"])
def allgather_kernel(x_ptr, out_ptr, state_ptr, cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7,
                     base, n, total, slot_bytes, max_spin, trap, d1, d2, d3, t0, t1, t2, t3,
                     RANK: tl.constexpr, WORLD: tl.constexpr, CONTIG: tl.constexpr,
                     BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """out[s*total + base + i] = x_s[base + i] for every rank s, i < n."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    slot_off, epoch, mine = _round_start(state_ptr, cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7, pid, slot_bytes,
                                         RANK, DT)
    lanes = tl.arange(0, BLOCK)
    _copy_in(x_ptr, mine, base, n, pid, nprog, d1, d2, d3, t0, t1, t2, t3, CONTIG, BLOCK)
    _barrier(B0, B1, B2, B3, B4, B5, B6, B7, pid, epoch + 1, state_ptr, max_spin, trap,
             RANK, WORLD, INTERP)
    for i0 in range(pid * BLOCK, n, nprog * BLOCK):
        i = i0 + lanes
        m = i < n
        for s in tl.static_range(WORLD):
            src = _slot(B0, B1, B2, B3, B4, B5, B6, B7, s, slot_off, DT)
            tl.store(out_ptr + s * total + base + i, tl.load(src + i, mask=m), mask=m)
    _finish(state_ptr, cnt_ptr, pid, nprog, epoch + 1)


@triton.jit(do_not_specialize=["max_spin", "trap"])
def reducescatter_kernel(x_ptr, out_ptr, state_ptr, cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7,
                         base, n, slice_numel, slot_bytes, max_spin, trap,
                         d1, d2, d3, t0, t1, t2, t3,
                         RANK: tl.constexpr, WORLD: tl.constexpr, CONTIG: tl.constexpr,
                         BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """out[base + i] = sum over ranks of x[RANK*slice_numel + base + i], i < n."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    slot_off, epoch, mine = _round_start(state_ptr, cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7, pid, slot_bytes,
                                         RANK, DT)
    stride = tl.cdiv(n, 64) * 64  # slice s of this round sits at [s*stride, s*stride + n)
    lanes = tl.arange(0, BLOCK)
    for i0 in range(pid * BLOCK, n, nprog * BLOCK):
        i = i0 + lanes
        m = i < n
        for s in tl.static_range(WORLD):
            k = s * slice_numel + base + i
            v = tl.load(x_ptr + _src(k, d1, d2, d3, t0, t1, t2, t3, CONTIG), mask=m)
            tl.store(mine + s * stride + i, v, mask=m)
    _barrier(B0, B1, B2, B3, B4, B5, B6, B7, pid, epoch + 1, state_ptr, max_spin, trap,
             RANK, WORLD, INTERP)
    for i0 in range(pid * BLOCK, n, nprog * BLOCK):
        i = i0 + lanes
        m = i < n
        r = _sum_peers(B0, B1, B2, B3, B4, B5, B6, B7, slot_off, RANK * stride + i, m, WORLD, DT,
                       INTERP)
        tl.store(out_ptr + base + i, r, mask=m)
    _finish(state_ptr, cnt_ptr, pid, nprog, epoch + 1)


@triton.jit
def moe_combined_tile(y_ptr, inv_ptr, w_ptr, shared_ptr, t, T, d, dm, D, TOP_K: tl.constexpr,
                      K_PAD: tl.constexpr, HAS_SHARED: tl.constexpr, DT: tl.constexpr,
                      INTERP: tl.constexpr):
    """Row t of the padded combine at columns d (dm: d < D), in DT: combine_sorted_tile rounded
    once (+ shared, added in float32 and rounded as torch adds two DT tensors); zero for a padding
    row (t >= T). The one copy of this arithmetic for both fused MoE combine + reduce-scatter
    kernels (this one-round kernel and workspace_triton_pipe's pipelined one)."""
    t = t.to(tl.int64)
    tc = tl.minimum(t, T - 1)  # a padding row computes the last token's, then gives 0
    v = _round(combine_sorted_tile(y_ptr, inv_ptr, w_ptr, tc, d, D, TOP_K, K_PAD), DT, INTERP)
    if HAS_SHARED:
        sh = tl.load(shared_ptr + tc * D + d, mask=dm, other=0.0)
        v = _round(_add_rn(v.to(tl.float32), sh.to(tl.float32), INTERP), DT, INTERP)
    return tl.where(t < T, v, tl.zeros_like(v))


@triton.jit(do_not_specialize=["max_spin", "trap"])
def reducescatter_moe_combine_kernel(y_ptr, inv_ptr, w_ptr, shared_ptr, out_ptr, state_ptr, cnt_ptr,
                                     B0, B1, B2, B3, B4, B5, B6, B7, T, D, per, slot_bytes,
                                     max_spin, trap, RANK: tl.constexpr, WORLD: tl.constexpr,
                                     TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                                     BLOCK_D: tl.constexpr, HAS_SHARED: tl.constexpr,
                                     INTERP: tl.constexpr):
    """out[r, :] = sum over ranks of combined[RANK*per + r, :], r < per, combined [T, D] (rows
    past T zero) = combine_sorted(y, inv, w) (+ shared) of each rank's own inputs. Work unit: one
    row of a slice and BLOCK_D columns; a program copies in and sums the same units."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    slot_off, epoch, mine = _round_start(state_ptr, cnt_ptr, B0, B1, B2, B3, B4, B5, B6, B7, pid, slot_bytes,
                                         RANK, DT)
    stride = tl.cdiv(per * D, 64) * 64  # slice s sits at [s*stride, s*stride + per*D)
    tiles = tl.cdiv(D, BLOCK_D)
    lanes = tl.arange(0, BLOCK_D)
    for u in range(pid, per * tiles, nprog):
        r = u // tiles
        d = (u % tiles) * BLOCK_D + lanes
        dm = d < D
        for s in tl.static_range(WORLD):
            v = moe_combined_tile(y_ptr, inv_ptr, w_ptr, shared_ptr, s * per + r, T, d, dm, D,
                                  TOP_K, K_PAD, HAS_SHARED, DT, INTERP)
            tl.store(mine + s * stride + r * D + d, v, mask=dm)
    _barrier(B0, B1, B2, B3, B4, B5, B6, B7, pid, epoch + 1, state_ptr, max_spin, trap,
             RANK, WORLD, INTERP)
    for u in range(pid, per * tiles, nprog):
        r = u // tiles
        d = (u % tiles) * BLOCK_D + lanes
        dm = d < D
        i = r * D + d
        res = _sum_peers(B0, B1, B2, B3, B4, B5, B6, B7, slot_off, RANK * stride + i, dm, WORLD, DT,
                         INTERP)
        tl.store(out_ptr + i, res, mask=dm)
    _finish(state_ptr, cnt_ptr, pid, nprog, epoch + 1)
