"""`tpserve quantize SRC DST --method fp8|nvfp4`: write a quantized copy of a bf16/fp32 checkpoint.

fp8: every linear layer's weight (attention, indexer, dense MLP, shared and routed experts; not
those with fewer outputs than one block, listed in modules_to_not_convert) as
float8_e4m3fn + float32 `weight_scale_inv` [ceil(N/B), ceil(K/B)]; config.json gets
`quantization_config = {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic,
weight_block_size: [B, B]}` (the DeepSeek / GLM layout). nvfp4: the routed experts only, in NVIDIA
ModelOpt's layout (uint8 weight [N, K/2] low nibble first, float8_e4m3fn `weight_scale` [N, K/16],
float32 scalars `weight_scale_2` and `input_scale`), config.json `quantization_config =
{quant_method: modelopt, quant_algo: NVFP4, group_size: 16, exclude_modules: [...]}` and
hf_quant_config.json. Embeddings, norms, router, mHC and lm_head are copied unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

SHARD_BYTES = 4 << 30


def register(sub, bench, tune) -> None:
    p = sub.add_parser("quantize", help="write an fp8 or nvfp4 copy of a checkpoint")
    p.add_argument("src", help="bf16 / fp32 checkpoint directory")
    p.add_argument("dst", help="output directory (must not exist, or be empty)")
    p.add_argument("--method", required=True, choices=("fp8", "nvfp4"))
    p.add_argument("--block", type=int, default=128, help="fp8 block size (default 128: the DeepSeek / GLM layout)")
    p.set_defaults(func=_main)


def _main(args) -> int:
    out = quantize_checkpoint(args.src, args.dst, args.method, block=args.block, progress=True)
    print(f"wrote {args.method} checkpoint to {out}")
    return 0


def _targets(src: Path, method: str, block: int) -> tuple[set[str], list[str]]:
    """Internal names of the weights to quantize, and the checkpoint module names left unquantized
    (fp8: linears with fewer than `block` outputs, e.g. KDA's b_proj: a tensor-parallel split would cut
    their one block; nvfp4: every linear, only the routed experts are 4-bit)."""
    from tpserve.model.build import quant_modules
    from tpserve.model.config import ModelConfig
    from tpserve.model.glm5_next import Glm5NextModel
    from tpserve.model.layers import Linear, ShardContext
    from tpserve.model.loader import checkpoint_name
    from tpserve.model.weights import checkpoint_sources

    cfg = ModelConfig.from_file(src)
    with torch.device("meta"):
        model = Glm5NextModel(ShardContext.single(torch.float32, "meta"), cfg)
    chosen, kept = set(), []
    for name, mod in quant_modules(model):
        expert = not isinstance(mod, Linear)
        if expert or method == "fp8" and mod.out_features >= block:
            chosen.update(f"{name}.{n}" for n in checkpoint_sources(mod))
        else:
            kept.append(checkpoint_name(f"{name}.weight")[:-len(".weight")])
    return chosen, kept


def quantize_checkpoint(src: str | Path, dst: str | Path, method: str, *, block: int = 128,
                        progress: bool = False) -> Path:
    from safetensors import safe_open
    from tqdm import tqdm

    from tpserve.kernels.quant import ref as qr
    from tpserve.model.config import ModelConfig
    from tpserve.model.loader import checkpoint_files, internal_name

    src, dst = Path(src), Path(dst)
    if method not in ("fp8", "nvfp4"):
        raise ValueError(f"method: {method!r} is not supported (fp8 or nvfp4)")
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"dst: {dst} exists and is not empty")
    raw = json.loads((src / "config.json").read_text())
    if raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config"):
        raise ValueError(f"src: {src} is already quantized")
    cfg = ModelConfig.from_file(src)
    chosen, kept = _targets(src, method, block)
    dst.mkdir(parents=True, exist_ok=True)
    files = checkpoint_files(src)
    writer = _ShardWriter(dst)
    total = sum(f.stat().st_size for f in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"quantize {method}", disable=not progress) as bar:
        for path in files:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    t = f.get_tensor(name)
                    internal = internal_name(name, cfg.num_hidden_layers)
                    if internal in chosen and t.dim() == 2:
                        base = name[:-len(".weight")]
                        if method == "fp8":
                            q, s = qr.fp8_block_quantize(t, (block, block))
                            writer.add(name, q)
                            writer.add(base + ".weight_scale_inv", s)
                        else:
                            q, bs, s2 = qr.nvfp4_quantize(t)
                            writer.add(name, q)
                            writer.add(base + ".weight_scale", bs)
                            writer.add(base + ".weight_scale_2", s2)
                            writer.add(base + ".input_scale", torch.tensor(1.0, dtype=torch.float32))
                    else:
                        writer.add(name, t)
                    bar.update(t.numel() * t.element_size())
    writer.close()
    if method == "fp8":
        qcfg = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [block, block], "modules_to_not_convert": ["lm_head"] + kept}
    else:
        qcfg = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                "exclude_modules": ["lm_head"] + kept, "kv_cache_quant_algo": None}
        hf = {"producer": {"name": "tpserve", "version": "quantize"},
              "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": qcfg["exclude_modules"],
                               "kv_cache_quant_algo": None}}
        (dst / "hf_quant_config.json").write_text(json.dumps(hf, indent=2) + "\n")
    raw["quantization_config"] = qcfg
    (dst / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for other in src.iterdir():
        if other.is_file() and not other.name.endswith(".safetensors") and other.name not in (
                "config.json", "model.safetensors.index.json", "hf_quant_config.json"):
            shutil.copy2(other, dst / other.name)
    return dst


class _ShardWriter:
    """Tensors into model.safetensors, or model-0000i-of-0000n.safetensors + index past SHARD_BYTES."""

    def __init__(self, dst: Path):
        self.dst, self.pending, self.size, self.files, self.weight_map = dst, {}, 0, [], {}

    def add(self, name: str, t: torch.Tensor) -> None:
        self.pending[name] = t.contiguous()
        self.size += t.numel() * t.element_size()
        if self.size >= SHARD_BYTES:
            self._flush()

    def _flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        path = self.dst / f".part-{len(self.files):05d}.safetensors"
        save_file(self.pending, str(path), metadata={"format": "pt"})
        self.files.append((path, list(self.pending)))
        self.pending, self.size = {}, 0

    def close(self) -> None:
        self._flush()
        if len(self.files) == 1:
            self.files[0][0].rename(self.dst / "model.safetensors")
            return
        n = len(self.files)
        for i, (path, names) in enumerate(self.files):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            path.rename(self.dst / final)
            self.weight_map.update({k: final for k in names})
        index = {"metadata": {}, "weight_map": self.weight_map}
        (self.dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def dequantize_checkpoint(src: str | Path, dst: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """The inverse for tests and the oracle: a quantized checkpoint -> a plain one whose weights are
    the exact dequantized values (fp32 products of the stored values), no quantization_config."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from tpserve.kernels.quant import ref as qr
    from tpserve.model.loader import checkpoint_files

    src, dst = Path(src), Path(dst)
    raw = json.loads((src / "config.json").read_text())
    qc = raw.pop("quantization_config", None) or {}
    block = tuple(qc.get("weight_block_size", (128, 128)))
    tensors: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(src):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    out = {}
    for name, t in tensors.items():
        if name.endswith((".weight_scale_inv", ".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        base = name[:-len(".weight")] if name.endswith(".weight") else None
        if t.dtype == torch.float8_e4m3fn and base and base + ".weight_scale_inv" in tensors:
            t = qr.fp8_block_dequantize(t, tensors[base + ".weight_scale_inv"], block, dtype)
        elif t.dtype == torch.uint8 and base and base + ".weight_scale" in tensors:
            t = qr.nvfp4_dequantize(t, tensors[base + ".weight_scale"], tensors[base + ".weight_scale_2"], dtype)
        out[name] = t.to(dtype) if t.is_floating_point() else t
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for other in src.iterdir():
        if other.is_file() and not other.name.endswith(".safetensors") and other.name not in (
                "config.json", "model.safetensors.index.json", "hf_quant_config.json"):
            shutil.copy2(other, dst / other.name)
    return dst
