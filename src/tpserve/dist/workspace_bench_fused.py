"""The fused all-reduce + residual add + RMSNorm in `tpserve bench collectives` (rows of the
bench-only op "all_reduce_add_rmsnorm": "unfused" = the table's all-reduce then add + RMSNorm,
"fused" = the one-kernel CUDA path) and in its `--check` (new residual bitwise, normed within
fused.rmsnorm_bound; bitwise on the exact paths)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tpserve.dist.comm import Communicator
from tpserve.dist.tuning import TORCH
from tpserve.dist.workspace_bench import DTYPES, FUSED, _iters, _reference, _sync, median_us

FUSED_HIDDEN = 4096


def _fused_inputs(nbytes: int, dtype: torch.dtype, device: torch.device, seed: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """partial, residual, weight: rows of FUSED_HIDDEN (fewer if the size is smaller)."""
    numel = max(1, nbytes // dtype.itemsize)
    hidden = min(FUSED_HIDDEN, numel)
    g = torch.Generator().manual_seed(seed)
    shape = (max(1, numel // hidden), hidden)
    partial = torch.randn(shape, generator=g).to(dtype).to(device)
    residual = torch.randn(shape, generator=g).to(dtype).to(device)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(dtype).to(device)
    return partial, residual, weight


def _fused_paths(comm: Communicator, partial: torch.Tensor) -> dict[str, Any]:
    """{"unfused": all_reduce (table's pick) then add + RMSNorm, "fused": one kernel (CUDA)}."""
    from tpserve.dist import fused
    pick = comm.backend_for("all_reduce", partial)

    def unfused(p, r, w):
        return fused.add_rmsnorm(comm.run("all_reduce", p, pick), r, w, 1e-6)

    paths: dict[str, Any] = {"unfused": unfused}
    ws = comm._ws
    if ws is not None and hasattr(ws, "all_reduce_add_rmsnorm") and ws.fits_fused(partial):
        paths["fused"] = lambda p, r, w: ws.all_reduce_add_rmsnorm(p, r, w, 1e-6)
    return paths


def _time_fused(comm: Communicator, fn: Any, args: tuple, device: torch.device, graph: bool,
                scale: float) -> float:
    partial = args[0]
    warm, iters = _iters(partial.numel() * partial.element_size(), device, scale)
    return median_us(lambda: fn(*args), warm, iters, device, graph)


def fused_row(comm: Communicator, dt_name: str, size: int, device: torch.device, spec: dict,
               rank: int, world: int) -> dict:
    args = _fused_inputs(size, DTYPES[dt_name], device, seed=rank + 1)
    paths = _fused_paths(comm, args[0])
    us: dict[str, Any] = {}
    for name, fn in paths.items():
        try:
            us[name] = _time_fused(comm, fn, args, device, spec.get("graph", False),
                                   spec.get("iter_scale", 1.0))
        except Exception as exc:  # noqa: BLE001 - shown in the table, not fatal
            us[name] = f"error: {type(exc).__name__}: {exc}"[:200]
            _sync(device)
            dist.barrier()
    return {"op": FUSED, "dtype": dt_name, "world": world,
            "bytes": args[0].numel() * args[0].element_size(),
            "pick": "fused" if "fused" in paths else "unfused", "us": us}


def fused_check(comm: Communicator, dt_name: str, device: torch.device, cap: int) -> list[str]:
    """Every fused path against all-reduce (reference sum) + add + RMSNorm: the new residual
    bitwise, the normed output within fused.rmsnorm_bound."""
    from tpserve.dist import fused
    world, rank, dtype = comm.world_size, comm.rank, DTYPES[dt_name]
    problems = []
    for case, shape in enumerate([(3, 64), (5, 1000), (max(1, cap // 4096) + 1, 4096)]):
        gens = [torch.Generator().manual_seed(555 + 17 * case + r) for r in range(world)]
        parts = [torch.randn(shape, generator=g).to(dtype).to(device) for g in gens]
        res = torch.randn(shape, generator=torch.Generator().manual_seed(case)).to(dtype).to(device)
        w = (torch.rand(shape[-1], generator=torch.Generator().manual_seed(case)) + 0.5).to(dtype)
        w = w.to(device)
        want_n, want_r = fused.add_rmsnorm(_reference("all_reduce", parts, 0, rank), res, w, 1e-6)
        for name, fn in _fused_paths(comm, parts[rank]).items():
            try:
                normed, new_res = fn(parts[rank], res, w)
                _sync(device)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{FUSED} {dt_name} {shape} [{name}]: raised {exc!r}")
                continue
            exact = name == "unfused" and comm.backend_for("all_reduce", parts[rank]) not in (
                TORCH, "symm_oneshot", "symm_twoshot")
            if exact and not torch.equal(new_res, want_r):
                problems.append(f"{FUSED} {dt_name} {shape} [{name}]: residual mismatch")
            if name == "fused" and not torch.equal(new_res, want_r):
                problems.append(f"{FUSED} {dt_name} {shape} [{name}]: residual mismatch")
            bound = fused.rmsnorm_bound(want_r, w, 1e-6, want_n)
            if exact or name == "fused":
                err = (normed.float() - want_n.float()).abs()
                if not bool((err <= bound).all()):
                    problems.append(f"{FUSED} {dt_name} {shape} [{name}]: normed off by "
                                    f"{float(err.max()):.3g}")
    return problems
