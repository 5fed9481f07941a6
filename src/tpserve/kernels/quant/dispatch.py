"""Which kernel a linear layer (16-bit or quantized) and a routed-experts call run: decided here alone, by one table
each (`LINEAR`, `EXPERTS`). A rule: (format, rows of x (tokens, for the experts), the switches it needs, the other
conditions in words and as a test, the kernel); the first rule that holds wins. The switch column is settled once,
when the model's ops are resolved (kernels/registry.py: `Ops.linear` / `Ops.experts`); the rows and the machine
per call. The kernels' entry points then launch what they are told (their tile defaults aside).

Machine facts: "triton" = x on a CUDA device with Triton importable; "sm90" = x's device is sm_90; "CUDA GEMV
builds" = NVRTC compiles gemv_cuda.py there (asked only where every other condition of the rule holds: the first
ask compiles). CPU tensors take the torch rows: the dequantized weight through F.linear, the experts' loop.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from tpserve.kernels.moe import ref as moe_ref
from tpserve.kernels.quant import ref as qr

ANY = (0, 1 << 62)
# NVFP4 experts at up to this many tokens run nvfp4_m1_cuda.experts: one (token, choice) pair a time, each reading
# its expert (the grouped Triton kernels read each chosen expert once); the largest batch at which the real-width
# model's decode step measured faster (BENCHMARKS.md, NVFP4 experts)
M1_MAX_TOKENS = 8


def on_triton(x: torch.Tensor) -> bool:
    """x on a CUDA device, and Triton importable."""
    if not x.is_cuda:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def sm90(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.get_device_capability(x.device)[0] == 9


class Case:
    """One call as the tables read it. The machine facts are probed from the tensors when a rule asks."""

    __slots__ = ("fmt", "m", "k", "n", "dtype", "block", "bias", "max_tokens", "x", "w")

    def __init__(self, fmt: str, x: torch.Tensor, w: torch.Tensor | None, m: int, k: int, n: int,
                 block: tuple[int, int] | None = None, bias: bool = False, max_tokens: int = 0):
        self.fmt, self.x, self.w, self.m, self.k, self.n = fmt, x, w, m, k, n
        self.dtype, self.block, self.bias, self.max_tokens = x.dtype, block, bias, max_tokens

    def triton(self) -> bool:
        return on_triton(self.x)

    def sm90(self) -> bool:
        return sm90(self.x)

    def cuda_gemv(self) -> bool:
        from tpserve.kernels.quant import gemv_cuda

        return gemv_cuda.available(self.x)

    def gemv16_fits(self) -> bool:
        """x on CUDA and linear/gemv_triton.fits(x, w): 2-D x of 1..16 rows, w [N >= 2048, K] of x's dtype, unit
        strides."""
        if not self.x.is_cuda:
            return False
        from tpserve.kernels.linear import gemv_triton

        return gemv_triton.fits(self.x, self.w)

    def m1_fits(self) -> bool:
        """nvfp4_m1_cuda.usable: bf16 x [T, D], D and the experts' width n multiples of 256; the CUDA kernels
        build."""
        from tpserve.kernels.quant import nvfp4_m1_cuda

        return nvfp4_m1_cuda.usable(self.x, self.n)


def _always(c: Case) -> bool:
    return True


def _fp8_tiles(c: Case) -> bool:  # the Triton FP8 GEMV's 128-wide K tiles sit inside the scale blocks, K whole tiles
    return c.block[1] % 128 == 0 and c.k % 128 == 0


def _fp8_cuda(c: Case) -> bool:
    return (c.triton() and _fp8_tiles(c) and c.dtype == torch.bfloat16 and c.block[1] == 128 and c.block[0] % 16 == 0
            and c.cuda_gemv())


def _nvfp4_gemv(c: Case) -> bool:
    return c.triton() and c.k % 256 == 0


def _nvfp4_cuda(c: Case) -> bool:
    return _nvfp4_gemv(c) and c.dtype == torch.bfloat16 and c.cuda_gemv()


@dataclass(frozen=True)
class Rule:
    fmt: str
    rows: tuple[int, int]          # both ends included
    switches: dict                 # Kernels fields -> the value the rule needs
    when: str                      # the per-call conditions, in words
    test: Callable[[Case], bool]
    kernel: str


_BF16_FITS = "x on CUDA, no bias, gemv_triton.fits (N >= 2048, x's dtype, unit strides)"
_FP8_TILES = "triton; K whole 128-wide tiles inside the scale blocks"
_FP8_CUDA = _FP8_TILES + "; bf16 x; scale blocks (16 j, 128); the CUDA GEMV builds"
_FP4_CUDA = "triton; K a multiple of 256; bf16 x; the CUDA GEMV builds"
LINEAR = (
    Rule("bf16", (1, 16), {"gemv": "triton"}, _BF16_FITS, lambda c: not c.bias and c.gemv16_fits(), "triton_gemv16"),
    Rule("bf16", ANY, {}, "", _always, "torch_linear"),
    Rule("fp8-block", (2, 8), {"quant_gemv": "cuda"}, _FP8_CUDA, _fp8_cuda, "cuda_fp8_gemv"),
    Rule("fp8-block", (1, 1), {"quant_gemv": "cuda", "pdl": True}, _FP8_CUDA, _fp8_cuda, "cuda_fp8_gemv"),
    Rule("fp8-block", (1, 1), {}, _FP8_TILES, lambda c: c.triton() and _fp8_tiles(c), "triton_fp8_row"),
    Rule("fp8-block", (2, 16), {}, _FP8_TILES + "; bf16 or float32 x",
         lambda c: c.triton() and _fp8_tiles(c) and c.dtype != torch.float16, "triton_fp8_qtile"),
    Rule("fp8-block", (0, 16), {}, _FP8_TILES, lambda c: c.triton() and _fp8_tiles(c), "triton_fp8_gemv"),
    Rule("fp8-block", (0, 16), {}, "triton", lambda c: c.triton(), "triton_gemm"),
    Rule("fp8-block", ANY, {}, "sm90; block (128, 128); K and N multiples of 128",
         lambda c: c.sm90() and tuple(c.block) == (128, 128) and c.k % 128 == 0 and c.n % 128 == 0, "scaled_mm"),
    Rule("fp8-block", ANY, {}, "", _always, "dequant"),
    Rule("fp8-channel", (1, 1), {}, "triton; K a multiple of 128", lambda c: c.triton() and c.k % 128 == 0,
         "triton_fp8_row"),
    Rule("fp8-channel", (2, 16), {}, "triton; K a multiple of 128; bf16 or float32 x",
         lambda c: c.triton() and c.k % 128 == 0 and c.dtype != torch.float16, "triton_fp8_qtile"),
    Rule("fp8-channel", (0, 16), {}, "triton; K a multiple of 128", lambda c: c.triton() and c.k % 128 == 0,
         "triton_fp8_gemv"),
    Rule("fp8-channel", (0, 16), {}, "triton", lambda c: c.triton(), "triton_gemm"),
    Rule("fp8-channel", ANY, {}, "", _always, "dequant"),
    Rule("nvfp4", (1, 1), {"quant_gemv": "cuda"}, _FP4_CUDA, _nvfp4_cuda, "cuda_nvfp4_m1"),
    Rule("nvfp4", (2, 8), {"quant_gemv": "cuda"}, _FP4_CUDA, _nvfp4_cuda, "cuda_nvfp4_gemv"),
    Rule("nvfp4", (1, 1), {}, "triton; K a multiple of 256", _nvfp4_gemv, "triton_nvfp4_row"),
    Rule("nvfp4", (0, 16), {}, "triton; K a multiple of 256; bf16 or float32 x",
         lambda c: _nvfp4_gemv(c) and c.dtype != torch.float16, "triton_nvfp4_planes"),
    Rule("nvfp4", (0, 16), {}, "triton; K a multiple of 256", _nvfp4_gemv, "triton_nvfp4_gemv"),
    Rule("nvfp4", ANY, {}, "triton", lambda c: c.triton(), "triton_gemm"),
    Rule("nvfp4", ANY, {}, "", _always, "dequant"),
)
EXPERTS = (
    Rule("bf16", (1, ANY[1]), {"moe": "triton"}, "up to --moe-triton-max-tokens tokens",
         lambda c: c.m <= c.max_tokens, "triton_grouped_small"),
    Rule("bf16", ANY, {"moe": "triton"}, "16-bit x", lambda c: c.dtype in (torch.bfloat16, torch.float16),
         "grouped_mm"),
    Rule("bf16", ANY, {}, "", _always, "loop"),
    Rule("fp8", ANY, {"moe": "triton"}, "triton", lambda c: c.triton(), "triton_fp8_experts"),
    Rule("fp8", ANY, {}, "", _always, "loop"),
    Rule("nvfp4", (0, M1_MAX_TOKENS), {"quant_gemv": "cuda", "moe": "triton"},
         "bf16 x [T, D]; D and I multiples of 256; the CUDA kernels build", lambda c: c.m1_fits(), "cuda_nvfp4_m1"),
    Rule("nvfp4", ANY, {"moe": "triton"}, "triton", lambda c: c.triton(), "triton_nvfp4_experts"),
    Rule("nvfp4", ANY, {}, "", _always, "loop"),
)


def rules_for(table: tuple[Rule, ...], fmt: str, switches: dict) -> tuple[Rule, ...]:
    """The rules of `fmt` whose switch column these switches meet (what a resolved dispatch keeps)."""
    out = tuple(r for r in table if r.fmt == fmt and all(switches[k] == v for k, v in r.switches.items()))
    if not out:
        raise ValueError(f"no kernel for format {fmt!r}")
    return out


def choose(rules: tuple[Rule, ...], case: Case) -> str:
    for r in rules:
        if r.rows[0] <= case.m <= r.rows[1] and r.test(case):
            return r.kernel
    raise RuntimeError(f"no rule for {case.fmt} at {case.m} rows")  # (every format ends in an unconditional rule)


def describe(table: tuple[Rule, ...] = LINEAR) -> str:
    """The table as text, a rule a line."""
    return "\n".join(f"{r.fmt:<11} rows {r.rows[0]}..{'any' if r.rows[1] == ANY[1] else r.rows[1]:<4} "
                     f"{' '.join(f'{k}={v}' for k, v in r.switches.items()) or '-':<30} {r.when or '-'} -> {r.kernel}"
                     for r in table)


def _check(name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected {' or '.join(map(str, allowed))}, got {value!r}")


class LinearDispatch:
    """y = x W^T (+ bias) for each weight format (model/quant_methods.py's layouts), through `LINEAR`."""

    FORMATS = ("bf16", "fp8-block", "fp8-channel", "nvfp4")

    def __init__(self, gemv: str, quant_gemv: str, pdl: bool):
        _check("gemv_backend", gemv, ("triton", "torch"))
        _check("quant_gemv_backend", quant_gemv, ("cuda", "triton"))
        self.gemv, self.quant_gemv, self.pdl = gemv, quant_gemv, bool(pdl)
        switches = dict(gemv=gemv, quant_gemv=quant_gemv, pdl=self.pdl)
        self.rules = {fmt: rules_for(LINEAR, fmt, switches) for fmt in self.FORMATS}
        self._plain_bf16 = len(self.rules["bf16"]) == 1  # one unconditional rule: F.linear

    def __repr__(self) -> str:
        return f"linear(gemv={self.gemv}, quant_gemv={self.quant_gemv}, pdl={self.pdl})"

    def kernel(self, fmt: str, x: torch.Tensor, w: torch.Tensor, k: int, n: int, block=None, bias=False) -> str:
        """The kernel `LINEAR` gives a call of this format (x as the layer gets it: rows are x's leading ones)."""
        m = x.shape[0] if fmt == "bf16" else x.numel() // max(k, 1)
        return choose(self.rules[fmt], Case(fmt, x, w, m, k, n, block, bias))

    def bf16(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self._plain_bf16:
            return F.linear(x, w, bias)
        if choose(self.rules["bf16"], Case("bf16", x, w, x.shape[0], w.shape[1], w.shape[0],
                                           bias=bias is not None)) == "triton_gemv16":
            from tpserve.kernels.linear import gemv_triton

            return gemv_triton.gemv(x, w, self.pdl)
        return F.linear(x, w, bias)

    def fp8_block(self, x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, block: tuple[int, int],
                  bias: torch.Tensor | None = None) -> torch.Tensor:
        """w float8_e4m3fn [N, K], s float32 block scales [ceil(N/bn), ceil(K/bk)]."""
        lead, k, n = x.shape[:-1], x.shape[-1], w.shape[0]
        x2 = x.reshape(-1, k)
        kernel = choose(self.rules["fp8-block"], Case("fp8-block", x2, w, x2.shape[0], k, n, block))
        if kernel == "cuda_fp8_gemv":
            from tpserve.kernels.quant import gemv_cuda

            y = gemv_cuda.fp8_gemv(x2, w, s.contiguous(), block, pdl=self.pdl)
        elif kernel == "scaled_mm":
            try:
                y = qr.w8a8_block_scaled_mm(x2, w, s)
            except RuntimeError as exc:  # not silent: this torch build refuses the scale layout
                warnings.warn(f"W8A8 blockwise _scaled_mm refused ({str(exc).splitlines()[0]}); using the "
                              "dequantized-weight matmul", RuntimeWarning, stacklevel=3)
                y = F.linear(x2, qr.fp8_block_dequantize(w, s, block, x.dtype))
        else:
            y = _fp8_common(kernel, x2, w, s, block)
        return _finish(y, bias, lead, n)

    def fp8_channel(self, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
        """w float8_e4m3fn [N, K], scale float32 [N] (one per output row: the block (1, K))."""
        lead, k, n = x.shape[:-1], x.shape[-1], w.shape[0]
        x2 = x.reshape(-1, k)
        kernel = choose(self.rules["fp8-channel"], Case("fp8-channel", x2, w, x2.shape[0], k, n, (1, k)))
        if kernel == "dequant":
            y = F.linear(x2, qr.fp8_channel_dequantize(w, scale, x.dtype))
        else:
            y = _fp8_common(kernel, x2, w, scale[:, None], (1, k))
        return _finish(y, bias, lead, n)

    def nvfp4(self, x: torch.Tensor, w: torch.Tensor, bscale: torch.Tensor, scale2: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        """w uint8 [N, K/2] (two e2m1 codes a byte), bscale float8_e4m3fn [N, K/16], scale2 float32 []."""
        lead, k, n = x.shape[:-1], x.shape[-1], w.shape[0]
        x2 = x.reshape(-1, k)
        kernel = choose(self.rules["nvfp4"], Case("nvfp4", x2, w, x2.shape[0], w.shape[1] * 2, n))
        if kernel == "dequant":
            return _finish(F.linear(x2, qr.nvfp4_dequantize(w, bscale, scale2, x.dtype)), bias, lead, n)
        rows2 = scale2.reshape(1).expand(n).contiguous()  # the global scale per output row
        if kernel == "cuda_nvfp4_m1":
            from tpserve.kernels.quant import nvfp4_m1_cuda

            y = nvfp4_m1_cuda.gemv(x2, w, bscale, rows2)
        elif kernel == "cuda_nvfp4_gemv":
            from tpserve.kernels.quant import gemv_cuda

            y = gemv_cuda.nvfp4_gemv(x2, w, bscale, rows2, pdl=self.pdl)
        elif kernel == "triton_gemm":
            from tpserve.kernels.quant import gemm_triton

            y = gemm_triton.w4a16_gemm(x2, w, bscale, rows2)
        else:
            from tpserve.kernels.quant import gemv_nvfp4_triton

            pick = {"triton_nvfp4_row": dict(row=True), "triton_nvfp4_planes": dict(planes=True),
                    "triton_nvfp4_gemv": dict(row=False, planes=False)}[kernel]
            y = gemv_nvfp4_triton.w4a16_gemv(x2, w, bscale, rows2, **pick)
        return _finish(y, bias, lead, n)


def _fp8_common(kernel: str, x2, w, s, block) -> torch.Tensor:
    """The Triton FP8 kernels, block-scaled or per channel (the block (1, K))."""
    if kernel == "triton_gemm":
        from tpserve.kernels.quant import gemm_triton

        return gemm_triton.w8a16_gemm(x2, w, s, block)
    if kernel == "dequant":
        return F.linear(x2, qr.fp8_block_dequantize(w, s, block, x2.dtype))
    from tpserve.kernels.quant import gemv_triton

    return gemv_triton.w8a16_gemv(x2, w, s.contiguous(), block, qtile=kernel == "triton_fp8_qtile")


def _finish(y: torch.Tensor, bias: torch.Tensor | None, lead, n: int) -> torch.Tensor:
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, n)


class ExpertsDispatch:
    """The routed experts of each weight format (model/quant_methods.py's expert layouts) through `EXPERTS`:
    x [T, D], weights / ids [T, k] -> [T, D] in x.dtype."""

    def __init__(self, moe: str, max_tokens: int, quant_gemv: str, route: str, swiglu: Callable,
                 quant_decode: str = "element", quant_decode_fp8: str = "element"):
        _check("moe_backend", moe, ("triton", "torch"))
        _check("moe_route_backend", route, ("triton", "torch"))
        self.moe, self.max_tokens, self.quant_gemv, self.combine = moe, max_tokens, quant_gemv, route
        self.swiglu, self.quant_decode, self.quant_decode_fp8 = swiglu, quant_decode, quant_decode_fp8
        switches = dict(moe=moe, quant_gemv=quant_gemv)
        self.rules = {fmt: rules_for(EXPERTS, fmt, switches) for fmt in ("bf16", "fp8", "nvfp4")}

    def __repr__(self) -> str:
        return (f"experts(moe={self.moe} up to {self.max_tokens} tokens, quant_gemv={self.quant_gemv}, "
                f"route={self.combine}, quant_decode={self.quant_decode} / fp8 {self.quant_decode_fp8})")

    def kernel(self, fmt: str, x: torch.Tensor, inter: int = 0) -> str:
        return choose(self.rules[fmt], Case(fmt, x, None, x.shape[0], x.shape[-1], inter,
                                            max_tokens=self.max_tokens))

    def bf16(self, x, weights, ids, gate_up, down, limit) -> torch.Tensor:
        """gate_up [E, 2I, D] (gate | up), down [E, D, I] in the model dtype."""
        kernel = self.kernel("bf16", x)
        if kernel == "triton_grouped_small":
            from tpserve.kernels.moe import grouped_triton

            return grouped_triton.experts_triton(x, weights, ids, gate_up, down, limit, route_backend=self.combine)
        if kernel == "grouped_mm":
            return moe_ref.experts_grouped(x, weights, ids, gate_up, down, limit, combine=self.combine,
                                           swiglu=self.swiglu)
        return moe_ref.experts_loop(x, weights, ids, gate_up, down, limit)

    def sorted_bf16(self, x, weights, ids, gate_up, down, limit) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`bf16`'s grouped_mm pieces before their combine (moe/ref.experts_sorted: y, order) where `bf16` takes
        grouped_mm, else None (sequence parallelism folds that combine into its reduce-scatter)."""
        if self.kernel("bf16", x) != "grouped_mm":
            return None
        return moe_ref.experts_sorted(x, weights, ids, gate_up, down, limit, self.swiglu)

    def fp8(self, x, weights, ids, gate_up, gu_scale, down, dn_scale, block, limit) -> torch.Tensor:
        """float8_e4m3fn gate_up [E, 2I, D] / down [E, D, I], float32 block scales (gate and up rows stacked)."""
        if self.kernel("fp8", x) == "triton_fp8_experts":
            from tpserve.kernels.quant import gemm_triton

            mode = self.quant_decode_fp8
            return gemm_triton.experts_fp8_triton(x, weights, ids, gate_up, gu_scale, down, dn_scale, block, limit,
                                                  self.combine, qtile=mode != "element", qtile_a=mode == "qtile")
        il, nbi = gate_up.shape[1] // 2, gu_scale.shape[1] // 2

        def gate_up_of(e):
            g = qr.fp8_block_dequantize(gate_up[e, :il], gu_scale[e, :nbi], block, x.dtype)
            u = qr.fp8_block_dequantize(gate_up[e, il:], gu_scale[e, nbi:], block, x.dtype)
            return torch.cat([g, u])

        return moe_ref.experts_loop_fn(x, weights, ids, gate_up.shape[0], gate_up_of,
                                       lambda e: qr.fp8_block_dequantize(down[e], dn_scale[e], block, x.dtype), limit)

    def nvfp4(self, x, weights, ids, layer, limit) -> torch.Tensor:
        """layer: quant_methods.Nvfp4Experts' tensors (gate_up_proj / _bscale / _scale2, down_proj / ...)."""
        kernel = self.kernel("nvfp4", x, layer.down_proj.shape[2] * 2)
        if kernel == "cuda_nvfp4_m1":
            from tpserve.kernels.quant import nvfp4_m1_cuda

            return nvfp4_m1_cuda.experts(x, weights, ids, layer.gate_up_proj, layer.gate_up_bscale,
                                         layer.gate_up_scale2, layer.down_proj, layer.down_bscale, layer.down_scale2,
                                         limit)
        il = layer.gate_up_proj.shape[1] // 2
        row_scale2 = layer.gate_up_scale2.repeat_interleave(il, dim=1)             # [E, 2I]
        if kernel == "triton_nvfp4_experts":
            from tpserve.kernels.quant import gemm_triton

            mode = self.quant_decode
            return gemm_triton.experts_nvfp4_triton(
                x, weights, ids, layer.gate_up_proj, layer.gate_up_bscale, row_scale2.contiguous(), layer.down_proj,
                layer.down_bscale, layer.down_scale2.expand(-1, layer.down_proj.shape[1]).contiguous(), limit,
                self.combine, qtile=mode != "element", qtile_a=mode == "qtile")
        return moe_ref.experts_loop_fn(
            x, weights, ids, layer.gate_up_proj.shape[0],
            lambda e: qr.nvfp4_dequantize(layer.gate_up_proj[e], layer.gate_up_bscale[e], row_scale2[e], x.dtype),
            lambda e: qr.nvfp4_dequantize(layer.down_proj[e], layer.down_bscale[e], layer.down_scale2[e], x.dtype),
            limit)
