"""Quantization methods: one object per linear / expert layer owning its weight layout, its
loading (the declared checkpoint tensors and how they shard) and its forward.

Linear methods: `bf16` (unquantized, the model dtype), `fp8` (block-B FP8, DeepSeek/GLM layout),
`nvfp4` (ModelOpt layout), `fp8-channel` (--dense-fp8: a bf16 checkpoint converted at load).
Expert methods: `bf16`, `fp8`, `nvfp4` over fused gate|up [E, 2I, D] and down [E, D, I].
The forwards run the layer's resolved dispatch (`layer.ctx.ops.linear` / `.experts`: kernels/quant/dispatch.py,
one table deciding the kernel for the format and the rows). A tensor-parallel split must not cut a quantization
block (128 rows/cols for FP8, 16 input columns for NVFP4): that raises ValueError naming the layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tpserve.kernels.quant import ref as qr
from tpserve.model.weights import REPLICATED, Shard, add_source, declare

FP8 = torch.float8_e4m3fn
CHUNK_ROWS = 2048
CHUNK_MIN_BYTES = 16 * 2**20


def scale_shard(shard: Shard, full: tuple[int, ...], block: tuple[int, ...], world: int, what: str) -> Shard:
    """The Shard of a block-scale tensor whose weight has shape `full` and Shard `shard`: the same
    dim, cut by blocks. Refuses a split that cuts a block."""
    if shard.dim is None or world == 1:
        return shard if shard.dim is None else Shard(dim=shard.dim, parts=_parts_in_blocks(shard, full, block))
    b = block[shard.dim]
    for p in shard.parts or (full[shard.dim],):
        if p % (b * world):
            raise ValueError(f"{what}: tensor_parallel_size={world} would cut a {b}-wide quantization block "
                             f"(size {p} along dim {shard.dim} is not a multiple of {b} x {world})")
    return Shard(dim=shard.dim, parts=_parts_in_blocks(shard, full, block))


def _parts_in_blocks(shard: Shard, full: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...] | None:
    if not shard.parts:
        return None
    return tuple(-(-p // block[shard.dim]) for p in shard.parts)


class Bf16Linear:
    name = "bf16"

    def create(self, layer: nn.Module, ctx, in_f: int, out_f: int, shard: Shard) -> None:
        declare(layer, "weight", (out_f, in_f), shard, dtype=ctx.dtype, world=ctx.world)

    def forward(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return layer.ctx.ops.linear.bf16(x, layer.weight, bias)

    def dense_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        return layer.weight.to(dtype)

    def after_load(self, layer: nn.Module) -> None:
        pass

    def randomize(self, layer: nn.Module, gen: torch.Generator) -> None:
        pass  # tiny.randomize_ fills the model-dtype weight

    def describe(self) -> str:
        return self.name


class Fp8BlockLinear(Bf16Linear):
    """float8_e4m3fn weight [N, K], float32 weight_scale_inv [ceil(N/bn), ceil(K/bk)]."""

    name = "fp8"

    def __init__(self, block: tuple[int, int] = (128, 128)):
        self.block = tuple(block)

    def create(self, layer, ctx, in_f, out_f, shard):
        what = f"{layer.qualname or type(layer).__name__} (fp8 block {self.block[0]}x{self.block[1]})"
        sshard = scale_shard(shard, (out_f, in_f), self.block, ctx.world, what)
        declare(layer, "weight", (out_f, in_f), shard, dtype=FP8, world=ctx.world)
        sfull = (-(-out_f // self.block[0]), -(-in_f // self.block[1]))
        declare(layer, "weight_scale_inv", sfull, sshard, dtype=torch.float32, world=ctx.world, fp32=True)

    def forward(self, layer, x, bias):
        return layer.ctx.ops.linear.fp8_block(x, layer.weight, layer.weight_scale_inv, self.block, bias)

    def dense_weight(self, layer, dtype):
        return qr.fp8_block_dequantize(layer.weight, layer.weight_scale_inv, self.block, dtype)

    def randomize(self, layer, gen):
        _random_fp8_(layer.weight, gen)
        k = layer.weight.shape[1]
        layer.weight_scale_inv.fill_(1.0 / (k ** 0.5 * 2.0))  # |q| ~ 2: unit-variance outputs

    def describe(self):
        return f"fp8 block {self.block[0]}x{self.block[1]}"


class Nvfp4Linear(Bf16Linear):
    """uint8 weight [N, K/2], float8_e4m3fn weight_scale [N, K/16], float32 weight_scale_2 []. A checkpoint
    with wider groups (`group` 32: weight_scale [N, K/32]) loads each scale into group/16 columns of that
    layout: the same values, exactly, for the same kernels."""

    name = "nvfp4"

    def __init__(self, group: int = qr.NVFP4_GROUP):
        self.group = group

    def create(self, layer, ctx, in_f, out_f, shard):
        g = self.group
        what = f"{layer.qualname or type(layer).__name__} (nvfp4)"
        if in_f % g:
            raise ValueError(f"{what}: input size {in_f} is not a multiple of the nvfp4 group ({g})")
        if shard.dim == 1 and ctx.world > 1 and in_f % (g * ctx.world):
            raise ValueError(f"{what}: tensor_parallel_size={ctx.world} would cut a {g}-wide nvfp4 group "
                             f"(input size {in_f})")
        declare(layer, "weight", (out_f, in_f // 2), shard, dtype=torch.uint8, world=ctx.world)
        declare(layer, "weight_scale", (out_f, in_f // qr.NVFP4_GROUP), shard, dtype=FP8, world=ctx.world)
        if g != qr.NVFP4_GROUP:
            add_source(layer, "weight_scale", (out_f, in_f // g), shard, "weight_scale", (), ctx.world,
                       repeat=g // qr.NVFP4_GROUP)
        declare(layer, "weight_scale_2", (), REPLICATED, dtype=torch.float32, world=ctx.world, fp32=True)

    def forward(self, layer, x, bias):
        return layer.ctx.ops.linear.nvfp4(x, layer.weight, layer.weight_scale, layer.weight_scale_2, bias)

    def dense_weight(self, layer, dtype):
        return qr.nvfp4_dequantize(layer.weight, layer.weight_scale, layer.weight_scale_2, dtype)

    def randomize(self, layer, gen):
        _random_nvfp4_(layer.weight, layer.weight_scale, layer.weight_scale_2, gen)

    def describe(self):
        return self.name if self.group == qr.NVFP4_GROUP else f"{self.name} (group {self.group} read as 16)"


class Fp8ChannelLinear(Bf16Linear):
    """--dense-fp8: loads the model-dtype weight, then converts it to float8_e4m3fn with one float32
    scale per output row (`weight_scale`), in 2048-row chunks for weights over 16 MiB."""

    name = "fp8-channel"

    def after_load(self, layer):
        w = layer.weight
        if w.dtype == FP8:
            return
        q = torch.empty(w.shape, dtype=FP8, device=w.device)
        s = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
        step = CHUNK_ROWS if w.numel() * w.element_size() > CHUNK_MIN_BYTES else w.shape[0]
        for a in range(0, w.shape[0], step):
            q[a:a + step], s[a:a + step] = qr.fp8_channel_quantize(w[a:a + step])
        del layer.weight
        layer.weight = nn.Parameter(q, requires_grad=False)
        layer.weight_scale = nn.Parameter(s, requires_grad=False)

    def forward(self, layer, x, bias):
        if layer.weight.dtype != FP8:
            return F.linear(x, layer.weight, bias)
        return layer.ctx.ops.linear.fp8_channel(x, layer.weight, layer.weight_scale, bias)

    def dense_weight(self, layer, dtype):
        if layer.weight.dtype != FP8:
            return layer.weight.to(dtype)
        return qr.fp8_channel_dequantize(layer.weight, layer.weight_scale, dtype)


def _random_fp8_(t: torch.Tensor, gen: torch.Generator) -> None:
    step = max(1, (1 << 26) // max(1, t[0].numel()))
    for a in range(0, t.shape[0], step):
        piece = t[a:a + step]
        piece.copy_((2.0 * torch.randn(piece.shape, generator=gen, device=t.device)).clamp(-448, 448))


def _random_nvfp4_(w: torch.Tensor, bscale: torch.Tensor, scale2: torch.Tensor, gen: torch.Generator) -> None:
    w.copy_(torch.randint(0, 256, w.shape, generator=gen, device=w.device, dtype=torch.uint8))
    k = w.shape[-1] * 2
    bscale.copy_(torch.full(bscale.shape, 1.0, device=w.device))
    scale2.fill_(1.0 / (k ** 0.5 * 2.5))  # e2m1 codes uniform over 16: rms ~2.5


# ------------------------------------------------------------------ experts
class Bf16Experts:
    """gate_up_proj [E, 2I_local, D] (gate|up), down_proj [E, D, I_local] in the model dtype."""

    name = "bf16"

    def create(self, layer, ctx, e: int, i: int, d: int) -> None:
        il = i // ctx.world
        layer.gate_up_proj = nn.Parameter(torch.empty(e, 2 * il, d, dtype=ctx.dtype), requires_grad=False)
        layer.down_proj = nn.Parameter(torch.empty(e, d, il, dtype=ctx.dtype), requires_grad=False)
        for x in range(e):
            _expert_sources(layer, ctx, x, i, d, il, "weight", "gate_up_proj", "down_proj", (1, 1))

    def forward(self, layer, x, weights, ids):
        return layer.ctx.ops.experts.bf16(x, weights, ids, layer.gate_up_proj, layer.down_proj, layer.limit)

    def randomize(self, layer, gen):
        pass

    def describe(self) -> str:
        return self.name


def _expert_sources(layer, ctx, x: int, i: int, d: int, il: int, suffix: str, gu: str, dn: str,
                    block: tuple[int, int], repeat: int = 1) -> None:
    """Per-expert checkpoint tensors `{x}.{gate,up,down}_proj.<suffix>` into fused rows of `gu`/`dn`.
    block: (rows, cols) of one stored element (1, 1 for weights; the scale block for scales); repeat: see
    weights.Source."""
    br, bc = block
    col = Shard(dim=0)
    rows_i, rows_d, cols_d, cols_i = -(-i // br), -(-d // br), -(-d // bc), -(-i // bc)
    lr = rows_i // ctx.world
    add_source(layer, f"{x}.gate_proj.{suffix}", (rows_i, cols_d), col, gu, (x, slice(0, lr)), ctx.world, repeat)
    add_source(layer, f"{x}.up_proj.{suffix}", (rows_i, cols_d), col, gu, (x, slice(lr, 2 * lr)), ctx.world, repeat)
    add_source(layer, f"{x}.down_proj.{suffix}", (rows_d, cols_i), Shard(dim=1), dn, (x,), ctx.world, repeat)


class Fp8Experts(Bf16Experts):
    name = "fp8"

    def __init__(self, block: tuple[int, int] = (128, 128)):
        self.block = tuple(block)

    def create(self, layer, ctx, e, i, d):
        bn, bk = self.block
        what = f"{layer.qualname or 'experts'} (fp8 block {bn}x{bk})"
        if ctx.world > 1 and (i % (bn * ctx.world) or i % (bk * ctx.world)):
            raise ValueError(f"{what}: tensor_parallel_size={ctx.world} would cut a quantization block "
                             f"(moe_intermediate_size {i} is not a multiple of {max(bn, bk)} x {ctx.world})")
        il = i // ctx.world
        nbi, nbd = -(-il // bn), -(-d // bk)
        layer.gate_up_proj = nn.Parameter(torch.empty(e, 2 * il, d, dtype=FP8), requires_grad=False)
        layer.gate_up_scale = nn.Parameter(torch.empty(e, 2 * nbi, nbd, dtype=torch.float32), requires_grad=False)
        layer.down_proj = nn.Parameter(torch.empty(e, d, il, dtype=FP8), requires_grad=False)
        layer.down_scale = nn.Parameter(torch.empty(e, -(-d // bn), -(-il // bk), dtype=torch.float32),
                                        requires_grad=False)
        for x in range(e):
            _expert_sources(layer, ctx, x, i, d, il, "weight", "gate_up_proj", "down_proj", (1, 1))
            _expert_sources(layer, ctx, x, i, d, il, "weight_scale_inv", "gate_up_scale", "down_scale", self.block)

    def forward(self, layer, x, weights, ids):
        return layer.ctx.ops.experts.fp8(x, weights, ids, layer.gate_up_proj, layer.gate_up_scale, layer.down_proj,
                                         layer.down_scale, self.block, layer.limit)

    def randomize(self, layer, gen):
        for w, s in ((layer.gate_up_proj, layer.gate_up_scale), (layer.down_proj, layer.down_scale)):
            for x in range(w.shape[0]):
                _random_fp8_(w[x], gen)
            s.fill_(1.0 / (w.shape[-1] ** 0.5 * 2.0))

    def describe(self):
        return f"fp8 block {self.block[0]}x{self.block[1]}"


class Nvfp4Experts(Bf16Experts):
    """uint8 [E, rows, cols/2], float8 block scales [E, rows, cols/16], float32 global scales per
    (expert, projection): gate_up_scale2 [E, 2] (gate, up), down_scale2 [E, 1]. Wider stored groups
    (`group` 32) fill group/16 columns per scale, as Nvfp4Linear."""

    name = "nvfp4"

    def __init__(self, group: int = qr.NVFP4_GROUP):
        self.group = group

    def create(self, layer, ctx, e, i, d):
        g, g16 = self.group, qr.NVFP4_GROUP
        what = f"{layer.qualname or 'experts'} (nvfp4)"
        if d % g or i % (g * ctx.world):
            raise ValueError(f"{what}: hidden_size {d} and moe_intermediate_size {i} / tensor_parallel_size "
                             f"{ctx.world} must be multiples of the nvfp4 group ({g})")
        il = i // ctx.world
        p = lambda *s, dt: nn.Parameter(torch.empty(*s, dtype=dt), requires_grad=False)  # noqa: E731
        layer.gate_up_proj = p(e, 2 * il, d // 2, dt=torch.uint8)
        layer.gate_up_bscale = p(e, 2 * il, d // g16, dt=FP8)
        layer.gate_up_scale2 = p(e, 2, dt=torch.float32)
        layer.down_proj = p(e, d, il // 2, dt=torch.uint8)
        layer.down_bscale = p(e, d, il // g16, dt=FP8)
        layer.down_scale2 = p(e, 1, dt=torch.float32)
        for x in range(e):
            # packed bytes: 2 input columns per element; block scales: g input columns per element
            _expert_sources(layer, ctx, x, i, d, il, "weight", "gate_up_proj", "down_proj", (1, 2))
            _expert_sources(layer, ctx, x, i, d, il, "weight_scale", "gate_up_bscale", "down_bscale", (1, g),
                            repeat=g // g16)
            add_source(layer, f"{x}.gate_proj.weight_scale_2", (), REPLICATED, "gate_up_scale2", (x, 0), ctx.world)
            add_source(layer, f"{x}.up_proj.weight_scale_2", (), REPLICATED, "gate_up_scale2", (x, 1), ctx.world)
            add_source(layer, f"{x}.down_proj.weight_scale_2", (), REPLICATED, "down_scale2", (x, 0), ctx.world)

    def forward(self, layer, x, weights, ids):
        return layer.ctx.ops.experts.nvfp4(x, weights, ids, layer, layer.limit)

    def randomize(self, layer, gen):
        _random_nvfp4_(layer.gate_up_proj, layer.gate_up_bscale, layer.gate_up_scale2, gen)
        _random_nvfp4_(layer.down_proj, layer.down_bscale, layer.down_scale2, gen)

    def describe(self):
        return self.name if self.group == qr.NVFP4_GROUP else f"{self.name} (group {self.group} read as 16)"
