"""Load a safetensors checkpoint (one file, or shards with an index) into a tpserve model.

Names are the ones transformers 5.23.0 writes for Glm5NextForConditionalGeneration
(`model.language_model.*`, `lm_head.weight`; per-expert `experts.{e}.*_proj`, `q/k/v_conv1d`,
`hc_attn_fn` ...); flat text-only checkpoints (`model.*`) load too. Vision tensors and layers
past num_hidden_layers (the MTP layer) are skipped unless the MTP drafter is built
(speculative decoding), which takes layer num_hidden_layers as `mtp.*` in the published layout (no hc_*
tensors: model/mtp.py; docs/checkpoints.md). A missing, unexpected or mis-shaped tensor raises
CheckpointError naming it. Each rank reads only its own slices.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from tpserve.model.weights import checkpoint_sources

_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
_SKIP = re.compile(r"^(model\.visual\.|visual\.|model\.vision|mtp\.)|\.rotary_emb\.|\.shared_head\.")
_HC = re.compile(r"\.hc_(attn|ffn)_(fn|base|scale)$")
_LAYER = re.compile(r"^layers\.(\d+)\.")
_IGNORED_SUFFIXES = (".input_scale",)  # ModelOpt activation scales: W4A16 keeps activations in 16 bits
_QUANT_DTYPES = (torch.float8_e4m3fn, torch.uint8)
PROGRESS_BYTES = 1 << 28  # show a progress bar from 256 MiB


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model (the message names the tensor)."""


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{index.name}: unreadable index ({exc})") from None
        files = sorted({model_dir / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index.name} names shard(s) that do not exist: {missing}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if found:
        return found
    raise CheckpointError(f"no safetensors checkpoint in {model_dir}")


def internal_name(name: str, num_layers: int, mtp: bool = False) -> str | None:
    """Checkpoint name -> model parameter name, or None for tensors tpserve skips. With `mtp`, layer
    `num_layers` (the MTP drafter) maps to `mtp.*`, less its copies of the shared embedding / head."""
    full = name
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    m = _LAYER.match(name)
    if mtp and m and int(m.group(1)) == num_layers:
        rest = name[m.end():]
        if rest.startswith(("embed_tokens.", "shared_head.head.")):
            return None
        if _HC.search("." + rest):
            raise CheckpointError(old_mtp_layout(full, num_layers))
        return "mtp." + rest
    if _SKIP.search(full):
        return None
    if name == "lm_head.weight":
        return name
    if m and int(m.group(1)) >= num_layers:
        return None
    return _HC.sub(lambda mm: f".{mm.group(1)}_hc.{mm.group(2)}", name)


def old_mtp_layout(name: str, num_layers: int) -> str:
    """The error for an MTP layer with mHC tensors (the layout tpserve's demo model was first trained in)."""
    return (f"{name}: the MTP layer (layer {num_layers}) is in the pre-release mHC layout; speculative decoding "
            "needs the published layout, whose MTP layer has no hc_* tensors. Retrain the model with "
            "`tpserve train-demo` for a current checkpoint, or serve this one without speculative_config")


def checkpoint_name(internal: str, num_layers: int | None = None) -> str:
    """Model parameter name -> the name transformers writes (for messages and make-tiny); the MTP
    drafter's `mtp.*` is layer `num_layers`."""
    if internal == "lm_head.weight":
        return internal
    if num_layers is not None and internal.startswith("mtp."):
        internal = f"layers.{num_layers}." + internal[len("mtp."):]
    internal = re.sub(r"\.(attn|ffn)_hc\.(fn|base|scale)$", lambda m: f".hc_{m.group(1)}_{m.group(2)}", internal)
    return "model.language_model." + internal


def load_weights(model: nn.Module, model_dir: str | Path, *, rank: int = 0, world: int = 1,
                 num_layers: int, progress: bool | None = None, mtp: bool = False) -> None:
    sources = checkpoint_sources(model)
    files = checkpoint_files(model_dir)
    total = sum(f.stat().st_size for f in files)
    show = total >= PROGRESS_BYTES if progress is None else progress
    seen: set[str] = set()
    unexpected: list[str] = []
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"loading weights (rank {rank})",
              disable=not show) as bar:
        for path in files:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    target_name = internal_name(name, num_layers, mtp)
                    if target_name is None:
                        continue
                    if target_name not in sources:
                        if not target_name.endswith(_IGNORED_SUFFIXES):
                            unexpected.append(name)
                        continue
                    module, src = sources[target_name]
                    piece = f.get_slice(name)
                    shape = tuple(piece.get_shape())
                    if shape != src.full_shape and not (src.full_shape == () and shape == (1,)):
                        raise CheckpointError(f"{name}: shape {list(shape)} does not match the config, "
                                              f"expected {list(src.full_shape)}")
                    local = src.shard.take(piece, rank, world, shape)
                    if src.full_shape == () and shape == (1,):
                        local = local.reshape(())
                    nbytes = local.numel() * local.element_size() * world
                    if src.repeat > 1:
                        local = local.repeat_interleave(src.repeat, dim=-1)
                    target = getattr(module, src.target)[src.index]
                    if tuple(target.shape) != tuple(local.shape):
                        raise CheckpointError(f"{name}: rank {rank} piece {list(local.shape)} does not fit "
                                              f"{list(target.shape)}")
                    _check_dtype(name, local.dtype, target.dtype)
                    with torch.no_grad():
                        target.copy_(local)
                    seen.add(target_name)
                    bar.update(nbytes)
    if unexpected:
        raise CheckpointError(f"unexpected tensor(s) in checkpoint: {_few(unexpected)}")
    missing = sorted(set(sources) - seen)
    if missing:
        names = [checkpoint_name(m, num_layers) for m in missing]
        raise CheckpointError(f"missing tensor(s) in checkpoint: {_few(names)}")


def _check_dtype(name: str, stored: torch.dtype, target: torch.dtype) -> None:
    """Quantized tensors go only into parameters of the same dtype: never silently upcast or cast."""
    if (stored in _QUANT_DTYPES or target in _QUANT_DTYPES) and stored != target:
        raise CheckpointError(f"{name}: stored as {stored} but the layer expects {target} (a quantized tensor is "
                              "never converted silently; check --quantization)")


def tensor_info(model_dir: str | Path, num_layers: int, mtp: bool = False) -> dict[str, tuple[str, tuple[int, ...]]]:
    """internal name -> (safetensors dtype, shape) for every tensor tpserve reads (headers only)."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                internal = internal_name(name, num_layers, mtp)
                if internal is not None:
                    s = f.get_slice(name)
                    out[internal] = (s.get_dtype(), tuple(s.get_shape()))
    return out


def _few(names: list[str], n: int = 5) -> str:
    names = sorted(names)
    more = f" ... and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more
