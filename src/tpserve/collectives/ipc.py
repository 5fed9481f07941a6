"""CUDA workspace memory over peer-mapped GPU buffers (torch symmetric memory).

`create_peer_workspace` allocates one buffer per rank with `torch.distributed._symmetric_memory`
(`empty` + `rendezvous`, which maps every peer's buffer into this process and hands back their
addresses), zeroes the flags and wraps it in a PeerWorkspace (workspace_peer.py) whose Triton
kernels do the collectives. It then runs a small self-test on every path (one-shot, two-shot,
all-gather, reduce-scatter, against the exact expected sums) so a kernel that does not compile or
misbehaves on this machine is found at start-up (the pipelined and fused kernels too, the fused
MoE combine + reduce-scatter in one round and pipelined): every failure is agreed across ranks and
raised as WorkspaceUnavailable, and the Communicator falls back to NCCL with a warning. The
neighbour-only ring all-reduce (workspace_triton_ring.py) is self-tested too; with
`topology="ring"` it is the workspace's all-reduce, and the self-test runs only it (reading no
buffer but the neighbours'). Every peer's buffer is still mapped then (the symmetric-memory
rendezvous maps them all): mapping only the neighbours, for boxes where not every pair of GPUs
can map each other's memory, is not done here.

NVLink multicast is never used: TORCH_SYMM_MEM_DISABLE_MULTICAST=1 is set before the first
allocation, and neither our kernels nor the torch ops we call (one_shot_all_reduce,
two_shot_all_reduce_) touch the multicast address.

`create_symm_ops` wraps torch's own symmetric-memory one-shot/two-shot all-reduce (candidates in
the bench and the tuner, and usable from a table as "symm_oneshot"/"symm_twoshot").
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import torch

from tpserve.collectives.shm import WorkspaceUnavailable
from tpserve.collectives.workspace_group import GroupOps

SELF_TEST_MAX_SPIN = 1 << 24  # polls (~10 s): a peer that never arrives fails the self-test


def _symm_mem() -> Any:
    # multicast off before any symmetric allocation, whichever backend torch picks
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
    import torch.distributed._symmetric_memory as symm_mem
    try:  # plain peer-mapped CUDA memory; keep whatever was chosen before us
        if getattr(symm_mem, "get_backend", lambda d: None)("cuda") is None:
            symm_mem.set_backend("CUDA")
    except Exception:  # noqa: BLE001 - older torch: its default is the CUDA backend
        pass
    return symm_mem


def agreed(ops: GroupOps, what: str, step: Callable[[], Any]) -> Any:
    """step() on every rank; its value if it worked on every rank, else WorkspaceUnavailable on
    every rank (no rank goes on alone into collectives the others skip)."""
    value, reason = None, ""
    try:
        value = step()
    except Exception as exc:  # noqa: BLE001 - agreed on below
        reason = f"rank {ops.rank}: {what}: {type(exc).__name__}: {exc}"
    if not ops.agree(not reason):
        raise WorkspaceUnavailable(reason or f"{what} failed on another rank")
    return value


def _allocate(ops: GroupOps, nbytes: int, device: torch.device) -> tuple[torch.Tensor, Any]:
    """A zeroed symmetric buffer of `nbytes` and its rendezvous handle (agreed across ranks)."""

    def allocate() -> torch.Tensor:
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available")
        buf = _symm_mem().empty(nbytes, dtype=torch.uint8, device=device)
        buf.zero_()
        torch.cuda.synchronize(device)
        return buf

    def rendezvous() -> Any:
        symm_mem = _symm_mem()
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed by older torch, a deprecated no-op in newer
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                enable(ops.group.group_name)
        handle = symm_mem.rendezvous(buf, ops.group.group_name)
        if len(handle.buffer_ptrs) != ops.world_size:
            raise RuntimeError(f"rendezvous gave {len(handle.buffer_ptrs)} peer buffers")
        return handle

    buf = agreed(ops, f"allocating {nbytes} bytes of symmetric memory", allocate)
    return buf, agreed(ops, "symmetric-memory rendezvous", rendezvous)


def _self_test(ws: Any, ops: GroupOps, device: torch.device) -> str:
    """'' if every path gives the exact expected result on this rank, else what went wrong.
    Every kernel is launched whatever an earlier one returned, so all ranks launch the same."""
    world, rank = ops.world_size, ops.rank
    want = float(world * (world + 1) // 2)
    if getattr(ws, "topology", "mesh") == "ring":  # the Communicator sends it nothing but the ring
        return _ring_self_test(ws, rank, want, device)
    try:
        x = torch.full((3 * 1024 + 5,), float(rank + 1), dtype=torch.bfloat16, device=device)
        results = {"one-shot all_reduce": ws.all_reduce(x, two_shot=False, ring=False),
                   "two-shot all_reduce": ws.all_reduce(x, two_shot=True, ring=False),
                   "all_gather": ws.all_gather(x[: 2 * world], 0),
                   "reduce_scatter": ws.reduce_scatter(x[: 4 * world], 0),
                   "pipelined all_reduce": ws.all_reduce_chunked(x),
                   "ring all_reduce": ws.all_reduce_ring(x)}
        w = torch.ones(x.shape[-1], dtype=x.dtype, device=device)
        normed, new_res = ws.all_reduce_add_rmsnorm(x.view(1, -1), torch.zeros_like(x).view(1, -1),
                                                    w, 1e-6)
        results["fused all_reduce + add"] = new_res
        streams = torch.zeros((1, 2, x.shape[-1]), dtype=x.dtype, device=device)
        ones = torch.ones((1, 2), dtype=torch.float32, device=device)
        results["fused all_reduce + mHC expand"] = ws.all_reduce_hc_expand(
            x.view(1, -1), streams, ones, torch.zeros((1, 2, 2), device=device))
        # MoE combine + reduce-scatter: every choice's output rank + 1, weights 1/2 + 1/2 and
        # shared experts' output 0: combined rows are rank + 1 exactly; T = 2*world - 1 tokens, so
        # the last rank's last row is padding (0)
        tokens, d = 2 * world - 1, 40
        moe = (x[: 2 * tokens * d].view(2 * tokens, d), torch.arange(2 * tokens, device=device),
               torch.full((tokens, 2), 0.5, device=device),
               torch.zeros((tokens, d), dtype=x.dtype, device=device))
        padding = torch.arange(2 * rank, 2 * rank + 2, device=device) >= tokens
        variants = [("one-round", False)]
        if ws.rs_region(x.dtype) >= 64:  # else the workspace is too small to pipeline it
            variants.append(("pipelined", True))
        for name, pipelined in variants:
            got = ws.reduce_scatter_moe_combine(*moe, pipelined=pipelined)
            results[f"{name} fused MoE combine + reduce_scatter"] = torch.where(
                padding[:, None], got + want, got)  # a padding row's 0 reads as `want`
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        gathered = torch.arange(1, world + 1, device=device).repeat_interleave(2 * world)
        problems = [name for name, y in results.items()
                    if not (torch.equal(y.float(), gathered.float()) if name == "all_gather"
                            else bool((y == want).all()))]
        if ws.error_flag():
            problems.append("a barrier timed out (a peer never signalled)")
        if not bool((normed == 1).all()):  # a constant row normalises to 1 exactly
            problems.append("fused all_reduce + RMSNorm")
        return "; ".join(f"{p} gave wrong results" if "barrier" not in p else p for p in problems)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


def _ring_self_test(ws: Any, rank: int, want: float, device: torch.device) -> str:
    """The ring workspace's self-test: only the neighbour-only all-reduce (one round and several), so that
    the test itself reads no buffer but the neighbours' (the mesh kernels read every peer)."""
    try:
        small = torch.full((3 * 1024 + 5,), float(rank + 1), dtype=torch.bfloat16, device=device)
        large = torch.full((ws.ring_capacity(torch.bfloat16) * 2 + 7,), float(rank + 1), dtype=torch.bfloat16,
                           device=device)
        results = {"ring all_reduce": ws.all_reduce_ring(small), "ring all_reduce, several rounds":
                   ws.all_reduce_ring(large)}
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        problems = [f"{name} gave wrong results" for name, y in results.items() if not bool((y == want).all())]
        if ws.error_flag():
            problems.append("a barrier timed out (a peer never signalled)")
        return "; ".join(problems)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


def create_peer_workspace(ops: GroupOps, nbytes: int, device: torch.device, *,
                          topology: str = "mesh") -> Any:
    """A self-tested PeerWorkspace over symmetric memory, or WorkspaceUnavailable (agreed).
    `topology`: "ring" makes its all-reduce the neighbour-only ring (workspace_peer.py)."""

    def load_kernels() -> Any:
        from tpserve.collectives import workspace_peer  # imports triton and the kernels
        if ops.world_size > workspace_peer.kernels.MAX_WORLD:
            raise ValueError(f"supports up to {workspace_peer.kernels.MAX_WORLD} ranks")
        return workspace_peer

    peer = agreed(ops, "loading the Triton kernels", load_kernels)
    nbytes = max(nbytes, peer.kernels.DATA_OFFSET + 2 * 256 * ops.world_size)
    total = peer.buffer_bytes_for(nbytes)  # one-round area + pipeline area
    buf, handle = _allocate(ops, total, device)
    ws = agreed(ops, "building the workspace", lambda: peer.PeerWorkspace(
        ops.rank, ops.world_size, list(handle.buffer_ptrs), total, device,
        keepalive=(buf, handle), max_spin=SELF_TEST_MAX_SPIN, trap_on_timeout=False,
        topology=topology))
    problem = _self_test(ws, ops, device)
    if not ops.agree(not problem):
        ws.close()
        raise WorkspaceUnavailable(f"self-test failed: {problem or 'on another rank'}")
    ws.max_spin, ws.trap_on_timeout = peer.DEFAULT_MAX_SPIN, True
    return ws


class SymmOps:
    """torch's symmetric-memory all-reduce ops over one staging buffer (CUDA, bf16/fp32)."""

    DTYPES = (torch.bfloat16, torch.float32)

    def __init__(self, buf: torch.Tensor, handle: Any, group_name: str):
        self.buf, self.handle, self.group_name = buf, handle, group_name
        self.device = buf.device
        ops = torch.ops.symm_mem
        self._one_shot_copy = getattr(ops, "one_shot_all_reduce_copy", None)
        self._two_shot_out = getattr(ops, "two_shot_all_reduce_out", None)

    def supports(self, x: torch.Tensor) -> bool:
        nbytes = x.numel() * x.element_size()
        return (x.dtype in self.DTYPES and x.device == self.device and 0 < nbytes
                and nbytes <= self.buf.numel() and nbytes % 16 == 0)

    def all_reduce(self, x: torch.Tensor, backend: str) -> torch.Tensor:
        n = x.numel()
        stage = self.buf[: n * x.element_size()].view(x.dtype)
        if backend == "symm_oneshot":
            if self._one_shot_copy is not None:
                out = self._one_shot_copy(stage, x.reshape(-1), "sum", self.group_name)
            else:
                stage.copy_(x.reshape(-1))
                out = torch.ops.symm_mem.one_shot_all_reduce(stage, "sum", self.group_name)
            return out.view(x.shape)
        stage.copy_(x.reshape(-1))
        if self._two_shot_out is not None:
            out = torch.empty(n, dtype=x.dtype, device=self.device)
            self._two_shot_out(stage, "sum", self.group_name, out)
            return out.view(x.shape)
        torch.ops.symm_mem.two_shot_all_reduce_(stage, "sum", self.group_name)
        return stage.clone().view(x.shape)

    def close(self) -> None:
        self.buf = self.handle = None


def create_symm_ops(ops: GroupOps, nbytes: int, device: torch.device) -> SymmOps:
    """SymmOps over a fresh symmetric buffer, or WorkspaceUnavailable (agreed)."""
    buf, handle = _allocate(ops, nbytes, device)
    problem = ""
    try:
        symm = SymmOps(buf, handle, ops.group.group_name)
        x = torch.full((4096,), float(ops.rank + 1), dtype=torch.bfloat16, device=device)
        want = float(ops.world_size * (ops.world_size + 1) // 2)
        for backend in ("symm_oneshot", "symm_twoshot"):
            if not bool((symm.all_reduce(x, backend) == want).all()):
                problem = f"{backend} gave a wrong sum"
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001
        problem = f"{type(exc).__name__}: {exc}"
    if not ops.agree(not problem):
        raise WorkspaceUnavailable(f"torch symmetric-memory ops: {problem or 'failed on a peer'}")
    return symm
