"""What the rank-side work of the collective benchmarks shares (tools/bench/collectives_rank.py, its fused ops in
tools/bench/collectives_fused.py): the dtypes and bench-only op names, the iteration schedule and timer, the locally
computed reference and the comparison against it."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from tpserve.collectives.tuning import FUSED_OPS, TORCH

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the bench's fused "ops": Communicator.all_reduce_add_rmsnorm, .all_reduce_hc_expand and
# .reduce_scatter_moe_combine
FUSED, HC_EXPAND, MOE_COMBINE = FUSED_OPS


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def schedule(nbytes: int, device: torch.device, scale: float) -> tuple[int, int]:
    """(warm-up, timed) iterations: a fixed schedule from the size, identical on every rank."""
    if device.type == "cuda":
        n = int(scale * min(400, max(20, (1 << 28) // max(nbytes, 1))))
    else:
        n = int(scale * min(200, max(5, (1 << 24) // max(nbytes, 1 << 14))))
    return max(2, n // 5), max(3, n)


def median_us(fn, warm: int, iters: int, device: torch.device, graph: bool) -> float:
    """Median microseconds of one fn() after `warm` untimed calls and a barrier: CUDA events (ten calls
    per replay when `graph`, captured after the warm-up) on GPUs, the wall clock on CPU."""
    for _ in range(warm):
        fn()
    sync(device)
    dist.barrier()
    if device.type != "cuda":
        samples = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)
    per_replay, run = 1, fn
    if graph:
        per_replay, g = 10, torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(per_replay):
                fn()
        run = g.replay
        run()
        sync(device)
        dist.barrier()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for start, end in events:
        start.record()
        run()
        end.record()
    sync(device)
    return statistics.median(s.elapsed_time(e) * 1e3 / per_replay for s, e in events)


def reference(op: str, xs: list[torch.Tensor], dim: int, rank: int) -> torch.Tensor:
    if op == "all_gather":
        return torch.cat(xs, dim)
    acc = xs[0].float().clone()
    for x in xs[1:]:
        acc += x.float()
    total = acc.to(xs[0].dtype)
    if op == "all_reduce":
        return total
    return total.chunk(len(xs), dim)[rank]


def compare(y: torch.Tensor, ref: torch.Tensor, backend: str, dt_name: str, world: int) -> str:
    if tuple(y.shape) != tuple(ref.shape):
        return f"shape {tuple(y.shape)} != expected {tuple(ref.shape)}"
    if y.dtype != ref.dtype:
        return f"dtype {y.dtype} != {ref.dtype}"
    if torch.equal(y, ref):
        return ""
    diff = (y.float() - ref.float()).abs()
    worst = float(diff.max())
    where = int(diff.reshape(-1).argmax())
    if backend in (TORCH, "symm_oneshot", "symm_twoshot"):  # other summation orders: a tolerance
        tol = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}[dt_name] * world
        scale = ref.float().abs().clamp_min(1.0)
        if bool((diff <= tol * scale).all()):
            return ""
    return (f"mismatch: max |diff| {worst:.3g} at flat index {where} "
            f"(got {float(y.reshape(-1)[where]):.6g}, want {float(ref.reshape(-1)[where]):.6g})")
