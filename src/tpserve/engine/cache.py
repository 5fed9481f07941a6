"""Cache bookkeeping: the paged block pool (MLA latent + indexer rows) and the KDA state slots.

The scheduler owns blocks and slots (BlockPool, SlotPool); the model only reads the tensors
(CacheTensors) through the tables of each step. Freeing is exact: once every request has ended
or been aborted both pools are full again.
"""

from __future__ import annotations


class PoolExhausted(RuntimeError):
    pass


class BlockPool:
    """Fixed set of cache blocks, handed out and taken back by id."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise PoolExhausted(f"asked for {n} blocks, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
        if len(self._free) > self.num_blocks:
            raise RuntimeError("block pool: a block was freed twice")


class SlotPool(BlockPool):
    """KDA state slots: one per running sequence (same bookkeeping as blocks)."""
