"""PeerWorkspace: the host side of the CUDA workspace collectives (kernels: workspace_triton.py).

It holds every rank's buffer address, the rank-local epoch counters and the call state. A call
that fits one data slot is one launch of a one-round kernel (workspace_triton.py); a larger one
(and the "chunked" backend) is one launch of the pipelined kernel (workspace_triton_pipe.py:
several slots in flight, per-slot flags, no barrier per chunk), with no memory beyond the
workspace and the output. Buffer layout (`buffer_bytes_for`): the one-round area of
`workspace_bytes` (flags + two slots), then the pipeline flags and a pipeline area of another
`workspace_bytes` (PIPE_SLOTS slots x P program regions), then the ring flags. Inputs of any
strides are read in place by the kernels (up to 4 dims after merging; more falls back to one
contiguous copy). Launches only: no host synchronisation, no allocation other than the output,
so calls can be captured in CUDA graphs (compile each variant once, eagerly, before capturing).

The "ring" backend (`all_reduce_ring`; `all_reduce` by default where the topology is "ring"): the
neighbour-only all-reduce of workspace_triton_ring.py, one launch of the pipelined grid through the
pipeline area, rank r touching only its own and its neighbours' buffers; bitwise the mesh kernels'
result. A "ring" workspace is otherwise the same object: ipc.py still maps every peer's buffer
(mapping only the neighbours is not done there), but the Communicator sends nothing else to it
(all-gather, reduce-scatter and the fused kernels read every peer: the process group serves them).

`reduce_scatter_moe_combine`: the reduce-scatter of an MoE's combine (collectives/fused.py) at any size
the reduce-scatter serves, one launch: the combine computed straight into the workspace by
combine_sorted's own tile code, by the one-round kernel where the padded rows fit a slot, else by
the pipelined one (workspace_triton_pipe.py: the pipelined reduce-scatter with the combine as its
copy-in), bitwise the same result.

The buffers are supplied by the caller: torch symmetric memory on CUDA (ipc.py), or any memory
the current process can address (the tests use POSIX shared memory with Triton's interpreter).
"""

from __future__ import annotations

from typing import Any

import torch
import triton

from tpserve.collectives import fused
from tpserve.collectives import workspace_triton as kernels
from tpserve.collectives import workspace_triton_pipe as pipe
from tpserve.collectives import workspace_triton_ring as ring_kernels
from tpserve.collectives.workspace import TOPOLOGIES
from tpserve.kernels.moe.route_triton import COMBINE_NUM_WARPS, combine_block_d

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BLOCK = 1024
NUM_WARPS = 4
FUSED_MAX_DIM = 16384      # longest row the fused kernel keeps in registers
HC_MAX = 16                # most mHC streams the fused expand kernel takes
HC_BLOCK = 512             # columns per tile of the fused expand kernel
DEFAULT_MAX_SPIN = 1 << 30  # polls (~10+ minutes, like NCCL's timeout) before a wait gives up


def strided_layout(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], bool]:
    """(tensor, (d1, d2, d3, t0, t1, t2, t3), contiguous) describing x's logical order.

    Size-1 dims are dropped and dims that are contiguous with their neighbour merged; a layout
    that still needs more than 4 dims is copied to a contiguous tensor.
    """
    if x.is_contiguous():
        return x, (1, 1, 1, 0, 0, 0, 0), True
    dims: list[list[int]] = []  # [size, stride], outermost first
    for size, stride in zip(x.shape, x.stride()):
        if size == 1:
            continue
        if dims and dims[-1][1] == stride * size:
            dims[-1] = [dims[-1][0] * size, stride]
        else:
            dims.append([size, stride])
    if len(dims) > 4:
        return x.contiguous(), (1, 1, 1, 0, 0, 0, 0), True
    dims = [[1, 0]] * (4 - len(dims)) + dims
    (_, t0), (d1, t1), (d2, t2), (d3, t3) = dims
    return x, (d1, d2, d3, t0, t1, t2, t3), False


def buffer_bytes_for(workspace_bytes: int) -> int:
    """Bytes each rank's buffer needs for a workspace of `workspace_bytes` (both areas and the
    pipeline and ring flags)."""
    flags = pipe.PIPE_FLAG_BYTES + ring_kernels.RING_FLAG_BYTES
    return 2 * (int(workspace_bytes) // 256 * 256) + flags


def _programs(work: int) -> int:
    return max(1, min(kernels.MAX_PROGRAMS, -(-work // BLOCK)))


class PeerWorkspace:
    """Collectives through peer-mapped buffers; every method is collective over the group."""

    def __init__(self, rank: int, world_size: int, buffer_ptrs: list[int], buffer_bytes: int,
                 device: torch.device, *, interpret: bool = False, keepalive: Any = None,
                 max_spin: int = DEFAULT_MAX_SPIN, trap_on_timeout: bool = True,
                 topology: str = "mesh"):
        """`topology`: "ring" makes `all_reduce` take the neighbour-only ring by default."""
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}, got {topology!r}")
        if not 2 <= world_size <= kernels.MAX_WORLD:
            raise ValueError(f"PeerWorkspace supports 2..{kernels.MAX_WORLD} ranks, got "
                             f"{world_size}")
        if len(buffer_ptrs) != world_size:
            raise ValueError(f"need {world_size} buffer addresses, got {len(buffer_ptrs)}")
        self.rank, self.world_size, self.topology = rank, world_size, topology
        self.device = torch.device(device)
        flags = pipe.PIPE_FLAG_BYTES + ring_kernels.RING_FLAG_BYTES
        area = (buffer_bytes - flags) // 2 // 256 * 256
        self.slot_bytes = (area - kernels.DATA_OFFSET) // 2 // 256 * 256
        if self.slot_bytes < 256 * world_size:
            raise ValueError(f"a {buffer_bytes}-byte buffer is too small for a workspace")
        self.capacity_bytes = self.slot_bytes
        # pipeline area: a fixed grid (the same for every call: the per-program round counters
        # and regions must agree between calls), regions 256-byte aligned
        self.pipe_flags = area
        self.pipe_data = area + pipe.PIPE_FLAG_BYTES
        self.pipe_programs = max(1, min(pipe.PIPE_MAX_PROGRAMS, area // (pipe.PIPE_SLOTS * 1024)))
        self.region_bytes = area // pipe.PIPE_SLOTS // self.pipe_programs // 256 * 256
        self.ring_flags = self.pipe_data + area  # after the pipeline area
        self.addrs = [int(p) for p in buffer_ptrs] + [0] * (kernels.MAX_WORLD - world_size)
        self.interpret = interpret
        self.max_spin = int(max_spin)
        self.trap_on_timeout = bool(trap_on_timeout)  # else: set the error flag and go on
        # state: [call counter (slot parity), finished-program ticket, error flag, spare]
        self.state = torch.zeros(4, dtype=torch.int64, device=self.device)
        self.counters = torch.zeros(kernels.MAX_PROGRAMS, dtype=torch.int64, device=self.device)
        self.pipe_counters = torch.zeros(pipe.PIPE_MAX_PROGRAMS, dtype=torch.int64,
                                         device=self.device)
        self.ring_counters = torch.zeros(ring_kernels.RING_COUNTERS, dtype=torch.int64,
                                         device=self.device)  # the ring's own (its kernel's rcnt)
        self._keepalive = keepalive

    # -- what it can do -----------------------------------------------------------------------
    def capacity(self, dtype: torch.dtype) -> int:
        return self.slot_bytes // dtype.itemsize

    def ring_capacity(self, dtype: torch.dtype) -> int:
        """Elements one ring round carries over all programs (a program region holds the float32
        partial sum and the result side by side); larger tensors take several rounds."""
        region = ring_kernels.ring_region_elems(self.region_bytes, dtype.itemsize)
        return region * self.pipe_programs

    def supports(self, x: torch.Tensor) -> bool:
        return x.dtype in SUPPORTED_DTYPES and x.device == self.device

    def fits(self, op: str, x: torch.Tensor) -> bool:
        cap = self.capacity(x.dtype)
        if op == "reduce_scatter":
            per = x.numel() // self.world_size
            return self.world_size * (-(-per // 64) * 64) <= cap
        return x.numel() <= cap

    def error_flag(self) -> bool:
        """True if some wait gave up (a peer never arrived); reading it synchronises."""
        return bool(int(self.state[2].item()))

    def _launch(self, kernel: Any, programs: int, *args: Any, **constexprs: Any) -> None:
        kernel[(programs,)](*args, RANK=self.rank, WORLD=self.world_size, BLOCK=BLOCK,
                            INTERP=self.interpret, num_warps=NUM_WARPS, **constexprs)

    # -- collectives ----------------------------------------------------------------------------
    def _output_and_layout(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """An all-reduce's output (x's shape, contiguous) and strided_layout of x (a 0-d x as one element)."""
        out = torch.empty(x.shape, dtype=x.dtype, device=self.device)
        return out, strided_layout(x.reshape(1) if x.dim() == 0 else x)

    def all_reduce(self, x: torch.Tensor, *, two_shot: bool = True,
                   ring: bool | None = None) -> torch.Tensor:
        """One launch: the one-round kernel if x fits a slot, else the pipelined kernel; `ring`:
        the neighbour-only ring instead (default: where the topology is "ring")."""
        if ring is None:
            ring = self.topology == "ring"
        if ring:
            return self.all_reduce_ring(x)
        numel = x.numel()
        if numel > self.capacity(x.dtype):
            return self.all_reduce_chunked(x)
        out, (src, layout, contig) = self._output_and_layout(x)
        if numel == 0:
            return out
        work = -(-numel // self.world_size) if two_shot else numel
        self._launch(kernels.allreduce_kernel, _programs(work), src, out, self.state,
                     self.counters, *self.addrs, 0, numel, self.slot_bytes, self.max_spin,
                     int(self.trap_on_timeout), *layout, TWO_SHOT=two_shot, CONTIG=contig)
        return out

    def all_reduce_chunked(self, x: torch.Tensor) -> torch.Tensor:
        """The pipelined all-reduce (any size; one launch of a fixed grid)."""
        out, (src, layout, contig) = self._output_and_layout(x)
        numel = x.numel()
        if numel == 0:
            return out
        self._launch_pipelined(pipe.AR2 if self.world_size > 2 else pipe.AR1, src, out, numel,
                               self.region_bytes // x.element_size(), layout, contig)
        return out

    def all_reduce_ring(self, x: torch.Tensor) -> torch.Tensor:
        """The neighbour-only ring all-reduce (any size; one launch of the pipelined grid)."""
        out, (src, layout, contig) = self._output_and_layout(x)
        numel = x.numel()
        if numel == 0:
            return out
        region = ring_kernels.ring_region_elems(self.region_bytes, x.element_size())
        self._launch(ring_kernels.ring_kernel, self.pipe_programs, src, out, self.state,
                     self.pipe_counters, self.ring_counters, *self.addrs, numel, region,
                     self.region_bytes, self.pipe_flags, self.pipe_data, self.ring_flags,
                     self.max_spin, int(self.trap_on_timeout), *layout, NSLOTS=pipe.PIPE_SLOTS,
                     CONTIG=contig)
        return out

    # -- fused all-reduce + residual add + RMSNorm ----------------------------------------------
    def fits_fused(self, x: torch.Tensor) -> bool:
        return (self.supports(x) and x.dim() >= 1 and 0 < x.shape[-1] <= FUSED_MAX_DIM
                and x.numel() <= self.capacity(x.dtype))

    def all_reduce_add_rmsnorm(self, partial: torch.Tensor, residual: torch.Tensor,
                               weight: torch.Tensor, eps: float
                               ) -> tuple[torch.Tensor, torch.Tensor]:
        """One launch: (normed, new_residual) of collectives/fused.py's definition."""
        if not self.fits_fused(partial):
            raise ValueError(f"fused all-reduce + RMSNorm needs a row of <= {FUSED_MAX_DIM} and "
                             f"a tensor that fits one slot; got {tuple(partial.shape)}")
        dim = partial.shape[-1]
        x, res, w = partial.contiguous(), residual.contiguous(), weight.contiguous()
        normed = torch.empty(x.shape, dtype=x.dtype, device=self.device)
        new_res = torch.empty(x.shape, dtype=x.dtype, device=self.device)
        rows = x.numel() // dim
        if rows:
            block_d = 1 << max(0, dim - 1).bit_length()
            kernel = pipe.allreduce_add_rmsnorm_kernel
            kernel[(max(1, min(kernels.MAX_PROGRAMS, rows)),)](
                x, res, w, normed, new_res, self.state, self.counters, *self.addrs, rows, dim,
                float(eps), self.slot_bytes, self.max_spin, int(self.trap_on_timeout),
                RANK=self.rank, WORLD=self.world_size, BLOCK_D=block_d, INTERP=self.interpret,
                num_warps=NUM_WARPS if block_d <= 4096 else 8)
        return normed, new_res

    # -- fused all-reduce + mHC expand ---------------------------------------------------------
    def fits_hc_expand(self, partial: torch.Tensor, streams: torch.Tensor,
                       post: torch.Tensor) -> bool:
        return (self.supports(partial) and post.dtype in SUPPORTED_DTYPES
                and 1 <= streams.shape[1] <= HC_MAX
                and 0 < partial.numel() <= self.capacity(partial.dtype))

    def all_reduce_hc_expand(self, partial: torch.Tensor, streams: torch.Tensor,
                             post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        """One launch: new streams [T, N, D] of collectives/fused.py's all-reduce + mHC expand
        (partial [T, D], streams [T, N, D], post [T, N], comb [T, N, N])."""
        if not self.fits_hc_expand(partial, streams, post):
            raise ValueError(f"fused all-reduce + mHC expand needs at most {HC_MAX} streams and "
                             f"a non-empty partial that fits one slot; got partial "
                             f"{tuple(partial.shape)}, streams {tuple(streams.shape)}")
        rows, dim = partial.shape
        hc = streams.shape[1]
        x, s, p, c = (t.contiguous() for t in (partial, streams, post, comb))
        out = torch.empty(s.shape, dtype=s.dtype, device=self.device)
        block_d = min(HC_BLOCK, 1 << max(0, dim - 1).bit_length())
        units = rows * -(-dim // block_d)
        pipe.allreduce_hc_expand_kernel[(min(kernels.MAX_PROGRAMS, units),)](
            x, s, p, c, out, self.state, self.counters, *self.addrs, rows, dim, self.slot_bytes,
            self.max_spin, int(self.trap_on_timeout), RANK=self.rank, WORLD=self.world_size,
            HC=hc, HC_P2=max(2, 1 << (hc - 1).bit_length()), BLOCK_D=block_d,
            INTERP=self.interpret, num_warps=NUM_WARPS)
        return out

    # -- fused MoE combine + reduce-scatter ---------------------------------------------------
    # the combine arithmetic the fused kernels reproduce: kernels/moe/route_triton.combine_sorted's
    MOE_COMBINE = "triton"

    def fits_moe_combine(self, x: torch.Tensor) -> bool:
        """Whether `reduce_scatter_moe_combine` serves a reduce-scatter of x [rows, D] (the padded
        combine): any non-empty size the reduce-scatter serves, in one round where a slot holds
        it, else pipelined."""
        return (self.supports(x) and x.dim() == 2 and x.numel() > 0
                and (self.fits("reduce_scatter", x) or self.rs_region(x.dtype) >= 64))

    def reduce_scatter_moe_combine(self, y: torch.Tensor, order: torch.Tensor,
                                   weights: torch.Tensor, shared: torch.Tensor | None, *,
                                   pipelined: bool | None = None) -> torch.Tensor:
        """One launch: reduce_scatter(pad_rows(combine_sorted(y, order, weights) + shared)), the
        combine computed into the workspace by combine_sorted's tile code (collectives/fused.py): the
        one-round kernel (workspace_triton.py) where the padded rows fit a slot, else (or if
        `pipelined`) the pipelined one (workspace_triton_pipe.py), bitwise the same result."""
        fused.check_moe_args(y, order, weights, shared)
        t, k = weights.shape
        d = y.shape[1]
        world = self.world_size
        per = -(-t // world)
        probe = y.new_empty(()).expand(per * world, d)  # the padded combine's size and dtype
        if not self.fits_moe_combine(probe):
            raise ValueError(f"reduce_scatter_moe_combine: y must be a non-empty [T*k, D] "
                             f"{SUPPORTED_DTYPES} tensor on {self.device}; got {tuple(y.shape)} "
                             f"{y.dtype} on {y.device}")
        one_slot = self.fits("reduce_scatter", probe)
        pipelined = not one_slot if pipelined is None else pipelined
        region = self.rs_region(y.dtype)
        if pipelined and region < 64:
            raise ValueError("reduce_scatter_moe_combine: pipelined=True, but the workspace is too "
                             "small for the pipelined reduce-scatter")
        if not pipelined and not one_slot:
            raise ValueError(f"reduce_scatter_moe_combine: pipelined=False, but {per * world} x "
                             f"{d} rows do not fit one slot")
        out = torch.empty((per, d), dtype=y.dtype, device=self.device)
        inv = fused.inverse_order(order).contiguous()
        y, w = y.contiguous(), weights.float().contiguous()
        sh = y if shared is None else shared.contiguous()  # unused pointer without shared
        block_d = combine_block_d(d)  # combine_sorted's tile: the same reduction order
        tile = dict(RANK=self.rank, WORLD=world, TOP_K=k, K_PAD=triton.next_power_of_2(k),
                    BLOCK_D=block_d, HAS_SHARED=shared is not None, INTERP=self.interpret,
                    num_warps=COMBINE_NUM_WARPS)
        if pipelined:
            pipe.pipelined_moe_combine_kernel[(self.pipe_programs,)](
                y, inv, w, sh, out, self.state, self.pipe_counters, *self.addrs, t, d, per,
                region, self.region_bytes, self.pipe_flags, self.pipe_data, self.max_spin,
                int(self.trap_on_timeout), NSLOTS=pipe.PIPE_SLOTS, BLOCK=BLOCK, **tile)
        else:
            units = per * -(-d // block_d)
            kernels.reducescatter_moe_combine_kernel[(min(kernels.MAX_PROGRAMS, units),)](
                y, inv, w, sh, out, self.state, self.counters, *self.addrs, t, d, per,
                self.slot_bytes, self.max_spin, int(self.trap_on_timeout), **tile)
        return out

    def rs_region(self, dtype: torch.dtype) -> int:
        """Elements of each slice in a program region of the pipelined reduce-scatter (a multiple
        of 64 for aligned loads; below 64 the workspace is too small to pipeline it)."""
        return self.region_bytes // dtype.itemsize // self.world_size // 64 * 64

    def _launch_pipelined(self, mode: Any, src: torch.Tensor, out: torch.Tensor, n: int,
                          region: int, layout: tuple[int, ...], contig: bool) -> None:
        self._launch(pipe.pipelined_kernel, self.pipe_programs, src, out, self.state,
                     self.pipe_counters, *self.addrs, n, region, self.region_bytes,
                     self.pipe_flags, self.pipe_data, self.max_spin, int(self.trap_on_timeout),
                     *layout, MODE=mode, NSLOTS=pipe.PIPE_SLOTS, CONTIG=contig)

    def all_gather(self, x: torch.Tensor, dim: int = 0, *,
                   pipelined: bool | None = None) -> torch.Tensor:
        """One launch: the one-round kernel if x fits a slot, else (or if `pipelined`) the
        pipelined kernel."""
        xp = x.movedim(dim, 0)
        out = torch.empty((self.world_size * xp.shape[0], *xp.shape[1:]), dtype=x.dtype,
                          device=self.device)
        numel = xp.numel()
        if numel:
            src, layout, contig = strided_layout(xp)
            if pipelined or (pipelined is None and numel > self.capacity(x.dtype)):
                self._launch_pipelined(pipe.AG, src, out, numel,
                                       self.region_bytes // x.element_size(), layout, contig)
            else:
                self._launch(kernels.allgather_kernel, _programs(numel), src, out, self.state,
                             self.counters, *self.addrs, 0, numel, numel, self.slot_bytes,
                             self.max_spin, int(self.trap_on_timeout), *layout,
                             CONTIG=contig)
        return out.movedim(0, dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0, *,
                       pipelined: bool | None = None) -> torch.Tensor:
        """One launch: the one-round kernel if x fits a slot, else (or if `pipelined`) the
        pipelined kernel."""
        world = self.world_size
        xp = x.movedim(dim, 0)
        if xp.shape[0] % world:
            raise ValueError(f"reduce_scatter: dim {dim} of size {xp.shape[0]} is not divisible "
                             f"by world size {world}")
        out = torch.empty((xp.shape[0] // world, *xp.shape[1:]), dtype=x.dtype,
                          device=self.device)
        per = out.numel()
        if per:
            src, layout, contig = strided_layout(xp)
            if pipelined or (pipelined is None and not self.fits("reduce_scatter", x)):
                region = self.rs_region(x.dtype)
                if region < 64:
                    raise ValueError("workspace too small for the pipelined reduce-scatter")
                self._launch_pipelined(pipe.RS, src, out, per,
                                       region, layout, contig)
            else:
                self._launch(kernels.reducescatter_kernel, _programs(per), src, out, self.state,
                             self.counters, *self.addrs, 0, per, per, self.slot_bytes,
                             self.max_spin, int(self.trap_on_timeout), *layout,
                             CONTIG=contig)
        return out.movedim(0, dim)

    def close(self) -> None:
        self._keepalive = None
