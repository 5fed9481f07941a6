"""NVFP4 at one row of x in CUDA (NVRTC): the dense GEMV y [1, N] = x [1, K] @ dequant(W)^T, and the MoE experts
at decode, one (token, choice) pair at a time; the kernels' design and source are nvfp4_m1_source_cuda.py's.
quant/dispatch.py decides where they run.
"""

from __future__ import annotations

import functools

import torch

from tpserve.kernels.launch import ex_cuda as launch_ex
from tpserve.kernels.quant import gemv_cuda as mg
from tpserve.kernels.quant.nvfp4_m1_source_cuda import (MAX_PAIRS, MAX_TOP_K, MODES,  # noqa: F401
                                                        SHIFT_W_LOG2, SHIFT_X_LOG2, TABLE_LOG2, Config, source)


@functools.lru_cache(maxsize=None)
def _kernel(cfg: Config, mode: str, arch: str, device: int, h_shift: bool = False):
    from torch.cuda import _compile_kernel

    text, name = source(cfg, mode, h_shift)
    with torch.cuda.device(device):
        return _compile_kernel(text, name, compute_capability=arch)


def fits(k: int, dtype: torch.dtype) -> bool:
    """Shapes these kernels take: bf16 x, K a multiple of 256 (one chunk)."""
    return dtype == torch.bfloat16 and k % 256 == 0 and k > 0


def usable(x: torch.Tensor, inter: int) -> bool:
    """The experts kernels take x [T, D] with expert width `inter` (shapes as `fits`) and can run here (a CUDA
    device of sm_80+ where NVRTC builds: gemv_cuda.available)."""
    return x.dim() == 2 and fits(x.shape[1], x.dtype) and fits(inter, x.dtype) and mg.available(x)


def default_config(mode: str, n: int, pairs: int = 1) -> Config:
    """The best of bench/quant_decode_sweep.py (--sections m1, m1exp) on an H200 (BENCHMARKS.md, NVFP4 one-row
    kernels), all with the "shift" decode and two stages: dense one row tile a warp, 4 warps where N >= 8192, else
    8; experts gate|up one row tile of each part, 2 warps; down one row tile and 4 warps at up to 8 pairs, two row
    tiles and 2 warps above; down_sum one row tile, 8 warps."""
    if mode == "dense":
        return Config(splits=4 if n >= 8192 else 8)
    if mode == "down":
        return Config(rows=2, splits=2) if pairs > 8 else Config()
    if mode == "down_sum":
        return Config(splits=8)
    return Config(splits=2)


def _launch(cfg: Config, mode: str, grid: tuple[int, int], w, s, s2, x, ids, route, y, n: int, k: int,
            top_k: int = 1, num_experts: int = 1, limit: float = float("inf"), pdl: bool = False,
            h_shift: bool = False) -> None:
    device = x.device.index
    if device != torch.cuda.current_device():
        raise ValueError(f"x: on cuda:{device}, but the current device is cuda:{torch.cuda.current_device()} "
                         "(call inside `with torch.cuda.device(...)`)")
    major, minor = torch.cuda.get_device_capability(device)
    kernel = _kernel(cfg, mode, f"{major}{minor}", device, h_shift)
    smem = cfg.smem(2 if mode == "gate_up" else 1, k, top_k if mode == "down_sum" else 1)
    launch_ex.reserve_smem(kernel, smem)
    args = [w, s, s2, x, ids if ids is not None else s2, route if route is not None else s2, y, n, k, top_k,
            num_experts, float(limit)]
    if pdl:
        launch_ex.launch_pdl(kernel, (grid[0], grid[1], 1), (32 * cfg.splits, 1, 1), smem, args)
    else:
        kernel(grid=(grid[0], grid[1], 1), block=(32 * cfg.splits, 1, 1), shared_mem=smem, args=args)


def gemv(x: torch.Tensor, w: torch.Tensor, bscale: torch.Tensor, scale2_rows: torch.Tensor,
         cfg: Config | None = None) -> torch.Tensor:
    """x [1, K] bf16 (CUDA) @ dequant(w uint8 [N, K/2], bscale float8_e4m3fn [N, K/16], scale2_rows float32 [N])^T
    -> y [1, N] bf16."""
    n, k = w.shape[0], 2 * w.shape[1]
    if x.dim() != 2 or x.shape[0] != 1 or x.shape[1] != k or not fits(k, x.dtype) or not x.is_cuda:
        raise ValueError(f"x: must be one bf16 CUDA row [1, {k}] with K a multiple of 256, got {tuple(x.shape)} "
                         f"{x.dtype} on {x.device}")
    if w.dtype != torch.uint8 or tuple(bscale.shape) != (n, k // 16) or bscale.dtype != torch.float8_e4m3fn:
        raise ValueError(f"w, bscale: must be uint8 [{n}, {k // 2}] and float8_e4m3fn [{n}, {k // 16}], got "
                         f"{w.dtype} {tuple(w.shape)}, {bscale.dtype} {tuple(bscale.shape)}")
    if tuple(scale2_rows.shape) != (n,):
        raise ValueError(f"scale2_rows: must be [{n}], got {tuple(scale2_rows.shape)}")
    cfg = cfg or default_config("dense", n)
    y = torch.empty(1, n, dtype=torch.bfloat16, device=x.device)
    if n:
        _launch(cfg, "dense", (-(-n // (16 * cfg.rows)), 1), mg._aligned(w, 16), bscale.contiguous().view(torch.uint8),
                scale2_rows.float().contiguous(), mg._aligned(x, 16).view(torch.int16), None, None,
                y.view(torch.int16), n, k)
    return y


def experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
            gu_bscale: torch.Tensor, gu_scale2: torch.Tensor, down: torch.Tensor, dn_bscale: torch.Tensor,
            dn_scale2: torch.Tensor, limit: float | None, cfg_gate_up: Config | None = None,
            cfg_down: Config | None = None, sum_choices: bool | None = None,
            pdl: bool | None = None) -> torch.Tensor:
    """The MoE experts at decode (quant_methods.Nvfp4Experts' layout): x [T, D] bf16, weights / ids [T, top_k];
    gate_up uint8 [E, 2I, D/2] (gate rows, then up), gu_bscale e4m3 [E, 2I, D/16], gu_scale2 float32 [E, 2];
    down uint8 [E, D, I/2], dn_bscale [E, D, I/16], dn_scale2 [E, 1]; limit: SwiGLU's clamp (None: none).
    sum_choices: the down kernel sums a token's choices itself ("down_sum", a block a row tile and token) rather
    than writing each pair's fp32 row for route_triton.combine_choices (None: at one token, where it measured
    faster; level at 2 tokens, slower at 8). pdl: down launched as a programmatic dependent of gate|up
    (launch/ex_cuda.py: its blocks load their first W stages while gate|up's last blocks run; None: where
    supported, sm_90+).
    -> [T, D] bf16, each token's choices summed in fp32."""
    t, top_k = ids.shape
    num_experts, two_i, half_d = gate_up.shape
    inter, d = two_i // 2, x.shape[1]
    if x.shape[0] != t or tuple(weights.shape) != (t, top_k):
        raise ValueError(f"x, weights: must have ids' {t} tokens ([{t}, D], [{t}, {top_k}]), got {tuple(x.shape)}, "
                         f"{tuple(weights.shape)}")
    if t * top_k > MAX_PAIRS:
        raise ValueError(f"ids: at most {MAX_PAIRS} (token, choice) pairs (the grid's y dimension), got "
                         f"{t} x {top_k}; larger batches belong to the grouped experts")
    if sum_choices and top_k > MAX_TOP_K:
        raise ValueError(f"sum_choices: takes at most {MAX_TOP_K} choices a token, got top_k {top_k}")
    if not (x.is_cuda and fits(d, x.dtype) and fits(inter, x.dtype)) or 2 * half_d != d:
        raise ValueError(f"x: must be bf16 CUDA [T, {2 * half_d}] with D and I multiples of 256, got "
                         f"{tuple(x.shape)} {x.dtype} on {x.device} (I = {inter})")
    if tuple(down.shape) != (num_experts, d, inter // 2) or tuple(gu_scale2.shape) != (num_experts, 2) or \
            tuple(dn_scale2.shape) != (num_experts, 1):
        raise ValueError(f"down / scale2: expected [{num_experts}, {d}, {inter // 2}], [{num_experts}, 2], "
                         f"[{num_experts}, 1]; got {tuple(down.shape)}, {tuple(gu_scale2.shape)}, "
                         f"{tuple(dn_scale2.shape)}")
    sum_choices = t == 1 and top_k <= MAX_TOP_K if sum_choices is None else sum_choices
    p = t * top_k
    cg = cfg_gate_up or default_config("gate_up", inter, p)
    cd = cfg_down or default_config("down_sum" if sum_choices else "down", d, p)
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    h = torch.empty(p, inter, dtype=torch.bfloat16, device=x.device)
    y = torch.empty(t if sum_choices else p, d, dtype=torch.bfloat16 if sum_choices else torch.float32,
                    device=x.device)
    if p:
        lim = float("inf") if limit is None else float(limit)
        # down's arguments first: a copy or cast among them would launch a kernel between gate|up and down
        dn_args = (mg._aligned(down, 16), dn_bscale.contiguous().view(torch.uint8), dn_scale2.float().contiguous(),
                   h.view(torch.int16), flat, weights.reshape(-1).float().contiguous())
        if pdl is None:
            pdl = launch_ex.supported(x.device)
        _launch(cg, "gate_up", (-(-inter // (16 * cg.rows)), p), mg._aligned(gate_up, 16),
                gu_bscale.contiguous().view(torch.uint8), gu_scale2.float().contiguous(),
                mg._aligned(x, 16).view(torch.int16), flat, None, h.view(torch.int16), inter, d, top_k, num_experts,
                lim, h_shift=cd.decode == "shift")
        _launch(cd, "down_sum" if sum_choices else "down", (-(-d // (16 * cd.rows)), t if sum_choices else p),
                *dn_args, y.view(torch.int16) if sum_choices else y, d, inter, top_k, num_experts, pdl=pdl)
    elif sum_choices:
        y.zero_()
    if sum_choices:
        return y
    from tpserve.kernels.moe.route_triton import combine_choices  # (Triton: CUDA machines only)

    return combine_choices(y, top_k, x.dtype, "triton")
