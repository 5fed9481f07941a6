"""Rank-side work of `tpserve bench collectives` and `tpserve tune collectives`.

`timing_worker` times every available backend of every (op, dtype, size) side by side;
`check_worker` runs every path on contiguous and strided inputs, odd sizes and tensors larger
than the workspace, in bf16/fp16/fp32, against a plain sum computed locally (every rank builds
every rank's input from a seed, so no collective is trusted to build the reference). Workspace
paths must match the reference bitwise (they sum in rank order with float32 accumulation, like
the reference); torch/NCCL/gloo and torch symm-mem paths within a rounding tolerance. Results
of all_reduce/all_gather must also be bitwise identical on every rank.
Both run inside spawn_ranks (launch.py); only group rank 0's return value is used for output.
"""

from __future__ import annotations

import os
import zlib

import torch
import torch.distributed as dist

from tpserve.tools.bench.collectives_common import (DTYPES, FUSED, FUSED_OPS, HC_EXPAND, MOE_COMBINE, compare, median_us, reference,
                                       schedule, sync)
from tpserve.collectives.comm import Communicator
from tpserve.collectives.tuning import op_bytes


def _setup(rank: int, world: int, spec: dict) -> tuple[Communicator, torch.device]:
    from tpserve.config import EngineConfig
    if spec["device"] == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    config = EngineConfig(allreduce_workspace_mb=spec["workspace_mb"], collective_table=spec.get("table"),
                          custom_allreduce=True, allreduce_topology=spec.get("topology", "mesh"))
    comm = Communicator(dist.group.WORLD, device, config=config, prepare_all=True,
                        timeout_s=spec.get("barrier_timeout", 300.0))
    if hasattr(comm._ws, "trap_on_timeout"):  # CUDA: report a stuck barrier, don't hang
        comm._ws.max_spin, comm._ws.trap_on_timeout = 1 << 25, False
    fault = spec.get("fault")
    if fault:  # testing the checker: corrupt one element of one backend's result on one rank
        run = comm.run

        def faulty(op: str, x: torch.Tensor, backend: str, dim: int = 0) -> torch.Tensor:
            y = run(op, x, backend, dim)
            if backend == fault and rank == world - 1 and y.numel():
                y = y.contiguous().clone()
                y.view(-1)[0] += 1
            return y
        comm.run = faulty  # type: ignore[method-assign]
    return comm, device


def _time(comm: Communicator, op: str, backend: str, x: torch.Tensor, dim: int,
          device: torch.device, graph: bool, scale: float) -> float:
    """Median latency in microseconds of `op` through `backend` (rank 0's view)."""
    warm, iters = schedule(op_bytes(op, x.numel(), x.element_size(), comm.world_size), device, scale)
    return median_us(lambda: comm.run(op, x, backend, dim), warm, iters, device, graph)


def _input(op: str, nbytes: int, dtype: torch.dtype, world: int, device: torch.device,
           seed: int) -> torch.Tensor:
    per = nbytes // dtype.itemsize // (world if op == "all_gather" else 1)
    if op == "reduce_scatter":
        per = max(world, per // world * world)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(max(1, per), generator=g).to(dtype).to(device)


def timing_worker(rank: int, world: int, spec: dict) -> list[dict] | None:
    """Rows {op, dtype, bytes, pick, us: {backend: median us}} for every requested case."""
    comm, device = _setup(rank, world, spec)
    rows: list[dict] = []
    cases = [(op, dt, size) for op in spec["ops"] for dt in spec["dtypes"] for size in spec["sizes"]]
    bar = None
    if rank == 0 and spec.get("progress", True):
        from tqdm import tqdm
        bar = tqdm(total=len(cases), desc=f"timing ({spec['device']}, world {world})",
                   unit="case", leave=False)
    try:
        for op, dt_name, size in cases:
            if op in FUSED_OPS:
                from tpserve.tools.bench.collectives_fused import fused_row
                rows.append(fused_row(comm, op, dt_name, size, device, spec, rank, world))
                if bar is not None:
                    bar.update(1)
                continue
            x = _input(op, size, DTYPES[dt_name], world, device, seed=rank + 1)
            backends = comm.available_backends(op, x)
            if comm._ws is not None and comm._ws.fits(op, x) and device.type == "cpu":
                backends = [b for b in backends if b != "chunked"]  # one round: = twoshot
            us = {}
            for b in backends:
                try:
                    us[b] = _time(comm, op, b, x, 0, device, spec.get("graph", False),
                                  spec.get("iter_scale", 1.0))
                except Exception as exc:  # noqa: BLE001 - shown in the table, not fatal
                    us[b] = f"error: {type(exc).__name__}: {exc}"[:200]
                    sync(device)
                    dist.barrier()
            rows.append({"op": op, "dtype": dt_name, "world": world,
                         "bytes": op_bytes(op, x.numel(), x.element_size(), world),
                         "pick": comm.backend_for(op, x), "us": us})
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        comm.close()
    return rows if rank == 0 else None


# -- correctness ------------------------------------------------------------------------------
def _strided(t: torch.Tensor) -> torch.Tensor:
    """A non-contiguous view with t's values: every other element of a wider buffer."""
    wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1] + 1), dtype=t.dtype, device=t.device)
    view = wide[..., 1::2]
    view.copy_(t)
    return view


def _cases(world: int, cap: int) -> list[tuple[str, tuple[int, ...], int]]:
    """(op, per-rank shape, dim): odd, medium and larger-than-workspace sizes, two dims."""
    big = int(cap * 2.5)
    out = []
    for shape in [(7,), (3, 5), (33, 129), (big // 1000 + 1, 1000), (big + 3,)]:
        out.append(("all_reduce", shape, 0))
    for shape, dim in [((5,), 0), ((3, 7), 1), ((33, 129), 0), ((big // 1000 + 1, 1000), 0),
                       ((2, big // 2 + 1), 1)]:
        out.append(("all_gather", shape, dim))
    for shape, dim in [((world, 3), 0), ((3, 5 * world), 1), ((world * 33, 129), 0),
                       ((world * (big // 1000 // world + 1), 1000), 0),
                       ((3, world * (big // 3 // world + 7)), 1)]:
        out.append(("reduce_scatter", shape, dim))
    return out


def _digest(t: torch.Tensor) -> int:
    raw = t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return zlib.crc32(raw) | (len(raw) << 32)


def check_worker(rank: int, world: int, spec: dict) -> list[str]:
    """Descriptions of every failed check on this rank ([] if all passed)."""
    comm, device = _setup(rank, world, spec)
    failures: list[str] = []
    digests: list[int] = []
    labels: list[str] = []
    try:
        cap = comm._ws.capacity(torch.float32) if comm._ws is not None else 1 << 16
        for dt_name in spec["dtypes"]:
            dtype = DTYPES[dt_name]
            for case_id, (op, shape, dim) in enumerate(_cases(world, cap)):
                gens = [torch.Generator().manual_seed(1000 * case_id + r) for r in range(world)]
                xs = [torch.randn(shape, generator=g).to(dtype).to(device) for g in gens]
                ref = reference(op, xs, dim, rank)
                for layout in ("contiguous", "strided"):
                    mine = xs[rank] if layout == "contiguous" else _strided(xs[rank])
                    for backend in comm.available_backends(op, mine):
                        label = f"{op} {dt_name} {layout} shape={shape} dim={dim} [{backend}]"
                        try:
                            y = comm.run(op, mine.clone() if layout == "contiguous" else mine,
                                         backend, dim)
                            sync(device)
                            problem = compare(y, ref, backend, dt_name, world)
                        except Exception as exc:  # noqa: BLE001
                            problem = f"raised {type(exc).__name__}: {exc}"
                            sync(device)
                        if problem:
                            failures.append(f"rank {rank}: {label}: {problem}")
                        if op != "reduce_scatter":
                            labels.append(label)
                            digests.append(_digest(y) if not problem.startswith("raised") else 0)
        from tpserve.tools.bench.collectives_fused import fused_check, hc_expand_check, moe_combine_check
        for op, fused_op_check in ((FUSED, fused_check), (HC_EXPAND, hc_expand_check),
                                   (MOE_COMBINE, moe_combine_check)):
            if op in spec["ops"]:
                for dt_name in spec["dtypes"]:
                    failures += [f"rank {rank}: {f}"
                                 for f in fused_op_check(comm, dt_name, device, cap)]
        if device.type == "cuda" and comm._ws is not None:
            failures += [f"rank {rank}: {f}" for f in _graph_check(comm, device, cap)]
        if comm._ws is not None and hasattr(comm._ws, "error_flag") and comm._ws.error_flag():
            failures.append(f"rank {rank}: a workspace barrier timed out (error flag set)")
        everyone = comm._ops.all_gather_ints(digests) if digests else []
        for i, label in enumerate(labels):
            values = {d[i] for d in everyone}
            if len(values) > 1 and rank == 0:
                failures.append(f"{label}: results differ between ranks")
    finally:
        comm.close()
    return failures


def bench_worker(rank: int, world: int, spec: dict) -> dict:
    """The correctness suite (if spec['check']) then the timings (if spec['timing'])."""
    failures = check_worker(rank, world, spec) if spec.get("check") else []
    rows = timing_worker(rank, world, spec) if spec.get("timing", True) else None
    return {"failures": failures, "rows": rows}


def _graph_check(comm: Communicator, device: torch.device, cap: int) -> list[str]:
    """Workspace paths captured in one CUDA graph, replayed with fresh inputs between eager
    calls: the device-side epochs and slot parity must carry across replays. "chunked"
    all-gather / reduce-scatter are the pipelined kernel (comm.run asks for it at any size); the
    ring all-reduce where the workspace has it, over two rounds."""
    world, rank = comm.world_size, comm.rank
    shapes = {("all_reduce", "oneshot"): (1000,), ("all_reduce", "twoshot"): (4097,),
              ("all_reduce", "chunked"): (int(cap * 2.2) + 1,),
              ("all_gather", "oneshot"): (300, 7), ("reduce_scatter", "oneshot"): (world * 64, 5),
              ("all_gather", "chunked"): (301, 7), ("reduce_scatter", "chunked"): (world * 65, 5)}
    if hasattr(comm._ws, "ring_capacity"):  # the CUDA workspace's ring all-reduce
        shapes[("all_reduce", "ring")] = (int(comm._ws.ring_capacity(torch.bfloat16) * 1.3) + 1,)  # two rounds
    statics = {k: torch.zeros(s, dtype=torch.bfloat16, device=device) for k, s in shapes.items()}
    for (op, b), x in statics.items():  # compile every variant before capturing
        comm.run(op, x, b)
    sync(device)
    fused_in = None
    if hasattr(comm._ws, "all_reduce_add_rmsnorm"):
        fused_in = [torch.zeros(2, 512, dtype=torch.bfloat16, device=device) for _ in range(2)]
        fused_in.append(torch.ones(512, dtype=torch.bfloat16, device=device))
        comm._ws.all_reduce_add_rmsnorm(*fused_in, 1e-6)
        sync(device)
    hc_in = None
    if hasattr(comm._ws, "all_reduce_hc_expand"):  # post 1, comb 0: new streams = the total
        hc_in = [torch.zeros(3, 700, dtype=torch.bfloat16, device=device),
                 torch.zeros(3, 4, 700, dtype=torch.bfloat16, device=device),
                 torch.ones(3, 4, device=device), torch.zeros(3, 4, 4, device=device)]
        comm._ws.all_reduce_hc_expand(*hc_in)
        sync(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = {k: comm.run(k[0], x, k[1]) for k, x in statics.items()}
        fused_out = comm._ws.all_reduce_add_rmsnorm(*fused_in, 1e-6) if fused_in else None
        hc_out = comm._ws.all_reduce_hc_expand(*hc_in) if hc_in else None
    problems: list[str] = []
    for replay in range(4):
        xs_all = {}
        for i, (k, x) in enumerate(statics.items()):
            gens = [torch.Generator().manual_seed(7919 * replay + 31 * i + r) for r in range(world)]
            xs_all[k] = [torch.randn(x.shape, generator=g).to(x.dtype).to(device) for g in gens]
            x.copy_(xs_all[k][rank])
        if fused_in is not None:
            parts = [torch.full_like(fused_in[0], float(r + replay)) for r in range(world)]
            fused_in[0].copy_(parts[rank])
            fused_in[1].fill_(1.0)
        if hc_in is not None:
            hc_in[0].fill_(float(rank + replay))
        graph.replay()
        eager = comm.run("all_reduce", xs_all[("all_reduce", "twoshot")][rank], "oneshot")
        if fused_out is not None:
            sync(device)
            want_res = 1.0 + sum(float(r + replay) for r in range(world))
            if not bool((fused_out[1] == want_res).all()) or not bool((fused_out[0] == 1).all()):
                problems.append(f"CUDA graph replay {replay}: fused all-reduce + RMSNorm mismatch")
        if hc_out is not None:
            sync(device)
            if not bool((hc_out == sum(float(r + replay) for r in range(world))).all()):
                problems.append(f"CUDA graph replay {replay}: fused all-reduce + mHC expand "
                                "mismatch")
        sync(device)
        for k, out in outs.items():
            want = reference(k[0], xs_all[k], 0, rank)
            if not torch.equal(out, want):
                problems.append(f"CUDA graph replay {replay}: {k[0]} [{k[1]}] mismatch")
        if not torch.equal(eager, reference("all_reduce", xs_all[("all_reduce", "twoshot")], 0,
                                             rank)):
            problems.append(f"eager all_reduce between graph replays {replay}: mismatch")
    return problems
