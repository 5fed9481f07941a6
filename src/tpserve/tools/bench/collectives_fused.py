"""The fused all-reduce collectives in `tpserve bench collectives` (rows of the bench-only ops
"all_reduce_add_rmsnorm" and "all_reduce_hc_expand": "unfused" = the table's all-reduce then the
same torch ops, "fused" = the one-kernel CUDA path; "reduce_scatter_moe_combine": "unfused" = the
MoE combine, padding and the table's reduce-scatter, "fused" = the workspace's reduce-scatter whose
copy-in is the combine, CPU or CUDA; its size is the combined [T, D] tensor's, the experts' rows
TOP_K times that) and in its `--check`: add + RMSNorm: new residual bitwise, normed within
fused.rmsnorm_bound; mHC expand: `total` bitwise (post 1, comb 0), new streams within
fused.hc_expand_bound; bitwise on the exact unfused paths; MoE combine + reduce-scatter: bitwise
against the rank-order sum of every rank's padded combine (fused, and unfused through a workspace
backend; within the process group's rounding bound through NCCL / gloo)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tpserve.collectives.comm import Communicator
from tpserve.collectives.tuning import TORCH
from tpserve.tools.bench.collectives_common import (DTYPES, FUSED, HC_EXPAND, MOE_COMBINE, compare, median_us, reference, schedule,
                                       sync)

FUSED_HIDDEN = 4096
HC_MULT = 4  # GLM-5.3-Flash's mHC streams per token
TOP_K = 8  # GLM-5.3-Flash's experts per token


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


def _hc_inputs(shape: tuple[int, int], dtype: torch.dtype, device: torch.device,
               g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """streams [T, HC_MULT, D] in `dtype`, post [T, HC_MULT] and comb [T, HC_MULT, HC_MULT] in
    float32 (as HyperConnection gives them)."""
    t, d = shape
    streams = torch.randn((t, HC_MULT, d), generator=g).to(dtype).to(device)
    post = (torch.rand((t, HC_MULT), generator=g) * 2).to(device)
    comb = torch.rand((t, HC_MULT, HC_MULT), generator=g).to(device)
    return streams, post, comb


def _inputs(op: str, nbytes: int, dtype: torch.dtype, device: torch.device, seed: int
            ) -> tuple[torch.Tensor, ...]:
    """The fused op's arguments; the partial (first) of `nbytes` in rows of FUSED_HIDDEN."""
    partial, residual, weight = _fused_inputs(nbytes, dtype, device, seed)
    if op == FUSED:
        return partial, residual, weight
    if op == MOE_COMBINE:
        return (*_moe_inputs(tuple(partial.shape), dtype, device, seed + 2000)[:3], residual)
    return (partial, *_hc_inputs(tuple(partial.shape), dtype, device,
                                 torch.Generator().manual_seed(seed + 1000)))


def _moe_inputs(shape: tuple[int, int], dtype: torch.dtype, device: torch.device, seed: int
                ) -> tuple[torch.Tensor, ...]:
    """y [T * TOP_K, D] in expert order, order [T * TOP_K], weights [T, TOP_K] (float32), shared [T, D]."""
    t, d = shape
    g = torch.Generator().manual_seed(seed)
    y = torch.randn((t * TOP_K, d), generator=g).to(dtype).to(device)
    order = torch.argsort(torch.randint(0, 288, (t * TOP_K,), generator=g), stable=True).to(device)
    weights = torch.rand((t, TOP_K), generator=g).to(device)
    shared = torch.randn((t, d), generator=g).to(dtype).to(device)
    return y, order, weights, shared


def _fused_paths(comm: Communicator, op: str, args: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """{"unfused": all_reduce (table's pick) then the torch ops, "fused": one kernel (CUDA)}."""
    from tpserve.collectives import fused
    partial = args[0]
    pick = comm.backend_for("all_reduce", partial)
    ws = comm._ws
    if op == MOE_COMBINE:
        return _moe_combine_paths(comm, args)
    if op == FUSED:
        paths: dict[str, Any] = {"unfused": lambda p, r, w: fused.add_rmsnorm(
            comm.run("all_reduce", p, pick), r, w, 1e-6)}
        if ws is not None and hasattr(ws, "all_reduce_add_rmsnorm") and ws.fits_fused(partial):
            paths["fused"] = lambda p, r, w: ws.all_reduce_add_rmsnorm(p, r, w, 1e-6)
        return paths
    paths = {"unfused": lambda p, s, po, c: fused.hc_expand(comm.run("all_reduce", p, pick), s,
                                                              po, c)}
    if (ws is not None and hasattr(ws, "all_reduce_hc_expand")
            and ws.fits_hc_expand(partial, args[1], args[2])):
        paths["fused"] = ws.all_reduce_hc_expand
    return paths


def _padded_combine(comm: Communicator, y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """A stand-in (no storage) of the padded [ceil(T / world) * world, D] combine the reduce-scatter takes."""
    rows = -(-weights.shape[0] // comm.world_size) * comm.world_size
    return y.new_empty(()).expand(rows, y.shape[1])


def _moe_combine_paths(comm: Communicator, args: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """{"unfused": combine, pad, the table's reduce-scatter; "fused": the workspace's one where it
    serves this size}, both with the combine arithmetic of the workspace here (fused.py)."""
    from tpserve.collectives import fused
    y, _, weights, _ = args
    padded = _padded_combine(comm, y, weights)
    pick = comm.backend_for("reduce_scatter", padded)
    ws = comm._ws
    combine = getattr(ws, "MOE_COMBINE", "triton" if y.is_cuda else "torch")

    def unfused(y, order, weights, shared):
        combined = fused.moe_combine(y, order, weights, shared, combine)
        return comm.run("reduce_scatter", fused.pad_rows(combined, comm.world_size), pick)

    paths: dict[str, Any] = {"unfused": unfused}
    if ws is not None and hasattr(ws, "reduce_scatter_moe_combine") and ws.fits_moe_combine(padded):
        paths["fused"] = ws.reduce_scatter_moe_combine
    return paths


def _time_fused(comm: Communicator, fn: Any, args: tuple, device: torch.device, graph: bool,
                scale: float) -> float:
    partial = args[0]
    warm, iters = schedule(partial.numel() * partial.element_size(), device, scale)
    return median_us(lambda: fn(*args), warm, iters, device, graph)


def fused_row(comm: Communicator, op: str, dt_name: str, size: int, device: torch.device,
              spec: dict, rank: int, world: int) -> dict:
    args = _inputs(op, size, DTYPES[dt_name], device, seed=rank + 1)
    paths = _fused_paths(comm, op, args)
    us: dict[str, Any] = {}
    for name, fn in paths.items():
        try:
            us[name] = _time_fused(comm, fn, args, device, spec.get("graph", False),
                                   spec.get("iter_scale", 1.0))
        except Exception as exc:  # noqa: BLE001 - shown in the table, not fatal
            us[name] = f"error: {type(exc).__name__}: {exc}"[:200]
            sync(device)
            dist.barrier()
    sized = args[0][: args[0].shape[0] // TOP_K] if op == MOE_COMBINE else args[0]  # the combined [T, D] rows
    return {"op": op, "dtype": dt_name, "world": world, "bytes": sized.numel() * sized.element_size(),
            "pick": "fused" if "fused" in paths and comm.fuses(op, sized) else "unfused", "us": us}


def _check_shapes(cap: int) -> list[tuple[int, int]]:
    return [(3, 64), (5, 1000), (max(1, cap // 4096) + 1, 4096)]


def _exact_unfused(comm: Communicator, name: str, partial: torch.Tensor) -> bool:
    """The unfused path sums in rank order (a workspace backend): bitwise like the reference."""
    return name == "unfused" and comm.backend_for("all_reduce", partial) not in (
        TORCH, "symm_oneshot", "symm_twoshot")


def fused_check(comm: Communicator, dt_name: str, device: torch.device, cap: int) -> list[str]:
    """Every all_reduce_add_rmsnorm path against all-reduce (reference sum) + add + RMSNorm: the
    new residual bitwise, the normed output within fused.rmsnorm_bound."""
    from tpserve.collectives import fused
    world, rank, dtype = comm.world_size, comm.rank, DTYPES[dt_name]
    problems = []
    for case, shape in enumerate(_check_shapes(cap)):
        gens = [torch.Generator().manual_seed(555 + 17 * case + r) for r in range(world)]
        parts = [torch.randn(shape, generator=g).to(dtype).to(device) for g in gens]
        res = torch.randn(shape, generator=torch.Generator().manual_seed(case)).to(dtype).to(device)
        w = (torch.rand(shape[-1], generator=torch.Generator().manual_seed(case)) + 0.5).to(dtype)
        w = w.to(device)
        want_n, want_r = fused.add_rmsnorm(reference("all_reduce", parts, 0, rank), res, w, 1e-6)
        for name, fn in _fused_paths(comm, FUSED, (parts[rank], res, w)).items():
            try:
                normed, new_res = fn(parts[rank], res, w)
                sync(device)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{FUSED} {dt_name} {shape} [{name}]: raised {exc!r}")
                continue
            exact = _exact_unfused(comm, name, parts[rank])
            if (exact or name == "fused") and not torch.equal(new_res, want_r):
                problems.append(f"{FUSED} {dt_name} {shape} [{name}]: residual mismatch")
            bound = fused.rmsnorm_bound(want_r, w, 1e-6, want_n)
            if exact or name == "fused":
                err = (normed.float() - want_n.float()).abs()
                if not bool((err <= bound).all()):
                    problems.append(f"{FUSED} {dt_name} {shape} [{name}]: normed off by "
                                    f"{float(err.max()):.3g}")
    return problems


def hc_expand_check(comm: Communicator, dt_name: str, device: torch.device,
                    cap: int) -> list[str]:
    """Every all_reduce_hc_expand path against all-reduce (reference sum) + fused.hc_expand:
    with post 1 and comb 0 the all-reduced total itself, bitwise; with random post / comb the
    new streams bitwise on the exact unfused paths, within fused.hc_expand_bound when fused."""
    from tpserve.collectives import fused
    world, rank, dtype = comm.world_size, comm.rank, DTYPES[dt_name]
    problems = []
    for case, shape in enumerate(_check_shapes(cap)):
        gens = [torch.Generator().manual_seed(777 + 17 * case + r) for r in range(world)]
        parts = [torch.randn(shape, generator=g).to(dtype).to(device) for g in gens]
        streams, post, comb = _hc_inputs(shape, dtype, device,
                                         torch.Generator().manual_seed(case))
        total = reference("all_reduce", parts, 0, rank)
        want = fused.hc_expand(total, streams, post, comb)
        bound = fused.hc_expand_bound(total, streams, post, comb)
        label = f"{HC_EXPAND} {dt_name} {shape}"
        for name, fn in _fused_paths(comm, HC_EXPAND, (parts[rank], streams, post)).items():
            try:
                plain = fn(parts[rank], streams, torch.ones_like(post), torch.zeros_like(comb))
                new = fn(parts[rank], streams, post, comb)
                sync(device)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{label} [{name}]: raised {exc!r}")
                continue
            exact = _exact_unfused(comm, name, parts[rank])
            if not (exact or name == "fused"):
                continue
            if not torch.equal(plain, total.unsqueeze(1).expand_as(streams)):
                problems.append(f"{label} [{name}]: total mismatch")
            err = (new.double() - want.double()).abs()
            if (exact and not torch.equal(new, want)) or not bool((err <= bound).all()):
                problems.append(f"{label} [{name}]: new streams off by {float(err.max()):.3g}")
    return problems


def moe_combine_check(comm: Communicator, dt_name: str, device: torch.device, cap: int) -> list[str]:
    """Every reduce_scatter_moe_combine path (fused where the workspace serves it; combine, pad and the table's
    reduce-scatter) against the rank-order float32 sum of every rank's padded combine, rounded once: this rank's
    slice, bitwise (within compare's bound where the reduce-scatter is the process group's)."""
    from tpserve.collectives import fused
    world, rank, dtype = comm.world_size, comm.rank, DTYPES[dt_name]
    combine = getattr(comm._ws, "MOE_COMBINE", "triton" if device.type == "cuda" else "torch")
    problems = []
    for case, shape in enumerate(_check_shapes(cap)):
        args = [_moe_inputs(shape, dtype, device, 999 + 17 * case + r) for r in range(world)]
        combined = [fused.pad_rows(fused.moe_combine(*a, combine), world).float() for a in args]
        acc = combined[0]
        for c in combined[1:]:
            acc = acc + c
        want = acc.to(dtype).chunk(world)[rank]
        paths = _moe_combine_paths(comm, args[rank])
        pick = comm.backend_for("reduce_scatter", _padded_combine(comm, args[rank][0], args[rank][2]))
        for name, fn in paths.items():
            try:
                got = fn(*args[rank])
                sync(device)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{MOE_COMBINE} {dt_name} {shape} [{name}]: raised {exc!r}")
                continue
            problem = compare(got, want, "fused" if name == "fused" else pick, dt_name, world)
            if problem:
                problems.append(f"{MOE_COMBINE} {dt_name} {shape} [{name}]: {problem}")
    return problems
