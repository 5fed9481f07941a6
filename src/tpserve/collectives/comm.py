"""Communicator: the one door every tensor-parallel collective goes through.

The model calls `all_reduce`, `all_gather`, `reduce_scatter` (and the fused ones:
`all_reduce_hc_expand`, the all-reduce with the mHC expand that follows it,
`all_reduce_add_rmsnorm`, with a residual add and RMSNorm, and `reduce_scatter_moe_combine`, the
reduce-scatter whose input is an MoE's combine) on a Communicator and never
torch.distributed directly, so faster backends plug in here: the workspace collectives (CPU:
shared memory, workspace.py; CUDA: peer memory, ipc.py / workspace_peer.py) and torch's
symmetric-memory ops. The backend is chosen per call by `backend_for` from the op, dtype, size,
device and world size and the size table (tuning.py) only, never from timing or rank-local
state, so every rank takes the same path. The table itself is checked to be identical on all
ranks at construction. A fused op runs fused where the workspace serves it, unless the table
says "unfused" for its size (`tpserve tune collectives` writes that where the separate ops won).

Construction is collective (all ranks of `group` at once). If the workspace cannot be built on
some rank, every rank logs a warning and uses the process group's collectives instead.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import torch
import torch.distributed as dist

from tpserve.collectives import fused
from tpserve.collectives import tuning
from tpserve.collectives.tuning import OPS, SYMM_BACKENDS, TORCH, WORKSPACE_BACKENDS
from tpserve.collectives.workspace_group import GroupOps

log = logging.getLogger("tpserve.collectives")
IDENTITY = "identity"
# bytes of workspace per rank, overriding config.allreduce_workspace_mb (tests, debugging)
WORKSPACE_BYTES_ENV = "TPSERVE_ALLREDUCE_WORKSPACE_BYTES"


class Communicator:
    """Collectives over one process group (world 1: every op is the identity)."""

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device, *,
                 config: Any = None, prepare_all: bool = False, timeout_s: float = 300.0,
                 workspace_bytes: int | None = None):
        """`config`: an EngineConfig (None: defaults). `prepare_all`: build every candidate path
        even where the table never picks it (bench and tuner). `timeout_s`: how long a CPU
        workspace barrier waits for a peer before raising. `workspace_bytes`: overrides
        config.allreduce_workspace_mb (tests use workspaces smaller than 1 MiB); where it is None,
        the environment variable TPSERVE_ALLREDUCE_WORKSPACE_BYTES does the same (a test and
        debugging knob: it reaches spawned TP workers, e.g. to force multi-round paths)."""
        if config is None:
            from tpserve.config import EngineConfig
            config = EngineConfig()
        self.config = config
        self.group = group
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.table: tuning.SizeTable | None = None
        if workspace_bytes is None and os.environ.get(WORKSPACE_BYTES_ENV):
            workspace_bytes = int(os.environ[WORKSPACE_BYTES_ENV])
        self.workspace_bytes = (int(workspace_bytes) if workspace_bytes is not None
                                else int(config.allreduce_workspace_mb) << 20)
        self.topology = str(getattr(config, "allreduce_topology", "mesh"))
        if self.topology not in ("mesh", "ring"):
            raise ValueError(f"allreduce_topology must be 'mesh' or 'ring', got "
                             f"{self.topology!r}")
        self._ws: Any = None      # CpuWorkspace or PeerWorkspace
        self._symm: Any = None    # SymmOps (CUDA only)
        if group is None:
            self.rank, self.world_size = 0, 1
            return
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        if self.world_size == 1:
            return
        self._ops = GroupOps(group, self.device)
        self.table = self._load_agreed_table()
        if not config.custom_allreduce:
            return
        wanted = self.table.uses_backends(self.world_size)
        if self.workspace_bytes > 0 and (prepare_all or wanted & set(WORKSPACE_BACKENDS)):
            self._ws = self._build("workspace", self._make_workspace, timeout_s)
        if self.device.type == "cuda" and (prepare_all or wanted & set(SYMM_BACKENDS)):
            self._symm = self._build("symmetric-memory ops", self._make_symm, timeout_s)

    # -- construction -------------------------------------------------------------------------
    def _load_agreed_table(self) -> tuning.SizeTable:
        table, error = None, ""
        try:
            table = tuning.load_table(self.config.collective_table, self.device.type,
                                      self.world_size, self.topology)
        except (OSError, ValueError) as exc:
            error = str(exc)
        digest = int(table.digest()[:15], 16) if table is not None else 0
        gathered = self._ops.all_gather_ints([digest])
        failed = [r for r, (d,) in enumerate(gathered) if d == 0]
        if failed:
            raise RuntimeError(f"collective size table could not be loaded on rank(s) {failed}"
                               + (f"; here: {error}" if error else ""))
        if len({d for (d,) in gathered}) != 1:
            digests = ", ".join(f"rank {r}: {d:015x}" for r, (d,) in enumerate(gathered))
            raise RuntimeError(
                f"collective size tables differ between ranks ({digests}); rank {self.rank} "
                f"loaded {table.source}. All ranks must use the same table: pass the same "
                f"--collective-table everywhere or tune once per machine.")
        return table

    def _build(self, what: str, make: Callable[[float], Any], timeout_s: float) -> Any:
        from tpserve.collectives.shm import WorkspaceUnavailable
        try:
            return make(timeout_s)
        except WorkspaceUnavailable as exc:  # raised on every rank alike (agreed inside)
            log.warning("custom collectives: %s unavailable on %s (%s); using %s instead",
                        what, self.device, exc, self._ops.backend)
            return None
        except Exception as exc:  # noqa: BLE001 - a bug: never take the engine down for it
            log.warning("custom collectives: building the %s failed unexpectedly on %s (%r); "
                        "using %s instead", what, self.device, exc, self._ops.backend)
            return None

    def _make_workspace(self, timeout_s: float) -> Any:
        nbytes = self.workspace_bytes
        if self.device.type == "cpu":
            from tpserve.collectives.workspace import CpuWorkspace
            return CpuWorkspace(self._ops, nbytes, timeout_s=timeout_s, topology=self.topology)
        from tpserve.collectives.ipc import create_peer_workspace
        return create_peer_workspace(self._ops, nbytes, self.device, topology=self.topology)

    def _make_symm(self, timeout_s: float) -> Any:
        from tpserve.collectives.ipc import create_symm_ops
        return create_symm_ops(self._ops, self.workspace_bytes, self.device)

    # -- choosing a path ----------------------------------------------------------------------
    def backend_for(self, op: str, x: torch.Tensor) -> str:
        """The path `op` on `x` takes: "identity", "torch", "oneshot", "twoshot", "chunked",
        "ring", "symm_oneshot" or "symm_twoshot". Same answer on every rank for the same
        shape/dtype."""
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; expected one of {OPS}")
        if self.world_size == 1:
            return IDENTITY
        nbytes = tuning.op_bytes(op, x.numel(), x.element_size(), self.world_size)
        want = self.table.lookup(op, x.dtype, nbytes, self.world_size)
        return self._resolve(op, want, x)

    def _resolve(self, op: str, want: str, x: torch.Tensor) -> str:
        if want in WORKSPACE_BACKENDS:
            ws = self._ws
            if ws is None or not ws.supports(x) or not self._on_device(x):
                return TORCH
            ring_only = getattr(ws, "topology", "mesh") == "ring"
            if op == "all_reduce" and (want == "ring" or ring_only):
                return "ring" if hasattr(ws, "ring_capacity") else TORCH
            if ring_only:  # all-gather / reduce-scatter read every peer: the process group's
                return TORCH
            if not ws.fits(op, x) or (op != "all_reduce" and want in ("twoshot", "ring")):
                return "chunked" if not ws.fits(op, x) else "oneshot"
            return want
        if want in SYMM_BACKENDS:
            if self._symm is None or op != "all_reduce" or not self._on_device(x):
                return TORCH
            return want if self._symm.supports(x) else TORCH
        return TORCH

    def _on_device(self, x: torch.Tensor) -> bool:
        return x.device == self.device or (x.device.type == "cpu" == self.device.type)

    def available_backends(self, op: str, x: torch.Tensor) -> list[str]:
        """Every backend that can serve `op` on `x` here (bench, tests); "torch" always."""
        names = [TORCH]
        for name in (*WORKSPACE_BACKENDS, *SYMM_BACKENDS):
            if self.world_size > 1 and self._resolve(op, name, x) == name:
                names.append(name)
        return names

    # -- the three collectives ----------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over ranks (`x` may be overwritten; use the returned tensor)."""
        return self.run("all_reduce", x, self.backend_for("all_reduce", x))

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Concatenation of every rank's `x` along `dim`, in rank order."""
        return self.run("all_gather", x, self.backend_for("all_gather", x), dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Rank r's slice r (of `world_size` equal slices along `dim`) of the sum over ranks."""
        return self.run("reduce_scatter", x, self.backend_for("reduce_scatter", x), dim)

    def run(self, op: str, x: torch.Tensor, backend: str, dim: int = 0) -> torch.Tensor:
        """`op` on `x` through `backend` (a name from `available_backends`); collective."""
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; expected one of {OPS}")
        if op == "reduce_scatter" and x.shape[dim] % self.world_size:
            raise ValueError(f"reduce_scatter: dim {dim} of size {x.shape[dim]} is not divisible "
                             f"by world size {self.world_size}")
        if self.world_size == 1 or backend == IDENTITY:
            return x
        if backend == TORCH:
            return _TORCH_PATHS[op](self, x, dim)
        if backend != self._resolve(op, backend, x):
            raise ValueError(f"backend {backend!r} cannot serve {op} on {tuple(x.shape)} "
                             f"{x.dtype} here; available: {self.available_backends(op, x)}")
        if backend in SYMM_BACKENDS:
            return self._symm.all_reduce(x, backend)
        if op == "all_reduce" and backend == "ring":
            return self._ws.all_reduce(x, ring=True)
        if op == "all_reduce" and backend == "chunked" and hasattr(self._ws, "all_reduce_chunked"):
            return self._ws.all_reduce_chunked(x)  # CUDA: the pipelined kernel
        if op == "all_reduce":
            return self._ws.all_reduce(x, two_shot=backend != "oneshot")
        # "chunked" all-gather / reduce-scatter on CUDA: the pipelined kernel even where x fits
        # one slot, as for the all-reduce above (else the bench and tuner would time the
        # one-round kernel under that name); the CPU workspace pipelines every call alike
        kw = ({"pipelined": True} if backend == "chunked"
              and hasattr(self._ws, "all_reduce_chunked") else {})
        if op == "all_gather":
            return self._ws.all_gather(x, dim, **kw)
        return self._ws.reduce_scatter(x, dim, **kw)

    # -- fused -------------------------------------------------------------------------------
    def fuses(self, op: str, x: torch.Tensor) -> bool:
        """Whether the size table lets the fused collective `op` fuse at x's size (default, and with no
        table: yes)."""
        return self.table is None or self.table.fuses(op, x.dtype, x.numel() * x.element_size(), self.world_size)

    def all_reduce_add_rmsnorm(self, partial: torch.Tensor, residual: torch.Tensor,
                               weight: torch.Tensor, eps: float
                               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed, new_residual): new_residual = residual + all_reduce(partial) and normed =
        RMSNorm(new_residual) as model/layers.RMSNorm computes it (fused.py). One kernel on
        CUDA where the workspace serves the all-reduce in one round (workspace_triton_pipe.py);
        else
        the all-reduce followed by the same add and norm. Collective."""
        fused.check_args(partial, residual, weight)
        backend = self.backend_for("all_reduce", partial)
        ws = self._ws
        if (backend in ("oneshot", "twoshot") and hasattr(ws, "all_reduce_add_rmsnorm")
                and ws.fits_fused(partial) and self.fuses("all_reduce_add_rmsnorm", partial)):
            return ws.all_reduce_add_rmsnorm(partial, residual, weight, eps)
        total = self.run("all_reduce", partial, backend)
        return fused.add_rmsnorm(total, residual, weight, eps)

    def all_reduce_hc_expand(self, partial: torch.Tensor, streams: torch.Tensor,
                             post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        """New mHC streams [T, N, D] = post (x) all_reduce(partial) + comb^T @ streams, as
        model/mhc.py's expand computes it (fused.py). One kernel on CUDA where the workspace
        serves the all-reduce in one round (workspace_triton_pipe.py); else the all-reduce
        followed by the same expand. Collective."""
        fused.check_hc_args(partial, streams, post, comb)
        backend = self.backend_for("all_reduce", partial)
        ws = self._ws
        if (backend in ("oneshot", "twoshot") and hasattr(ws, "all_reduce_hc_expand")
                and ws.fits_hc_expand(partial, streams, post) and self.fuses("all_reduce_hc_expand", partial)):
            return ws.all_reduce_hc_expand(partial, streams, post, comb)
        total = self.run("all_reduce", partial, backend)
        return fused.hc_expand(total, streams, post, comb)

    def reduce_scatter_moe_combine(self, y: torch.Tensor, order: torch.Tensor,
                                   weights: torch.Tensor, shared: torch.Tensor | None = None, *,
                                   combine: str = "torch") -> torch.Tensor:
        """Rank r's slice [ceil(T / world), D] of the sum over ranks of the MoE combine
        (collectives/fused.moe_combine: y [T*k, D] in expert order, order [T*k], weights [T, k], shared
        [T, D] or None), its rows padded with zeros to a multiple of the world: exactly
        reduce_scatter(pad_rows(fused.moe_combine(y, order, weights, shared, combine))).
        `combine`: the unfused combine's sum ("torch" or "triton": route_triton.combine_sorted).
        Wherever the table sends the padded [rows, D] reduce-scatter to the workspace ("oneshot"
        or "chunked"), the combine is its copy-in (no [T, D] tensor), at any size: on the CPU
        workspace for the "torch" combine, on the CUDA workspace for the "triton" one (one round
        where it fits a slot, else, or where the table says "chunked", pipelined, as `run` does);
        else (NCCL, the ring, the other combine) the two steps. Collective."""
        fused.check_moe_args(y, order, weights, shared)
        if combine not in fused.MOE_COMBINES:
            raise ValueError(f"reduce_scatter_moe_combine: combine must be one of "
                             f"{fused.MOE_COMBINES}, got {combine!r}")
        if self.world_size == 1:
            return fused.moe_combine(y, order, weights, shared, combine)
        t, d = weights.shape[0], y.shape[1]
        rows = -(-t // self.world_size) * self.world_size
        probe = y.new_empty(()).expand(rows, d)  # the padded input's size, dtype and device
        backend = self.backend_for("reduce_scatter", probe)
        ws = self._ws
        if (backend in ("oneshot", "chunked") and getattr(ws, "MOE_COMBINE", None) == combine
                and ws.fits_moe_combine(probe) and self.fuses("reduce_scatter_moe_combine", probe[:t])):
            kw = ({"pipelined": True} if backend == "chunked"
                  and hasattr(ws, "all_reduce_chunked") else {})  # CUDA: as `run` does
            return ws.reduce_scatter_moe_combine(y, order, weights, shared, **kw)
        combined = fused.pad_rows(fused.moe_combine(y, order, weights, shared, combine), self.world_size)
        return self.run("reduce_scatter", combined, backend)

    # -- the process group's own collectives --------------------------------------------------
    def _torch_all_reduce(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=self.group)
        return x

    def _torch_all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        x = x.movedim(dim, 0).contiguous()
        out = x.new_empty((self.world_size * x.shape[0], *x.shape[1:]))
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, x, group=self.group)
        return out.movedim(0, dim)

    def _torch_reduce_scatter(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        x = x.movedim(dim, 0).contiguous()
        out = x.new_empty((x.shape[0] // self.world_size, *x.shape[1:]))
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        scatter(out, x, group=self.group)
        return out.movedim(0, dim)

    def abort(self, reason: str = "aborted") -> None:
        """Make a collective that waits on a peer (now or later) raise instead of waiting; for a
        watchdog thread that saw a rank die. The CPU workspace also notices a dead peer by
        itself (pid check); NCCL and the CUDA workspace rely on their own timeouts."""
        ws = self._ws
        if ws is not None and hasattr(ws, "abort"):
            ws.abort(reason)

    def close(self) -> None:
        """Release backend resources (workspaces); safe to call twice."""
        ws, symm, self._ws, self._symm = self._ws, self._symm, None, None
        if ws is not None:
            ws.close()
        if symm is not None:
            symm.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_TORCH_PATHS = {"all_reduce": Communicator._torch_all_reduce,
                "all_gather": Communicator._torch_all_gather,
                "reduce_scatter": Communicator._torch_reduce_scatter}
