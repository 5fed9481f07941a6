"""Executors run a StepPlan on every rank: in this process (TP=1) or over worker processes.

The engine picks one by tensor_parallel_size; both size the cache the same way (`cache_budget`).
"""

from __future__ import annotations

import logging
import time

import torch

from tpserve.config import EngineConfig
from tpserve.model.cache import bytes_per_block, bytes_per_slot
from tpserve.engine.runner import CacheShape, Drafted, ModelRunner, StepPlan
from tpserve.kernels.choice import Kernels
from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext
from tpserve.model.plan import ACTIVATION_RESERVE

log = logging.getLogger("tpserve.executor")

CPU_DEFAULT_CACHE = 256 * 2**20


class EngineDeadError(RuntimeError):
    """The engine can no longer run steps (a worker died or a step failed)."""


def cache_budget(ecfg: EngineConfig, cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                 world: int) -> CacheShape:
    """How many blocks, slots and prefix-cache state checkpoints this rank can hold."""
    bs = ecfg.block_size
    if bs % cfg.index_kpool:
        raise ValueError(f"block_size ({bs}) must be a multiple of index_kpool ({cfg.index_kpool})")
    slots = ecfg.max_num_seqs
    per_slot = bytes_per_slot(cfg, world, dtype)
    slot_bytes = slots * per_slot
    if ecfg.kv_cache_memory is not None:
        budget = int(ecfg.kv_cache_memory)
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = cuda_cache_budget(total, free, torch.cuda.memory_reserved(device), ecfg.gpu_memory_utilization)
    else:
        budget = CPU_DEFAULT_CACHE
    per_block = bytes_per_block(cfg, bs, dtype)
    ckpts = checkpoint_count(ecfg, budget - slot_bytes, per_slot)
    if per_block == 0:  # no MLA layer: blocks cost nothing, give every slot a full-length table
        return CacheShape(num_blocks=slots * -(-cfg.max_position_embeddings // bs), num_slots=slots, block_size=bs,
                          num_checkpoints=ckpts)
    blocks = (budget - slot_bytes - ckpts * per_slot) // per_block
    if blocks < 1:
        raise ValueError(f"kv cache budget of {budget / 2**20:.1f} MiB leaves no room for cache blocks after "
                         f"{slot_bytes / 2**20:.1f} MiB of KDA state for max_num_seqs={slots} and "
                         f"{ckpts * per_slot / 2**20:.1f} MiB of prefix-cache state checkpoints; raise "
                         "--kv-cache-memory / --gpu-memory-utilization or lower --max-num-seqs / --prefix-state-memory")
    return CacheShape(num_blocks=int(blocks), num_slots=slots, block_size=bs, num_checkpoints=ckpts)


def cuda_cache_budget(total: int, free: int, own: int, utilization: float) -> int:
    """Cache bytes on a GPU: this process's share (`utilization` of the card, as vLLM's per-instance limit, less
    what it holds already), never more than is free, less the activation reserve. Other processes' memory does not
    shrink the share, so replicas sharing a card each get theirs."""
    return min(int(total * utilization) - own, free) - ACTIVATION_RESERVE


def checkpoint_count(ecfg: EngineConfig, budget: int, per_slot: int) -> int:
    """Prefix caching's KDA state checkpoints: --prefix-state-memory bytes of the cache budget left after the
    running requests' slots, one KDA state per checkpoint. Default: a quarter of it, or up to half of it where a
    quarter holds fewer than two checkpoints per request slot (a conversation in flight keeps one where its
    prompt ended and one where its answer did; fewer, and turns of concurrent conversations evict each other's)."""
    if not ecfg.enable_prefix_caching or per_slot == 0:
        return 0
    default = max(budget // 4, min(2 * ecfg.max_num_seqs * per_slot, budget // 2))
    share = default if ecfg.prefix_state_memory is None else int(ecfg.prefix_state_memory)
    if share > budget:
        raise ValueError(f"prefix_state_memory ({share / 2**20:.1f} MiB) exceeds the cache budget left after the "
                         f"KDA slots ({budget / 2**20:.1f} MiB)")
    return max(share, 0) // per_slot


class LocalExecutor:
    """Tensor parallel size 1: the runner lives in this process."""

    world_size = 1

    def __init__(self, ecfg: EngineConfig, model_dir: str, cfg: ModelConfig, device: torch.device,
                 dtype: torch.dtype, kernels: Kernels):
        t0 = time.perf_counter()
        self.runner = ModelRunner(model_dir, cfg, ShardContext.single(dtype, device), device, kernels,
                                  load_format=ecfg.load_format, mtp=ecfg.speculative is not None)
        t1 = time.perf_counter()
        self.cache_shape = cache_budget(ecfg, self.runner.cache_config, device, dtype, 1)
        self.runner.allocate_cache(self.cache_shape)
        t2 = time.perf_counter()
        spec = ecfg.speculative
        self.runner.setup_graphs(ecfg.max_num_seqs, ecfg.max_model_len, ecfg.enforce_eager,
                                 num_speculative_tokens=0 if spec is None else spec.num_speculative_tokens,
                                 draft_graph=ecfg.draft_graph)
        phases = self.runner.boot_seconds
        log.info("boot: model and weights %.2f s (the model planned on the meta device %.2f s, weights %.2f s, "
                 "kernel self-tests %.2f s), cache %.2f s, graphs %.2f s", t1 - t0, phases.get("plan", 0.0),
                 phases.get("weights", 0.0), phases.get("self_tests", 0.0), t2 - t1, time.perf_counter() - t2)

    def execute(self, plan: StepPlan, prev: torch.Tensor | None = None) -> torch.Tensor:
        return self.runner.execute(plan, prev)

    def commit(self, counts: list[int]) -> None:
        self.runner.commit(counts)

    def draft(self, plan: StepPlan, source_rows: list[int], from_main: bool, depths: int = 1) -> Drafted:
        return self.runner.draft(plan, source_rows, from_main, depths)

    def chain_depths(self, plan: StepPlan | None = None) -> int:
        return self.runner.chain_depths(plan)

    def spec_step_limits(self) -> tuple[int, int]:
        return self.runner.spec_step_limits()

    def execute_spec(self, plan: StepPlan, while_waiting=None):
        return self.runner.execute_spec(plan, while_waiting)

    def verify_graph_batch(self) -> int | None:
        return self.runner.verify_graph_batch()

    def check_alive(self) -> None:
        pass

    def shutdown(self) -> None:
        self.runner.close()
