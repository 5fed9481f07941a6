"""Resolve what an EngineConfig leaves to `auto`: model directory, device, dtype, kernels."""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from tpserve.config import EngineConfig
from tpserve.kernels.choice import Kernels
from tpserve.model.build import weight_options
from tpserve.paths import cache_dir

log = logging.getLogger("tpserve.setup")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TINY_NAME = "tiny-glm5-next-v1"
DEMO_NAME = "glm5-next-demo"  # src/tpserve/builtin/<DEMO_NAME>: the trained demo checkpoint


@dataclass(frozen=True)
class Runtime:
    model_dir: Path
    device: torch.device
    dtype: torch.dtype
    kernels: Kernels


def builtin_tiny_model() -> Path:
    """The built-in small checkpoint, made with make-tiny on first use (atomically)."""
    target = cache_dir() / TINY_NAME
    if (target / "model.safetensors").is_file():
        return target
    from tpserve.model.tiny import make_tiny

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    make_tiny(tmp, seed=0)
    try:
        tmp.rename(target)
        log.info("made the built-in tiny model at %s", target)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def builtin_demo_model() -> Path | None:
    """The trained demo model shipped inside the package (`tpserve train-demo`), if present."""
    path = Path(__file__).resolve().parent.parent / "builtin" / DEMO_NAME
    return path if (path / "config.json").is_file() else None


def default_model() -> Path:
    """The model used when none is given: the shipped demo model, else the random tiny one.
    `TPSERVE_DEFAULT_MODEL=tiny` picks the random tiny checkpoint."""
    if os.environ.get("TPSERVE_DEFAULT_MODEL", "").strip().lower() != "tiny":
        demo = builtin_demo_model()
        if demo is not None:
            return demo
    return builtin_tiny_model()


def load_model_config(ecfg: EngineConfig, model_dir: str | Path):
    """The checkpoint's ModelConfig with ecfg.hf_overrides applied (and said in the log)."""
    from tpserve.model.config import ModelConfig

    cfg = ModelConfig.from_file(model_dir)
    if ecfg.overrides:
        before = {k: getattr(cfg, k, None) for k in ecfg.overrides}
        cfg = cfg.with_overrides(ecfg.overrides)
        log.warning("model config overridden by hf_overrides: %s", ", ".join(
            f"{k} {before[k]!r} -> {getattr(cfg, k)!r}" for k in sorted(ecfg.overrides)))
    return cfg


def resolve_runtime(ecfg: EngineConfig) -> Runtime:
    model_dir = Path(ecfg.model) if ecfg.model else default_model()
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model: {model_dir} is not a directory (a local checkpoint is needed)")
    if ecfg.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif ecfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for but no CUDA device is available")
    else:
        device = torch.device(ecfg.device)
    if device.type == "cuda":
        triton_cache_env()  # before any kernel module is imported (Triton reads it when a kernel is defined)
    if ecfg.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = DTYPES[ecfg.dtype]
    backend = ecfg.kda_backend
    if backend == "auto":
        from tpserve.kernels.attention.kda_fla import fla_available

        # fla-core's chunk kernel uses TF32 tensor cores (about 1e-3 off a float32 reference), so
        # float32 runs, which exist to be compared token for token, keep the exact torch path
        backend = "fla" if device.type == "cuda" and dtype != torch.float32 and fla_available() else "torch"
    elif backend == "fla" and device.type != "cuda":
        raise ValueError("kda_backend: fla needs a CUDA device (use torch on cpu)")
    indexer = _triton_or_torch("indexer_backend", ecfg.indexer_backend, device)
    indexer_topk = ecfg.indexer_topk_backend  # auto: triton where the decode scores are Triton's
    indexer_topk = (indexer if indexer_topk == "auto"
                    else _triton_or_torch("indexer_topk_backend", indexer_topk, device))
    decode_nvfp4, decode_fp8 = quant_decode(ecfg.quant_decode_backend, device, dtype)
    kernels = Kernels(kda=backend, kda_chunk_indices=ecfg.kda_chunk_indices, kda_short_prefill=ecfg.kda_short_prefill,
                      kda_prep=_triton_or_torch("kda_prep_backend", ecfg.kda_prep_backend, device),
                      mhc=_triton_or_torch("mhc_backend", ecfg.mhc_backend, device),
                      mhc_project=_triton_or_torch("mhc_project_backend", ecfg.mhc_project_backend, device),
                      norm=_triton_or_torch("norm_backend", ecfg.norm_backend, device),
                      act=_triton_or_torch("act_backend", ecfg.act_backend, device),
                      gemv=_triton_or_torch("gemv_backend", ecfg.gemv_backend, device),
                      moe=_triton_or_torch("moe_backend", ecfg.moe_backend, device),
                      moe_triton_max_tokens=ecfg.moe_triton_max_tokens,
                      moe_route=_triton_or_torch("moe_route_backend", ecfg.moe_route_backend, device),
                      quant_decode=decode_nvfp4, quant_decode_fp8=decode_fp8,
                      quant_gemv=quant_gemv(ecfg.quant_gemv_backend, device),
                      indexer=indexer,
                      indexer_topk=indexer_topk,
                      mla_decode=_triton_or_torch("mla_decode_backend", ecfg.mla_decode_backend, device),
                      mla_prefill=ecfg.mla_prefill, prefill_together=ecfg.prefill_together,
                      argmax=_triton_or_torch("argmax_backend", ecfg.argmax_backend, device),
                      pdl=pdl(ecfg.pdl, device),
                      fused_collectives=ecfg.fused_collectives, weights=weight_options(ecfg, device))
    if kernels.indexer_topk == "triton" and kernels.indexer != "triton":
        raise ValueError("indexer_topk_backend: triton works on the Triton decode scores; it needs "
                         "--indexer-backend triton (or auto on cuda)")
    return Runtime(model_dir, device, dtype, kernels)


def triton_cache_env(environ=None) -> dict[str, str]:
    """Triton's compiled kernels and autotuning results kept across restarts: TRITON_CACHE_AUTOTUNING=1 (without it
    Triton tunes again in every process) and TRITON_CACHE_DIR=<cache dir>/triton (one directory to keep with the
    weight snapshots), each unless already set. -> what was set."""
    environ = os.environ if environ is None else environ
    wanted = {"TRITON_CACHE_AUTOTUNING": "1", "TRITON_CACHE_DIR": str(cache_dir() / "triton")}
    added = {k: v for k, v in wanted.items() if k not in environ}
    environ.update(added)
    if added:
        log.info("Triton cache: %s", ", ".join(f"{k}={v}" for k, v in added.items()))
    return added


def quant_decode(value: str, device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    """--quant-decode-backend resolved for (NVFP4, FP8) experts. auto: qtile-b for both on cuda (bf16 /
    float32 activations; the form measured fastest on an H200 at 1 token), else element."""
    if value.startswith("qtile") and dtype == torch.float16:
        raise ValueError(f"quant_decode_backend: {value} decodes to bf16 tiles; float16 activations need element")
    if value == "auto":
        mode = "qtile-b" if device.type == "cuda" and dtype != torch.float16 else "element"
        return mode, mode
    return value, value


def quant_gemv(value: str, device: torch.device) -> str:
    """--quant-gemv-backend resolved: auto is cuda on a CUDA device (kernels/quant/gemv_cuda.py checks at its first call
    that NVRTC builds it there, else warns and the Triton GEMV runs), else triton (whose kernels then fall back to
    the dequantized reference on a device without Triton)."""
    if value == "cuda" and device.type != "cuda":
        raise ValueError("quant_gemv_backend: cuda needs a CUDA device (use triton, or auto)")
    return ("cuda" if device.type == "cuda" else "triton") if value == "auto" else value


def pdl(value: str, device: torch.device) -> bool:
    """--pdl resolved: programmatic dependent launch needs a CUDA device of sm_90 or later and Triton (auto: on
    exactly there)."""
    if value not in ("auto", "on", "off"):
        raise ValueError(f"pdl: expected auto, on or off, got {value!r}")
    supported = (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)
                 and _has_triton())
    if value == "on" and not supported:
        raise ValueError(f"pdl: on needs a CUDA device of compute capability 9.0 or later and Triton (device "
                         f"{device}); use auto or off")
    return supported if value == "auto" else value == "on"


def _triton_or_torch(name: str, choice: str, device: torch.device) -> str:
    if choice == "auto":
        return "triton" if device.type == "cuda" and _has_triton() else "torch"
    if choice == "triton" and device.type != "cuda":
        raise ValueError(f"{name}: triton needs a CUDA device (use torch on cpu)")
    return choice


def _has_triton() -> bool:
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True
