"""Programmatic dependent launch (PDL) between our Triton kernels of a decode step (switch `--pdl`; sm_90+).

A kernel launched with `launch_pdl=True` may start while the kernel before it in the stream still runs, once
every block of that one has signalled (`gdc_launch_dependents`, PTX `griddepcontrol.launch_dependents`) or ended;
its own `gdc_wait` (`griddepcontrol.wait`) then blocks until the kernel before has completed and its writes are
visible. So each of our kernels, with PDL on: signals first, so that the next kernel's blocks are scheduled (and
load what does not depend on this one, weights) while this one's last blocks run, then waits before it reads
anything an earlier kernel wrote or writes anything at all. Every block waits (unconditionally, before it ends), so
a kernel never completes before the one it follows: the order of the stream holds from kernel to kernel. Kernels
launched plainly (torch's, cuBLAS, fla's) are fully ordered as always. Captured into CUDA graphs as programmatic
edges. With PDL off (the CPU interpreter, older GPUs) these helpers compile to nothing. What it saves at each
kernel boundary: bench/pdl_chain.py (BENCHMARKS.md, programmatic dependent launch).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def release(PDL: tl.constexpr):
    """The next kernel may launch (its blocks scheduled while this kernel's run)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait(PDL: tl.constexpr):
    """Block until the kernel before has completed and its writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def start(PDL: tl.constexpr):
    """`release`, then `wait`: a kernel with nothing to load before its inputs are ready."""
    release(PDL)
    wait(PDL)
