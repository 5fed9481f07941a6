"""A checkpoint's quantization method: its `quantization_config` (config.json, or ModelOpt's hf_quant_config.json)
read into a QuantConfig, with `--quantization` and `--dense-fp8` applied, and the methods' names. Kept apart from
model/quant.py, which builds the layers, so that the configs can check a method without importing those."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpserve.config import quantization_method
from tpserve.model.errors import UnsupportedConfigError


def method_name(name: str, what: str = "quantization") -> str:
    try:
        return quantization_method(name, what)
    except ValueError as e:
        raise UnsupportedConfigError(str(e)) from None


@dataclass(frozen=True)
class QuantConfig:
    method: str = "bf16"                       # bf16 | fp8 | nvfp4 | mixed (fp8 and nvfp4 layers, per tensor)
    fp8_block: tuple[int, int] = (128, 128)
    not_convert: tuple[str, ...] = ()          # module names / patterns the checkpoint keeps unquantized
    dense_fp8: bool = False
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    nvfp4_group: int = 16                      # input columns per stored nvfp4 block scale

    def key(self) -> str:
        group = "" if self.nvfp4_group == 16 else f":g{self.nvfp4_group}"
        return f"{self.method}:{self.fp8_block[0]}x{self.fp8_block[1]}:dense_fp8={self.dense_fp8}{group}"

    def allows(self, layout: str) -> bool:
        """Whether a layer stored as `layout` fits this method."""
        return layout == "bf16" or layout == self.method or self.method == "mixed" and layout in ("fp8", "nvfp4")

    def excluded(self, module: str) -> bool:
        return any(module == p or module.endswith("." + p) or fnmatch.fnmatch(module, p) for p in self.not_convert)


def parse_quant_config(raw: dict[str, Any] | None) -> QuantConfig:
    """A checkpoint's quantization_config (or hf_quant_config.json) -> QuantConfig."""
    if not raw:
        return QuantConfig()
    if "quantization" in raw and isinstance(raw["quantization"], dict):  # ModelOpt hf_quant_config.json
        raw = {"quant_method": "modelopt", **raw["quantization"]}
    qm = str(raw.get("quant_method", "")).lower()
    if qm == "fp8":
        block = raw.get("weight_block_size")
        if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0
                                                                          for b in block)):
            raise UnsupportedConfigError(f"quantization_config: fp8 needs weight_block_size [bn, bk] (block-wise "
                                         f"FP8); got {block!r} (per-tensor FP8 is not supported)")
        skip = raw.get("modules_to_not_convert") or raw.get("ignored_layers") or ()
        return QuantConfig("fp8", tuple(block), tuple(skip), raw=raw)
    if qm in ("modelopt", "modelopt_fp4", "modelopt_mixed"):
        algo = str(raw.get("quant_algo", "NVFP4")).upper()
        skip = tuple(raw.get("exclude_modules") or raw.get("ignore") or raw.get("modules_to_not_convert") or ())
        if algo == "MIXED_PRECISION":
            return _mixed(raw, skip)
        if algo != "NVFP4":
            raise UnsupportedConfigError(f"quantization_config: modelopt quant_algo {algo!r} is not supported "
                                         "(NVFP4 or MIXED_PRECISION)")
        group = raw.get("group_size") or _weights_group(raw) or 16
        return QuantConfig("nvfp4", not_convert=skip, raw=raw, nvfp4_group=_nvfp4_group(group))
    raise UnsupportedConfigError(f"quantization_config: quant_method {qm or raw!r} is not supported "
                                 "(supported: fp8 with weight_block_size, modelopt NVFP4 or MIXED_PRECISION)")


# ModelOpt's per-layer algorithms of a MIXED_PRECISION checkpoint that tpserve reads (NVFP4 weights run as W4A16)
_MIXED_ALGOS = {"NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "FP8_PB_WO": "fp8"}


def _mixed(raw: dict[str, Any], skip: tuple[str, ...]) -> QuantConfig:
    """ModelOpt MIXED_PRECISION: `quantized_layers` names each quantized module's algorithm (block FP8 128x128
    weight-only, NVFP4 with its group size); the layers' layouts are read from their tensors."""
    layers = raw.get("quantized_layers")
    if not isinstance(layers, dict) or not layers:
        raise UnsupportedConfigError("quantization_config: MIXED_PRECISION without quantized_layers")
    groups = set()
    for name, entry in layers.items():
        algo = str((entry or {}).get("quant_algo", "")).upper()
        if algo not in _MIXED_ALGOS:
            raise UnsupportedConfigError(f"quantization_config.quantized_layers.{name}: quant_algo {algo!r} is not "
                                         f"supported (supported: {', '.join(_MIXED_ALGOS)})")
        if _MIXED_ALGOS[algo] == "nvfp4":
            groups.add(entry.get("group_size", 16))
    if len(groups) > 1:
        raise UnsupportedConfigError(f"quantization_config.quantized_layers: nvfp4 group sizes {sorted(groups)} "
                                     "differ (one group size per checkpoint)")
    return QuantConfig("mixed", not_convert=skip, raw=raw, nvfp4_group=_nvfp4_group(groups.pop() if groups else 16))


def _weights_group(raw: dict[str, Any]) -> int | None:
    """The weights' group_size in a ModelOpt config_groups section, if any."""
    for group in (raw.get("config_groups") or {}).values():
        size = ((group or {}).get("weights") or {}).get("group_size")
        if size:
            return size
    return None


def _nvfp4_group(group: Any) -> int:
    if not isinstance(group, int) or isinstance(group, bool) or group < 16 or group % 16:
        raise UnsupportedConfigError(f"quantization_config: nvfp4 group_size must be a multiple of 16, got {group!r}")
    return group


def read_quant_config(model_dir: str | Path, override: str | None = None, dense_fp8: bool = False) -> QuantConfig:
    """The checkpoint's method, with --quantization and --dense-fp8 applied."""
    model_dir = Path(model_dir)
    raw: dict[str, Any] = {}
    cfg_file = model_dir / "config.json"
    if cfg_file.is_file():
        data = json.loads(cfg_file.read_text())
        raw = data.get("quantization_config") or (data.get("text_config") or {}).get("quantization_config") or {}
    hf = model_dir / "hf_quant_config.json"
    if not raw and hf.is_file():
        raw = json.loads(hf.read_text())
    qc = parse_quant_config(raw)
    if override:
        want = method_name(override)
        if qc.method != "bf16" and want != qc.method:
            raise UnsupportedConfigError(f"quantization: --quantization {override} but the checkpoint is "
                                         f"{qc.method} (its quantization_config says so)")
        if want != qc.method:
            qc = QuantConfig(want, qc.fp8_block, qc.not_convert, raw=qc.raw)
    if dense_fp8:
        qc = dataclasses.replace(qc, dense_fp8=True)
    return qc
