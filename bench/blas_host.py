"""Host time of one eager GEMM launch per BLAS library (torch.backends.cuda.preferred_blas_library), at the
shapes of a short prefill chunk: what an eager step pays per torch.mm before the device runs it.

    python bench/blas_host.py [--tokens 298 16 1] [--dims 4096x8192 8192x4096 4096x4096] [--calls 200]

For each library, shape and token count: the median host time of a launch (perf_counter around one
torch.mm call, nothing waiting on the device: the calls queue behind a long one first), and the device time of
one GEMM (CUDA events over --calls calls). Needs a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def host_us(a: torch.Tensor, w: torch.Tensor, calls: int) -> float:
    big = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.mm(big, big)  # the device is busy for a while: the launches below only queue
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        torch.mm(a, w)
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def device_us(a: torch.Tensor, w: torch.Tensor, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        torch.mm(a, w)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[298, 16, 1])
    ap.add_argument("--dims", nargs="*", default=["4096x8192", "8192x4096", "4096x4096"])
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    libs = ["cublas", "cublaslt"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, default library "
          f"{torch.backends.cuda.preferred_blas_library()}")
    print("| K x N | tokens | " + " | ".join(f"{lib} host us | {lib} device us" for lib in libs) + " |")
    print("| --- | --- | " + " | ".join("--- | ---" for _ in libs) + " |")
    default = torch.backends.cuda.preferred_blas_library()
    for dims in args.dims:
        k, n = map(int, dims.split("x"))
        w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        for m in args.tokens:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            cells = []
            for lib in libs:
                torch.backends.cuda.preferred_blas_library(lib)
                torch.mm(a, w)
                torch.cuda.synchronize()
                cells.append(f"{host_us(a, w, args.calls):.1f} | {device_us(a, w, args.calls):.1f}")
            print(f"| {dims} | {m} | " + " | ".join(cells) + " |")
    torch.backends.cuda.preferred_blas_library(default)


if __name__ == "__main__":
    main()
