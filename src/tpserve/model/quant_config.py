"""A checkpoint's quantization method: its `quantization_config` (config.json, or ModelOpt's hf_quant_config.json)
read into a QuantConfig, with `--quantization` and `--dense-fp8` applied, and the methods' names. Kept apart from
model/quant.py, which builds the layers, so that the configs can check a method without importing those."""

from __future__ import annotations

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
    method: str = "bf16"                       # bf16 | fp8 | nvfp4
    fp8_block: tuple[int, int] = (128, 128)
    not_convert: tuple[str, ...] = ()          # module names / patterns the checkpoint keeps unquantized
    dense_fp8: bool = False
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    def key(self) -> str:
        return f"{self.method}:{self.fp8_block[0]}x{self.fp8_block[1]}:dense_fp8={self.dense_fp8}"

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
    if qm in ("modelopt", "modelopt_fp4"):
        algo = str(raw.get("quant_algo", "NVFP4")).upper()
        if algo != "NVFP4":
            raise UnsupportedConfigError(f"quantization_config: modelopt quant_algo {algo!r} is not supported "
                                         "(only NVFP4)")
        group = raw.get("group_size", 16)
        if group != 16:
            raise UnsupportedConfigError(f"quantization_config: nvfp4 group_size must be 16, got {group!r}")
        skip = raw.get("exclude_modules") or raw.get("ignore") or raw.get("modules_to_not_convert") or ()
        return QuantConfig("nvfp4", not_convert=tuple(skip), raw=raw)
    raise UnsupportedConfigError(f"quantization_config: quant_method {qm or raw!r} is not supported "
                                 "(supported: fp8 with weight_block_size, modelopt NVFP4)")


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
        qc = QuantConfig(qc.method, qc.fp8_block, qc.not_convert, True, raw=qc.raw)
    return qc
