"""Launches of the NVRTC kernels that `torch.cuda._compile_kernel` builds through the driver's cuLaunchKernelEx
(ctypes), for what its own launcher cannot give (sm_90+): programmatic dependent launch (PDL).

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
