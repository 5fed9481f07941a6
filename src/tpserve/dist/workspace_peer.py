"""PeerWorkspace: the host side of the CUDA workspace collectives (kernels: workspace_triton.py).

It holds every rank's buffer address, the rank-local epoch counters and the call state, and
cuts a call into rounds that fit one data slot: a tensor larger than a slot goes through in
chunks of the flattened (row-major) index range, one kernel launch per chunk, with no memory
beyond the workspace and the output. Inputs of any strides are read in place by the kernels
(up to 4 dims after merging; more falls back to one contiguous copy). Launches only: no host
synchronisation, no allocation other than the output, so calls can be captured in CUDA graphs
(compile each variant once, eagerly, before capturing).

The buffers are supplied by the caller: torch symmetric memory on CUDA (ipc.py), or any memory
the current process can address (the tests use POSIX shared memory with Triton's interpreter).
"""

from __future__ import annotations

from typing import Any

import torch

from tpserve.dist import workspace_triton as kernels

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BLOCK = 1024
NUM_WARPS = 4
DEFAULT_MAX_SPIN = 1 << 30  # polls (~10+ minutes, like NCCL's timeout) before a wait gives up
_CHUNK_ALIGN = 256          # chunk starts stay aligned for vector loads


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


def _programs(work: int) -> int:
    return max(1, min(kernels.MAX_PROGRAMS, -(-work // BLOCK)))


class PeerWorkspace:
    """Collectives through peer-mapped buffers; every method is collective over the group."""

    def __init__(self, rank: int, world_size: int, buffer_ptrs: list[int], buffer_bytes: int,
                 device: torch.device, *, interpret: bool = False, keepalive: Any = None,
                 max_spin: int = DEFAULT_MAX_SPIN, trap_on_timeout: bool = True):
        if not 2 <= world_size <= kernels.MAX_WORLD:
            raise ValueError(f"PeerWorkspace supports 2..{kernels.MAX_WORLD} ranks, got "
                             f"{world_size}")
        if len(buffer_ptrs) != world_size:
            raise ValueError(f"need {world_size} buffer addresses, got {len(buffer_ptrs)}")
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.slot_bytes = (buffer_bytes - kernels.DATA_OFFSET) // 2 // 256 * 256
        if self.slot_bytes < 256 * world_size:
            raise ValueError(f"a {buffer_bytes}-byte buffer is too small for a workspace")
        self.capacity_bytes = self.slot_bytes
        self.addrs = [int(p) for p in buffer_ptrs] + [0] * (kernels.MAX_WORLD - world_size)
        self.interpret = interpret
        self.max_spin = int(max_spin)
        self.trap_on_timeout = bool(trap_on_timeout)  # else: set the error flag and go on
        # state: [call counter (slot parity), finished-program ticket, error flag, spare]
        self.state = torch.zeros(4, dtype=torch.int64, device=self.device)
        self.counters = torch.zeros(kernels.MAX_PROGRAMS, dtype=torch.int64, device=self.device)
        self._keepalive = keepalive

    # -- what it can do -----------------------------------------------------------------------
    def capacity(self, dtype: torch.dtype) -> int:
        return self.slot_bytes // dtype.itemsize

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

    @staticmethod
    def _chunk(numel: int, cap: int) -> int:
        """Elements per round: all if they fit, else the most an aligned round can carry."""
        if numel <= cap:
            return numel
        align = _CHUNK_ALIGN if cap >= _CHUNK_ALIGN else 64
        if cap < align:
            raise ValueError(f"workspace too small: one round carries only {cap} elements")
        return cap // align * align

    # -- collectives ----------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, *, two_shot: bool) -> torch.Tensor:
        out = torch.empty(x.shape, dtype=x.dtype, device=self.device)
        numel = x.numel()
        if numel == 0:
            return out
        src, layout, contig = strided_layout(x.reshape(1) if x.dim() == 0 else x)
        chunk = self._chunk(numel, self.capacity(x.dtype))
        for base in range(0, numel, chunk):
            n = min(chunk, numel - base)
            work = -(-n // self.world_size) if two_shot else n
            self._launch(kernels.allreduce_kernel, _programs(work), src, out, self.state,
                         self.counters, *self.addrs, base, n, self.slot_bytes, self.max_spin,
                         int(self.trap_on_timeout), *layout, TWO_SHOT=two_shot, CONTIG=contig)
        return out

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        xp = x.movedim(dim, 0)
        out = torch.empty((self.world_size * xp.shape[0], *xp.shape[1:]), dtype=x.dtype,
                          device=self.device)
        numel = xp.numel()
        if numel:
            src, layout, contig = strided_layout(xp)
            chunk = self._chunk(numel, self.capacity(x.dtype))
            for base in range(0, numel, chunk):
                n = min(chunk, numel - base)
                self._launch(kernels.allgather_kernel, _programs(n), src, out, self.state,
                             self.counters, *self.addrs, base, n, numel, self.slot_bytes,
                             self.max_spin, int(self.trap_on_timeout), *layout,
                             CONTIG=contig)
        return out.movedim(0, dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
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
            cap = self.capacity(x.dtype) // world // 64 * 64  # per-slice room, 64-aligned
            chunk = per if -(-per // 64) * 64 <= cap else self._chunk(per, cap)
            for base in range(0, per, chunk):
                n = min(chunk, per - base)
                self._launch(kernels.reducescatter_kernel, _programs(n), src, out, self.state,
                             self.counters, *self.addrs, base, n, per, self.slot_bytes,
                             self.max_spin, int(self.trap_on_timeout), *layout,
                             CONTIG=contig)
        return out.movedim(0, dim)

    def close(self) -> None:
        self._keepalive = None
