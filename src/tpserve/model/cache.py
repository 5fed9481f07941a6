"""The cache tensors this model reads: their sizes per block and per state slot, and their allocation
(MLA latent and indexer rows in blocks, KDA recurrent and conv states in slots)."""

from __future__ import annotations

import torch

from tpserve.model.batch import CacheTensors
from tpserve.model.config import ModelConfig
from tpserve.model.h2d import to_device


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    item = torch.empty((), dtype=dtype).element_size()
    per_token = len(cfg.mla_layers) * cfg.kv_lora_rank
    full = [i for i in cfg.mla_layers if cfg.indexer_is_full(i)]
    per_token += len(full) * 2 * cfg.index_head_dim
    per_pool = len(full) * cfg.index_head_dim
    return item * (block_size * per_token + (block_size // cfg.index_kpool) * per_pool)


def bytes_per_slot(cfg: ModelConfig, world: int, dtype: torch.dtype) -> int:
    heads = cfg.linear_num_heads // world
    item = torch.empty((), dtype=dtype).element_size()
    state = heads * cfg.linear_head_dim * cfg.linear_head_dim * 4
    conv = 3 * heads * cfg.linear_head_dim * (cfg.linear_conv_kernel_dim - 1) * item
    return len(cfg.kda_layers) * (state + conv)


def allocate_cache(cfg: ModelConfig, *, num_blocks: int, block_size: int, num_slots: int, world: int,
                   dtype: torch.dtype, device: torch.device) -> CacheTensors:
    if block_size % cfg.index_kpool:
        raise ValueError(f"block_size ({block_size}) must be a multiple of index_kpool ({cfg.index_kpool})")
    cache = CacheTensors(block_size=block_size)
    zeros = lambda *shape, dt=dtype: torch.zeros(shape, dtype=dt, device=device)  # noqa: E731
    for i in cfg.mla_layers:
        cache.latent[i] = zeros(num_blocks, block_size, cfg.kv_lora_rank)
        if cfg.indexer_is_full(i):
            cache.index_k[i] = zeros(num_blocks, block_size, cfg.index_head_dim)
            cache.index_gate[i] = zeros(num_blocks, block_size, cfg.index_head_dim)
            cache.pool_k[i] = zeros(num_blocks, block_size // cfg.index_kpool, cfg.index_head_dim)
    heads, kda = cfg.linear_num_heads // world, list(cfg.kda_layers)
    if kda:  # one tensor per kind, layer-major: each layer's [slots, ...] view is contiguous
        cache.kda_stack = zeros(len(kda), num_slots, heads, cfg.linear_head_dim, cfg.linear_head_dim,
                                dt=torch.float32)
        cache.conv_stack = zeros(len(kda), num_slots, 3 * heads * cfg.linear_head_dim, cfg.linear_conv_kernel_dim - 1)
    for j, i in enumerate(kda):
        cache.kda_state[i], cache.conv_state[i] = cache.kda_stack[j], cache.conv_stack[j]
    return cache


def reset_slots(cache: CacheTensors, slots: list[int]) -> None:
    """Zero the KDA state of freshly assigned slots (a new or recomputed sequence)."""
    if not slots:
        return
    if cache.kda_stack is not None:
        index = to_device(slots, cache.kda_stack.device, torch.long)
        for t in (cache.kda_stack, cache.conv_stack):
            t[:, index] = 0
        return
    for tensors in (cache.kda_state, cache.conv_state):
        for t in tensors.values():
            t[to_device(slots, t.device, torch.long)] = 0


def copy_waves(copies: list[tuple[int, int]]) -> list[tuple[list[int], list[int]]]:
    """Slot copies (source, destination), meant one after another, grouped into waves that may each run as
    one gather and scatter: a copy starts a new wave when it reads or writes a slot the wave writes, or
    writes one it reads."""
    waves: list[tuple[list[int], list[int]]] = []
    reads: set[int] = set()
    writes: set[int] = set()
    for src, dst in copies:
        if not waves or src in writes or dst in writes or dst in reads:
            waves.append(([], []))
            reads, writes = set(), set()
        waves[-1][0].append(src)
        waves[-1][1].append(dst)
        reads.add(src)
        writes.add(dst)
    return waves


def copy_slots(cache: CacheTensors, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Every KDA layer's recurrent and conv state of slots `src` into slots `dst` (one wave of copy_waves)."""
    if cache.kda_stack is not None:
        for t in (cache.kda_stack, cache.conv_stack):
            t[:, dst] = t[:, src]
        return
    for tensors in (cache.kda_state, cache.conv_state):
        for t in tensors.values():
            t[dst] = t[src]
