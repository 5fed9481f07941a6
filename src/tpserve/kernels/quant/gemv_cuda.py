"""The quantized decode GEMV on the tensor cores in CUDA (NVRTC, through `torch.cuda._compile_kernel`): y [M <= 8, N]
= x [M, K] @ dequant(W)^T for FP8 block-128 and NVFP4 weights; its source and configurations are
gemv_source_cuda.py's. Needs sm_80+ (bf16 mma.sync) and NVRTC (PyTorch's CUDA builds bring it): `available` says
whether it compiles here. quant/dispatch.py decides where it runs.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import torch

from tpserve.kernels.launch import ex_cuda as launch_ex
from tpserve.kernels.quant.gemv_source_cuda import Config, kernel_name, source  # noqa: F401  (callers' config)
from tpserve.kernels.quant.ptx_cuda import (DECODE_MASK, DECODE_SHIFT, E2M1, FP4_TABLES, SEL_HI,  # noqa: F401
                                            SEL_LO, W_OFFSET_LOG2, X_SCALE_LOG2, fp4_tables)


@functools.lru_cache(maxsize=None)
def _kernel(cfg: Config, arch: str, device: int, pdl: bool = False):
    """The compiled kernel, loaded into `device`'s context (a module belongs to the context it was loaded in)."""
    from torch.cuda import _compile_kernel  # NVRTC: PyTorch's own runtime compiler binding

    with torch.cuda.device(device):
        return _compile_kernel(source(cfg, pdl), kernel_name(cfg, pdl), compute_capability=arch)


def available(x: torch.Tensor) -> bool:
    """Whether these GEMVs can run for x: a CUDA device of sm_80 or later, and NVRTC compiles the kernels there (a
    build without it is warned about once, and the Triton GEMVs run instead)."""
    if not x.is_cuda or torch.version.cuda is None:
        return False
    major, minor = torch.cuda.get_device_capability(x.device)
    return major >= 8 and _compiles(f"{major}{minor}", x.device.index or 0)


@functools.lru_cache(maxsize=None)
def _compiles(arch: str, device: int) -> bool:
    try:
        _kernel(Config(), arch, device)
    except (AttributeError, ImportError, OSError, RuntimeError) as exc:
        warnings.warn(f"kernels/quant/gemv_cuda: NVRTC could not build the GEMVs for sm_{arch} ({exc}); the Triton "
                      "GEMVs run instead", RuntimeWarning, stacklevel=3)
        return False
    return True


def fits(m: int, k: int, dtype: torch.dtype, block: tuple[int, int] | None = None) -> bool:
    """Shapes these GEMVs take: 1..8 rows of bf16 x; FP8 (block given): K whole 128-wide scale blocks and row
    scale blocks whole 16-row tiles; NVFP4 (block None): K a multiple of 256."""
    if not (1 <= m <= 8 and dtype == torch.bfloat16):
        return False
    return k % 256 == 0 if block is None else k % 128 == 0 and block[1] == 128 and block[0] % 16 == 0


def usable(x: torch.Tensor, block: tuple[int, int] | None = None) -> bool:
    """These GEMVs take x (fits; `block` as there) and can run (available)."""
    return fits(x.shape[0], x.shape[1], x.dtype, block) and available(x)


def default_config(fmt: str, n: int, k: int) -> Config:
    """The best of bench/quant_decode_sweep.py on an H200 (BENCHMARKS.md, quantized GEMV), K chunks interleaved over
    the block's warps and L2 fetching 256 bytes a load: two row tiles a warp and 4 warps a block where N >= 8192
    (measured at 12288 x 4096), else one row tile and 8 warps (measured at 4096 x 12288)."""
    if n >= 8192:
        return Config(fmt, rows=2, splits=4, depth=2, l2_prefetch=256, interleave=True)
    return Config(fmt, rows=1, splits=8, depth=2, l2_prefetch=256, interleave=True)


def _check(x: torch.Tensor, w: torch.Tensor, k_of_w: int, fmt: str, block) -> None:
    if not (x.is_cuda and w.is_cuda):
        raise ValueError(f"x: must be a CUDA tensor, as w (got {x.device}, {w.device})")
    if x.dim() != 2 or k_of_w != x.shape[1]:
        raise ValueError(f"x: must be [M, K] with K = {k_of_w} (w's), got {tuple(x.shape)}")
    if not fits(x.shape[0], x.shape[1], x.dtype, block):
        raise ValueError(f"{fmt}_gemv: takes 1..8 bf16 rows of x and K a multiple of "
                         f"{'128 (scale blocks (16 j, 128))' if block else 256}; got x {tuple(x.shape)} {x.dtype}"
                         + (f", block {tuple(block)}" if block else ""))


def _aligned(t: torch.Tensor, boundary: int) -> torch.Tensor:
    """t contiguous at an address the kernel's loads of it need (16 bytes for W's and x's vector loads, the element
    size for the scales): a view into a larger tensor may start anywhere, and is copied then. (The scales ask only
    their element size: the engine's are not 16-byte aligned, and copying them every call cost measurably.)"""
    t = t.contiguous()
    return t if t.data_ptr() % boundary == 0 else t.clone()


def _launch(cfg: Config, w, s, s2, x, n: int, sk: int, bns: int, pdl: bool = False) -> torch.Tensor:
    m, k = x.shape
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if n == 0:
        return y
    w, x, s, s2 = _aligned(w, 16), _aligned(x, 16), _aligned(s, 2 if s.dtype == torch.uint8 else 4), _aligned(s2, 4)
    device = x.device.index
    if device != torch.cuda.current_device():  # (the launch goes to the current device's current stream)
        raise ValueError(f"x: on cuda:{device}, but the current device is cuda:{torch.cuda.current_device()} "
                         "(call inside `with torch.cuda.device(...)`)")
    major, minor = torch.cuda.get_device_capability(device)
    pdl = pdl and launch_ex.supported(x.device)
    if pdl and cfg.stage == "regs" and not cfg.max_blocks:
        cfg = dataclasses.replace(cfg, max_blocks=launch_ex.one_wave_cap(-(-n // (16 * cfg.rows)),
                                                                         launch_ex.sms(device)))
    kernel, smem = _kernel(cfg, f"{major}{minor}", device, pdl), cfg.smem_bytes
    if cfg.max_blocks:  # (cap_blocks opts the kernel in to the bytes it asks for)
        smem = launch_ex.cap_blocks(kernel, device, smem, cfg.max_blocks)
    else:
        launch_ex.reserve_smem(kernel, smem)
    grid, block = (-(-n // (16 * cfg.rows)), 1, 1), (32 * cfg.splits, 1, 1)
    args = [w.view(torch.uint8), s, s2, x.view(torch.int16), y.view(torch.int16), m, n, k, sk, bns]
    if pdl:
        launch_ex.launch_pdl(kernel, grid, block, smem, args)
    else:
        kernel(grid=grid, block=block, shared_mem=smem, args=args)
    return y


def fp8_gemv(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, block: tuple[int, int] = (128, 128),
             cfg: Config | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M <= 8, K] bf16 (CUDA) @ dequant(w float8_e4m3fn [N, K], s float32 [ceil(N / block[0]), K / 128])^T
    -> y [M, N] bf16. pdl: launched as a programmatic dependent of the kernel before (sm_90+; else plainly): W's
    first chunks load before that kernel ends (`source`), and a regs config without max_blocks takes
    `launch_ex.one_wave_cap`."""
    n, k = w.shape
    _check(x, w, k, "fp8", block)
    if w.dtype != torch.float8_e4m3fn:
        raise ValueError(f"w: must be float8_e4m3fn, got {w.dtype}")
    if tuple(s.shape) != (-(-n // block[0]), k // 128) or s.dtype != torch.float32:
        raise ValueError(f"s: must be float32 [{-(-n // block[0])}, {k // 128}], got {s.dtype} {tuple(s.shape)}")
    cfg = cfg or default_config("fp8", n, k)
    if cfg.fmt != "fp8":
        raise ValueError(f"cfg: an fp8 config, got {cfg.fmt!r}")
    return _launch(cfg, w, s, s, x, n, s.shape[1], block[0], pdl)


def nvfp4_gemv(x: torch.Tensor, w: torch.Tensor, bscale: torch.Tensor, scale2_rows: torch.Tensor,
               cfg: Config | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M <= 8, K] bf16 (CUDA) @ dequant(w uint8 [N, K/2] (low nibble = even k), bscale float8_e4m3fn
    [N, K/16], scale2_rows float32 [N])^T -> y [M, N] bf16. pdl: as fp8_gemv."""
    n, k = w.shape[0], 2 * w.shape[1]
    _check(x, w, k, "nvfp4", None)
    if w.dtype != torch.uint8:
        raise ValueError(f"w: must be uint8 (two e2m1 codes a byte), got {w.dtype}")
    if tuple(bscale.shape) != (n, k // 16) or bscale.dtype != torch.float8_e4m3fn:
        raise ValueError(f"bscale: must be float8_e4m3fn [{n}, {k // 16}], got {bscale.dtype} {tuple(bscale.shape)}")
    if tuple(scale2_rows.shape) != (n,):
        raise ValueError(f"scale2_rows: must be [{n}], got {tuple(scale2_rows.shape)}")
    cfg = cfg or default_config("nvfp4", n, k)
    if cfg.fmt != "nvfp4":
        raise ValueError(f"cfg: an nvfp4 config, got {cfg.fmt!r}")
    return _launch(cfg, w, bscale.contiguous().view(torch.uint8), scale2_rows.float(), x, n, k // 16, 1, pdl)
