"""kernels/launch/ex_cuda.py's shared-memory helpers on the CPU: the driver calls of `cap_blocks` through a stand-in for
libcuda (the GPU tests of quant/gemv_cuda.py run them for real)."""

import ctypes
from types import SimpleNamespace

import pytest

from tpserve.kernels.launch import ex_cuda as launch_ex


class _Lib:
    """libcuda's two function-attribute calls, recording what is set."""

    def __init__(self, static: int):
        self.static, self.set = static, []

    def cuFuncGetAttribute(self, out, attr, func):  # noqa: N802 (the driver's name)
        assert attr == launch_ex.SHARED_SIZE_ATTRIBUTE
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.static
        return 0

    def cuFuncSetAttribute(self, func, attr, value):  # noqa: N802
        self.set.append((func, attr, value))
        return 0


class _Kernel:
    """A `_CudaKernel`'s part that the helpers touch."""

    def __init__(self):
        self.func, self.configured = 7, []

    def set_shared_memory_config(self, nbytes):
        self.configured.append(nbytes)
        self._max_shared_mem_bytes = nbytes


def test_cap_blocks_sets_the_carveout_once_and_opts_in_past_48_kib(monkeypatch):
    lib = _Lib(static=3584)
    monkeypatch.setattr(launch_ex.torch.cuda._utils, "_get_gpu_runtime_library", lambda: lib)
    props = SimpleNamespace(shared_memory_per_multiprocessor=233472)
    monkeypatch.setattr(launch_ex.torch.cuda, "get_device_properties", lambda device: props)
    kernel = _Kernel()
    pad = launch_ex.cap_blocks(kernel, 0, 0, 2)  # 2 blocks of a 64 KiB carveout
    assert (pad, kernel._tpserve_static_smem) == launch_ex.capped_smem(0, 3584, 2, 233472)[:1] + (3584,)
    assert lib.set == [(7, launch_ex.CARVEOUT_ATTRIBUTE, 100 * launch_ex.CARVEOUT // 233472)]
    assert kernel.configured == []  # (under 48 KiB: nothing to opt in to)
    assert launch_ex.cap_blocks(kernel, 0, 0, 2) == pad and len(lib.set) == 1  # the carveout set once
    pad1 = launch_ex.cap_blocks(kernel, 0, 0, 1)  # one block: past 48 KiB, opted in
    assert pad1 > 48 * 1024 and kernel.configured == [pad1]
    big = _Kernel()  # blocks too large for two in 64 KiB: the SM's whole shared memory
    pad = launch_ex.cap_blocks(big, 0, 69664, 2)
    assert lib.set[-1] == (7, launch_ex.CARVEOUT_ATTRIBUTE, 100) and pad >= 69664 and big.configured == [pad]
    with pytest.raises(ValueError, match="cap: 3 blocks"):
        launch_ex.cap_blocks(_Kernel(), 0, 76 * 1024, 3)


def test_reserve_smem_opts_in_only_past_48_kib_and_only_upward():
    kernel = _Kernel()
    launch_ex.reserve_smem(kernel, 40 * 1024)
    launch_ex.reserve_smem(kernel, 64 * 1024)
    launch_ex.reserve_smem(kernel, 56 * 1024)
    assert kernel.configured == [64 * 1024]
