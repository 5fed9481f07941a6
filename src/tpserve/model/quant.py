"""Which quantization method each linear / expert layer uses.

The checkpoint's `quantization_config` (config.json, or ModelOpt's hf_quant_config.json) names
the method (`mixed`: ModelOpt MIXED_PRECISION, FP8 and NVFP4 layers side by side); `--quantization`
(vLLM's name) overrides that name. Which layers are quantized is read per tensor from the checkpoint:
a weight stored as float8_e4m3fn with a `weight_scale_inv` beside it is FP8 block, a uint8 weight with
`weight_scale` and `weight_scale_2` is NVFP4, anything else is the model dtype, whatever
`modules_to_not_convert` says. Nothing is upcast silently: a
float8 weight without its scale, or a layout that disagrees with the method, is an error.
"""

from __future__ import annotations

import dataclasses
import logging

from torch import nn

from tpserve.model.errors import UnsupportedConfigError
from tpserve.model.quant_config import QuantConfig
from tpserve.model.quant_methods import (Bf16Experts, Bf16Linear, Fp8BlockLinear, Fp8ChannelLinear, Fp8Experts,
                                         Nvfp4Experts, Nvfp4Linear)

log = logging.getLogger("tpserve.quant")

DEQUANT_AFTER_LOAD = ("kv_b_proj",)  # read as a plain weight by the attention (absorbed into q / out)


# ------------------------------------------------------------------ per-tensor detection
def tensor_layout(info: dict[str, tuple[str, tuple[int, ...]]], prefix: str) -> str:
    """'bf16', 'fp8' or 'nvfp4' for the weight `prefix.weight`, from the stored dtypes and the
    scale tensors beside it. info: internal name -> (safetensors dtype, shape)."""
    w = info.get(prefix + ".weight")
    if w is None:
        return "bf16"
    dtype = w[0]
    if dtype.startswith("F8"):
        if prefix + ".weight_scale_inv" not in info:
            raise UnsupportedConfigError(f"{prefix}.weight: stored as {dtype} without a weight_scale_inv beside it "
                                         "(per-tensor FP8 is not supported)")
        return "fp8"
    if dtype == "U8":
        if prefix + ".weight_scale" not in info or prefix + ".weight_scale_2" not in info:
            raise UnsupportedConfigError(f"{prefix}.weight: stored as uint8 without weight_scale and weight_scale_2 "
                                         "(not an NVFP4 tensor)")
        return "nvfp4"
    return "bf16"


def linear_method(qc: QuantConfig, layout: str):
    if layout == "fp8":
        return Fp8BlockLinear(qc.fp8_block)
    if layout == "nvfp4":
        return Nvfp4Linear(qc.nvfp4_group)
    return Fp8ChannelLinear() if qc.dense_fp8 else Bf16Linear()


def expert_method(qc: QuantConfig, layout: str):
    return {"fp8": lambda: Fp8Experts(qc.fp8_block), "nvfp4": lambda: Nvfp4Experts(qc.nvfp4_group),
            "bf16": Bf16Experts}[layout]()


def _check_method(qc: QuantConfig, layout: str, name: str) -> None:
    if not qc.allows(layout):
        raise UnsupportedConfigError(f"{name}: stored as {layout} but the quantization method is {qc.method} "
                                     "(set --quantization to match the checkpoint)")


def plan_from_checkpoint(model: nn.Module, qc: QuantConfig,
                         info: dict[str, tuple[str, tuple[int, ...]]]) -> tuple[QuantConfig, dict]:
    """(the method, name -> layout for every Linear / Experts module), read from the checkpoint's
    tensors. With no quantization_config the stored layout names the method (fp8 block 128)."""
    from tpserve.model.layers import Linear
    from tpserve.model.moe import Experts

    plan: dict[str, str] = {}
    if qc.method == "bf16":
        found = {tensor_layout(info, n[:-len(".weight")]) for n in info if n.endswith(".weight")} - {"bf16"}
        if len(found) > 1:
            raise UnsupportedConfigError(f"checkpoint mixes quantized layouts {sorted(found)}")
        if found:
            qc = dataclasses.replace(qc, method=found.pop())
            log.info("no quantization_config: the stored tensors are %s", qc.method)
    for name, mod in model.named_modules():
        if isinstance(mod, Linear):
            plan[name] = tensor_layout(info, name)
        elif isinstance(mod, Experts):
            kinds = {tensor_layout(info, f"{name}.{e}.{p}") for e in range(mod.dims[0])
                     for p in ("gate_proj", "up_proj", "down_proj")}
            if len(kinds) > 1:
                raise UnsupportedConfigError(f"{name}: experts stored in mixed layouts {sorted(kinds)}")
            plan[name] = kinds.pop()
        else:
            continue
        _check_method(qc, plan[name], name)
    if qc.method != "bf16" and not any(v != "bf16" for v in plan.values()):
        raise UnsupportedConfigError(f"quantization: method {qc.method} but the checkpoint holds no {qc.method} "
                                     "tensors (quantize it with `tpserve quantize`)")
    if qc.method in ("fp8", "mixed"):
        _check_scale_shapes(info, plan, qc.fp8_block)
    return qc, plan


def _check_scale_shapes(info, plan: dict[str, str], block: tuple[int, int]) -> None:
    for name, layout in plan.items():
        w = info.get(name + ".weight")
        if layout != "fp8" or w is None:
            continue
        want = (-(-w[1][0] // block[0]), -(-w[1][1] // block[1]))
        got = info[name + ".weight_scale_inv"][1]
        if tuple(got) != want:
            raise UnsupportedConfigError(f"{name}.weight_scale_inv: shape {list(got)} does not fit block "
                                         f"{block[0]}x{block[1]} of weight {list(w[1])} (expected {list(want)}; "
                                         "check weight_block_size)")


def plan_for_dummy(model: nn.Module, qc: QuantConfig) -> dict:
    """--load-format dummy: the layout the real checkpoint of this method has. fp8: every linear and
    expert not excluded (as `tpserve quantize` writes it: not linears with fewer outputs than one
    block); nvfp4: the routed experts only (attention, shared experts, router,
    embeddings and lm_head stay in the model dtype)."""
    from tpserve.model.layers import Linear
    from tpserve.model.moe import Experts

    if qc.method == "mixed":
        raise UnsupportedConfigError("load_format dummy: a ModelOpt MIXED_PRECISION checkpoint's layer layouts are "
                                     "read from its tensors; load the checkpoint itself")
    plan: dict[str, str] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, Experts):
            plan[name] = qc.method
        elif isinstance(mod, Linear):
            quantize = (qc.method == "fp8" and not qc.excluded(name) and mod.out_features >= qc.fp8_block[0])
            plan[name] = "fp8" if quantize else "bf16"
    return plan


def apply_plan(model: nn.Module, qc: QuantConfig, plan: dict[str, str]) -> None:
    """Give every Linear / Experts module its method (on a model not yet materialised)."""
    from tpserve.model.layers import Linear

    for name, mod in model.named_modules():
        if name not in plan:
            continue
        if isinstance(mod, Linear):
            method = linear_method(qc, plan[name])
            if plan[name] != "bf16" and name.rsplit(".", 1)[-1] in DEQUANT_AFTER_LOAD:
                method = DequantAfterLoad(method)
            mod.set_quant(method, name)
        else:
            mod.set_quant(expert_method(qc, plan[name]), name)


class DequantAfterLoad:
    """A quantized weight that the model reads as a plain tensor (kv_b_proj, absorbed into the
    attention): loaded in its stored layout, then dequantized once to the model dtype. Logged."""

    def __init__(self, inner):
        self.inner, self.name = inner, f"{inner.name}->dense"

    def create(self, layer, ctx, in_f, out_f, shard):
        self.inner.create(layer, ctx, in_f, out_f, shard)

    def after_load(self, layer):
        if layer.weight.dtype == layer.ctx.dtype:
            return
        dense = self.inner.dense_weight(layer, layer.ctx.dtype)
        for n in ("weight", "weight_scale_inv", "weight_scale", "weight_scale_2"):
            layer._parameters.pop(n, None)
        layer.weight = nn.Parameter(dense, requires_grad=False)
        log.info("%s: %s weight dequantized to %s once at load (the attention absorbs it)", layer.qualname,
                 self.inner.name, layer.ctx.dtype)

    def forward(self, layer, x, bias):
        import torch.nn.functional as F

        return F.linear(x, layer.weight, bias)

    def dense_weight(self, layer, dtype):
        return layer.weight.to(dtype)

    def randomize(self, layer, gen):
        self.inner.randomize(layer, gen)

    def describe(self):
        return self.name
