"""Launches of the NVRTC kernels that `torch.cuda._compile_kernel` builds (quant/gemv_cuda.py,
quant/nvfp4_m1_cuda.py): through the driver's cuLaunchKernelEx (ctypes), for what torch's own launcher cannot give
(sm_90+): programmatic dependent launch (PDL); and their shared memory: the opt-in past 48 KiB (`reserve_smem`)
and a cap on the blocks an SM holds (`cap_blocks`, `one_wave_cap`).

A kernel launched with programmatic stream serialization may start before the kernel ahead of it in the stream has
finished: once every block of that one has run `griddepcontrol.launch_dependents` (or exited). It must run
`griddepcontrol.wait` before it reads what that kernel writes; the wait returns once that kernel has finished and
its writes are visible. Work before the wait (loads of weights the kernel ahead does not write) then overlaps that
kernel's last blocks. Both instructions are no-ops in a kernel launched without the attribute. CUDA graphs keep the
dependency as a programmatic edge.

`launch_pdl` takes the arguments as `_CudaKernel.__call__` does (tensors as pointers, ints as C ints, floats as C
doubles).
"""

from __future__ import annotations

import ctypes
import functools

import torch

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class _Attribute(ctypes.Structure):  # CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("value_rest", ctypes.c_char * 60)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attribute)),
                ("num_attrs", ctypes.c_uint)]


def supported(device: torch.device) -> bool:
    """PDL needs sm_90+ and a driver with cuLaunchKernelEx."""
    if device.type != "cuda" or not torch.cuda.is_available() or torch.version.cuda is None:
        return False
    return _supported(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _supported(index: int) -> bool:  # (asked at every experts call: the answer is the device's)
    if torch.cuda.get_device_capability(index)[0] < 9:
        return False
    return hasattr(torch.cuda._utils._get_gpu_runtime_library(), "cuLaunchKernelEx")


def launch_pdl(kernel, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int, args: list) -> None:
    """Launch `kernel` (a `_CudaKernel`) on the current stream, allowed to start before the kernel ahead of it
    finishes (see the module docstring)."""
    keep = []  # the C values the pointers below point into
    for a in args:
        if isinstance(a, torch.Tensor):
            if not a.is_cuda:
                raise ValueError(f"args: tensors must be on a CUDA device, got one on {a.device}")
            keep.append(ctypes.c_void_p(a.data_ptr()))
        elif isinstance(a, bool) or not isinstance(a, (int, float)):
            raise TypeError(f"args: tensors, ints and floats only, got {type(a).__name__}")
        else:
            keep.append(ctypes.c_int(a) if isinstance(a, int) else ctypes.c_double(a))
    libcuda = torch.cuda._utils._get_gpu_runtime_library()
    params = (ctypes.c_void_p * len(keep))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in keep])
    attr = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
    cfg = _Config(*grid, *block, shared_mem, torch.cuda.current_stream().cuda_stream, ctypes.pointer(attr), 1)
    err = libcuda.cuLaunchKernelEx(ctypes.byref(cfg), kernel.func, params, None)
    if err != 0:
        name = ctypes.c_char_p()
        libcuda.cuGetErrorString(err, ctypes.byref(name))
        raise RuntimeError(f"cuLaunchKernelEx: {name.value.decode() if name.value else err}")


def reserve_smem(kernel, nbytes: int) -> None:
    """Opt a compiled kernel in to `nbytes` of dynamic shared memory where that is past the 48 KiB a launch gets
    unasked (torch's launcher refuses the launch otherwise)."""
    if nbytes >= 48 * 1024 and nbytes > getattr(kernel, "_max_shared_mem_bytes", 0):
        kernel.set_shared_memory_config(nbytes)


CARVEOUT = 64 * 1024  # the smaller shared-memory carveout a capped launch asks for (L1 keeps the rest)
CARVEOUT_ATTRIBUTE = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: percent of the SM's shared memory
SHARED_SIZE_ATTRIBUTE = 1  # CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: a kernel's static shared memory


def capped_smem(smem: int, static: int, cap: int, per_sm: int) -> tuple[int, int]:
    """(dynamic shared memory, carveout) for a launch whose blocks use `smem` dynamic and `static` static bytes and
    of which an SM may hold no more than `cap`: the carveout is CARVEOUT where `cap` blocks fit it, else the SM's
    whole `per_sm`, and each block asks for enough unused bytes that one more does not fit (the driver keeps 1 KiB a
    block besides)."""
    for carve in (CARVEOUT, per_sm):
        pad = carve // cap - 1024 - static - 128
        if pad >= smem:
            return pad, carve
    raise ValueError(f"cap: {cap} blocks of {smem + static} bytes of shared memory do not fit an SM's {per_sm}")


def cap_blocks(kernel, device: int, smem: int, cap: int) -> int:
    """Make a launch of `kernel` (a `_CudaKernel` of `smem` dynamic bytes) hold at most `cap` blocks an SM
    (`capped_smem`): sets its carveout and opts it in to the bytes; returns the dynamic bytes to launch with."""
    lib = torch.cuda._utils._get_gpu_runtime_library()
    static = getattr(kernel, "_tpserve_static_smem", None)
    if static is None:
        value = ctypes.c_int(0)
        if lib.cuFuncGetAttribute(ctypes.byref(value), SHARED_SIZE_ATTRIBUTE, kernel.func):
            raise RuntimeError("cuFuncGetAttribute(SHARED_SIZE_BYTES) failed")
        static = kernel._tpserve_static_smem = value.value
    per_sm = torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor
    pad, carve = capped_smem(smem, static, cap, per_sm)
    if getattr(kernel, "_tpserve_carveout", None) != carve:  # (percent rounded down: the driver rounds up)
        if lib.cuFuncSetAttribute(kernel.func, CARVEOUT_ATTRIBUTE, 100 * carve // per_sm):
            raise RuntimeError("cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT) failed")
        kernel._tpserve_carveout = carve
    reserve_smem(kernel, pad)
    return pad


def one_wave_cap(blocks: int, sms: int) -> int:
    """The cap (gemv_cuda's Config.max_blocks) a PDL launch of `blocks` blocks gets on `sms` SMs: the fewest blocks
    an SM must hold for the grid to run in one wave (0, no cap, past 4). Without a cap a grid of the default configs
    leaves room on every SM, which the dependent grid's blocks take before this one ends, then sitting unevenly;
    with it a chain of dependent GEMVs ran faster (BENCHMARKS.md, the FP8 GEMV under PDL). Launched plainly the
    cap changed nothing, so only PDL launches take it."""
    cap = -(-blocks // sms)
    return cap if cap <= 4 else 0


@functools.lru_cache(maxsize=None)
def sms(device: int) -> int:
    """The device's SM count."""
    return torch.cuda.get_device_properties(device).multi_processor_count
