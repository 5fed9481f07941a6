"""Cache bookkeeping: the paged block pool (MLA latent + indexer rows) and the KDA state slots.

The scheduler owns blocks and slots (BlockPool, SlotPool); the model only reads the tensors
(CacheTensors) through the tables of each step. Blocks are reference-counted: with prefix caching
(engine/prefix_cache.py) a full block may be held by several sequences, and a cached block nobody
holds waits in an LRU until an allocation needs it (it counts as free). Freeing is exact: once
every request has ended or been aborted both pools are full again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class PoolExhausted(RuntimeError):
    pass


class BlockPool:
    """Fixed set of cache blocks, handed out and taken back by id, with a reference count each."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks
        self._cached: set[int] = set()  # blocks an index may hand out again (mark_cached)
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks nobody holds, oldest first
        self.on_evict: Callable[[int], None] | None = None  # told when a cached block is reused

    @property
    def num_free(self) -> int:
        """Blocks an allocation can have: never used ones plus cached ones nobody holds."""
        return len(self._free) + len(self._lru)

    @property
    def num_cached_idle(self) -> int:
        return len(self._lru)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise PoolExhausted(f"asked for {n} blocks, {self.num_free} free")
        out = []
        for _ in range(n):
            if self._free:
                block = self._free.pop()
            else:  # the least recently used cached block: its index entry goes
                block, _ = self._lru.popitem(last=False)
                self._cached.discard(block)
                if self.on_evict is not None:
                    self.on_evict(block)
            self._refs[block] = 1
            out.append(block)
        return out

    def take(self, blocks: list[int]) -> None:
        """One more holder of each (cached) block: a prefix-cache hit."""
        for block in blocks:
            if self._refs[block] == 0:
                if block not in self._lru:
                    raise RuntimeError(f"block pool: block {block} is neither held nor cached")
                del self._lru[block]
            self._refs[block] += 1

    def free(self, blocks: list[int]) -> None:
        """One holder fewer of each; a block nobody holds goes back (cached ones to the LRU, tail first)."""
        for block in reversed(blocks):
            if self._refs[block] <= 0:
                raise RuntimeError("block pool: a block was freed twice")
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._cached:
                    self._lru[block] = None
                else:
                    self._free.append(block)

    def mark_cached(self, block: int) -> None:
        self._cached.add(block)

    def uncache(self, block: int) -> None:
        """The index dropped the block: held, it goes to the free list when its last holder frees it."""
        self._cached.discard(block)
        if block in self._lru:
            del self._lru[block]
            self._free.append(block)


class SlotPool(BlockPool):
    """KDA state slots: one per running sequence (same bookkeeping as blocks)."""
