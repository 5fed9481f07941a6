"""Build one rank's model with its weights: choose each layer's quantization method, then restore a
processed-weight snapshot or load (or randomise) and process the weights, and write the snapshot.

The model is first built on the meta device, so choosing a quantized layout never allocates the
unquantized one; `to_empty` then allocates each parameter once, on the target device.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from torch import nn

from tpserve.kernels.choice import Kernels
from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext
from tpserve.model.quant import apply_plan, plan_for_dummy, plan_from_checkpoint
from tpserve.model.quant_config import QuantConfig, read_quant_config

log = logging.getLogger("tpserve.build")


def quant_modules(model: nn.Module):
    for name, mod in model.named_modules():
        if hasattr(mod, "quant") and hasattr(mod, "set_quant"):
            yield name, mod


def plan_model(model_dir: str | Path, cfg: ModelConfig, ctx: ShardContext, kernels: Kernels,
               load_format: str = "auto", mtp: bool = False) -> tuple[nn.Module, QuantConfig, dict[str, str]]:
    """The model on the meta device, every Linear / Experts given its method; with `mtp` the MTP
    drafter (model/mtp.py) is attached as `model.mtp` and loaded from layer num_hidden_layers. The ops its modules
    run are resolved here, once, from `kernels` (kernels/registry.py; the model's `ctx.ops`)."""
    from tpserve.model.glm5_next import Glm5NextModel
    from tpserve.model.loader import tensor_info

    opts = kernels.weights
    qc = read_quant_config(model_dir, opts.quantization, opts.dense_fp8)
    ctx = ctx.with_kernels(kernels)
    with torch.device("meta"):
        model = Glm5NextModel(ctx, cfg)
        if mtp:
            from tpserve.model.mtp import MtpLayer

            model.mtp = MtpLayer(ctx, cfg)
    if load_format == "dummy":
        plan = plan_for_dummy(model, qc)
    else:
        qc, plan = plan_from_checkpoint(model, qc, tensor_info(model_dir, cfg.num_hidden_layers, mtp))
    with torch.device("meta"):
        apply_plan(model, qc, plan)
    return model, qc, plan


@torch.no_grad()
def finish_loading(model: nn.Module) -> None:
    """Per-layer processing after the checkpoint tensors are in (e.g. --dense-fp8 conversion)."""
    for _, mod in quant_modules(model):
        after = getattr(mod.quant, "after_load", None)
        if after is not None:
            after(mod)


@torch.no_grad()
def randomize_quantized_(model: nn.Module, seed: int) -> None:
    gen = None
    for _, mod in quant_modules(model):
        p = next(mod.parameters())
        if gen is None or gen.device != p.device:
            gen = torch.Generator(p.device).manual_seed(seed)
        mod.quant.randomize(mod, gen)


def build_model(model_dir: str | Path, cfg: ModelConfig, ctx: ShardContext, device: torch.device,
                kernels: Kernels, *, load_format: str = "auto", progress: bool | None = None,
                seed: int = 1234, mtp: bool = False, timings: dict | None = None) -> nn.Module:
    """The model on `device` with its weights processed. `timings` (when given) gets the seconds of its phases:
    "plan" (the model on the meta device, the memory plan, the snapshot key) and "weights" (the snapshot restored,
    or the checkpoint loaded, or random weights made, and processed; a first boot's snapshot write included)."""
    from tpserve.model import merged
    from tpserve.model.loader import load_weights
    from tpserve.model.snapshot import SnapshotStore

    timings = {} if timings is None else timings
    t0 = time.perf_counter()
    model, qc, plan = plan_model(model_dir, cfg, ctx, kernels, load_format, mtp)
    opts = kernels.weights
    if device.type == "cuda":  # the plan per rank, checked before anything is allocated
        from tpserve.model.plan import ACTIVATION_RESERVE, memory_plan

        mplan = memory_plan(model, cfg, rank=ctx.rank, world=ctx.world, dtype=ctx.dtype,
                            device_bytes=torch.cuda.get_device_properties(device).total_memory,
                            utilization=opts.gpu_memory_utilization, activation_bytes=ACTIVATION_RESERVE,
                            block_size=opts.block_size)
        log.warning("memory plan (%s weights): %s", qc.method, mplan.describe())
        mplan.check()
    groups = merged.plan(model) if opts.merge_linears else []
    store = key = None
    if opts.snapshot:
        store = SnapshotStore(opts.snapshot_dir)
        key = store.key(model_dir, cfg, ctx, qc, plan, merged=bool(groups),
                        dummy_seed=seed if load_format == "dummy" else None)
    timings["plan"] = time.perf_counter() - t0
    if store is not None and store.restore(model, key, ctx.rank, ctx.world, device):
        log.warning("rank %d: weights restored from snapshot %s", ctx.rank, store.entry_dir(key).name)
        merged.merge(groups)
        prepare_runtime(model)
        timings["weights"] = time.perf_counter() - t0 - timings["plan"]
        return model.eval()
    model.to_empty(device=device)
    if load_format == "dummy":
        from tpserve.model.tiny import randomize_

        randomize_(model, seed=seed + ctx.rank)
        randomize_quantized_(model, seed=seed + ctx.rank)
    else:
        load_weights(model, model_dir, rank=ctx.rank, world=ctx.world, num_layers=cfg.num_hidden_layers,
                     progress=progress, mtp=mtp)
    finish_loading(model)
    merged.merge(groups)
    if store is not None:
        store.write(model, key, ctx.rank, ctx.world)
    prepare_runtime(model)
    timings["weights"] = time.perf_counter() - t0 - timings["plan"]
    return model.eval()


def prepare_runtime(model: nn.Module) -> None:
    """Derived tensors the kernels read, made once the weights are final (not weights: never in a snapshot)."""
    for mod in model.modules():
        if hasattr(mod, "prepare_runtime"):
            mod.prepare_runtime()


def weight_options(ecfg, device: torch.device):
    """EngineConfig -> WeightOptions (snapshots default on for cuda, off on cpu and for random weights)."""
    from tpserve.kernels.choice import WeightOptions

    snapshot = ecfg.snapshot
    if snapshot is None:
        snapshot = device.type == "cuda" and ecfg.load_format != "dummy"
    return WeightOptions(quantization=ecfg.quantization, dense_fp8=ecfg.dense_fp8,
                         snapshot=bool(snapshot), snapshot_dir=ecfg.snapshot_dir,
                         gpu_memory_utilization=ecfg.gpu_memory_utilization, block_size=ecfg.block_size,
                         merge_linears=ecfg.merge_linears)
