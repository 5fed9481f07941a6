"""Scheduler: continuous batching with chunked prefill, admission control and preemption.

Each step gets a token budget (max_num_batched_tokens). Running sequences go first, in arrival
order: a decode takes one token, an unfinished prefill takes the next chunk. Then waiting
sequences are admitted (FIFO) while budget, a KDA slot, blocks and max_num_seqs allow. When a
running sequence needs a block and none is free, the latest-arrived running sequence is
preempted: its blocks and slot are freed and it goes back to the front of the queue, to be
recomputed from its prompt and the tokens it already generated.
With prefix caching (engine/prefix_cache.py) a waiting sequence starts after the longest cached run of
its blocks that ends at a state checkpoint (its blocks shared, its KDA state restored by a copy before
the step's forward), and a prefill chunk that passes a position where a checkpoint is kept writes it too.
With speculation, a run whose blocks lack MTP rows is cut before them where the speculator wants the
sequence to draft (`mtp_wanted`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tpserve.engine.cache import BlockPool, SlotPool
from tpserve.engine.prefix_cache import PrefixCache
from tpserve.engine.request import Sequence, Status


@dataclass
class Scheduled:
    seq: Sequence
    num_tokens: int  # tokens computed this step, starting at seq.num_computed (a decode's drafts included)
    decode: bool = False  # a decode / verify (every known token but the last was in the cache)
    saves: list[tuple[int, int]] = field(default_factory=list)  # prefix caching: (rows, checkpoint slot) inside
    # this prefill chunk whose states the step keeps (PrefixCache.saves)

    @property
    def completes(self) -> bool:
        """After this chunk every known token is in the cache: sample the next one."""
        return self.seq.num_computed + self.num_tokens >= self.seq.num_tokens

    @property
    def num_drafts(self) -> int:
        """Drafted tokens verified in this step (past the known ones; 0 for a prefill chunk)."""
        return max(self.seq.num_computed + self.num_tokens - self.seq.num_tokens, 0)


class Scheduler:
    def __init__(self, blocks: BlockPool, slots: SlotPool, *, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, prefix: PrefixCache | None = None):
        self.blocks, self.slots, self.block_size, self.prefix = blocks, slots, block_size, prefix
        self.max_num_seqs, self.token_budget = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.fresh_slots: list[int] = []  # slots handed out since the last step (to be zeroed)
        self.num_preemptions = 0
        # speculation: (seq, start, hit) -> whether it computes again from start (its hit's blocks with MTP rows)
        # to hit (the blocks without them), so that it drafts
        self.mtp_wanted: Callable[[Sequence, int, int], bool] | None = None

    # ------------------------------------------------------------------ queue
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence (stop, length or abort) and give back everything it holds."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq, reason == "abort" or self.prefix is None or self.prefix.state_current_at_finish)
        seq.status, seq.finish_reason = Status.FINISHED, reason

    def _release(self, seq: Sequence, state_current: bool = True) -> None:
        if self.prefix is not None:
            self.prefix.release(seq, state_current)
        if seq.blocks:
            self.blocks.free(seq.blocks)
            seq.blocks = []
        if seq.slot is not None:
            self.slots.free([seq.slot])
            if seq.slot in self.fresh_slots:
                self.fresh_slots.remove(seq.slot)
            seq.slot = None
        seq.num_computed = seq.mtp_computed = 0
        seq.drafts, seq.draft_probs, seq.draft_sure = [], None, []

    # ------------------------------------------------------------------- step
    def schedule(self) -> list[Scheduled]:
        budget = self.token_budget
        out: list[Scheduled] = []
        if self.prefix is not None:  # (before any admission: state saves come before restores)
            for seq in self.running:
                if seq.num_computed >= seq.prefix.next:  # (a block end reached: else nothing to do)
                    self.prefix.progress(seq)
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not Status.RUNNING:  # preempted below while making room
                continue
            n = min(seq.num_tokens - seq.num_computed + (len(seq.drafts) if seq.in_decode else 0), budget)
            if not self._grow(seq, seq.num_computed + n):
                continue
            if seq.in_decode and n - 1 < len(seq.drafts):  # the budget verifies fewer drafts
                del seq.drafts[n - 1:]
                del seq.draft_sure[n - 1:]
                if seq.draft_probs is not None:
                    del seq.draft_probs[n - 1:]
            saves = []
            if self.prefix is not None and not seq.in_decode:
                n, saves = self.prefix.saves(seq, seq.num_computed, n)
            out.append(Scheduled(seq, n, seq.in_decode, saves))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and self.slots.num_free:
            seq = self.waiting[0]
            run = self.prefix.match(seq) if self.prefix is not None else []
            seq.mtp_recompute = False
            if run and self.mtp_wanted is not None and not all(e.mtp for e in run):
                trimmed = self.prefix.with_mtp(run)
                if self.mtp_wanted(seq, len(trimmed) * self.block_size, len(run) * self.block_size):
                    run, seq.mtp_recompute = trimmed, True
            start = len(run) * self.block_size
            n = min(seq.num_tokens - start, budget)
            need = self._blocks_for(start + n) - len(run)
            idle = sum(1 for e in run if self.blocks.refs(e.block) == 0)  # cached blocks a hit takes off the LRU
            if need + idle > self.blocks.num_free:
                break
            self.waiting.popleft()
            seq.slot = self.slots.allocate(1)[0]
            held = self.prefix.admit(seq, run) if self.prefix is not None else []  # (before allocate: held)
            seq.blocks = held + self.blocks.allocate(need)
            seq.num_computed = start
            seq.mtp_computed = start if all(e.mtp for e in run) else -1  # (-1: it decodes plainly)
            if not run or not self.prefix.needs_state:
                self.fresh_slots.append(seq.slot)
            seq.status = Status.RUNNING
            self.running.append(seq)
            n, saves = self.prefix.saves(seq, start, n) if self.prefix is not None else (n, [])
            out.append(Scheduled(seq, n, seq.in_decode, saves))
            budget -= n
        return out

    def take_copies(self) -> list[tuple[int, int]]:
        """State checkpoint saves and restores queued for the next step (applied before its forward)."""
        return self.prefix.take_copies() if self.prefix is not None else []

    def take_fresh_slots(self) -> list[int]:
        fresh, self.fresh_slots = self.fresh_slots, []
        return fresh

    def reserve(self, seq: Sequence, tokens: int) -> bool:
        """Blocks for `tokens` tokens if free ones suffice (drafting never preempts anyone)."""
        need = self._blocks_for(tokens) - len(seq.blocks)
        if need > self.blocks.num_free:
            return False
        if need > 0:
            seq.blocks.extend(self.blocks.allocate(need))
        return True

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        """Give `seq` blocks for `tokens` tokens, preempting later arrivals if needed."""
        need = self._blocks_for(tokens) - len(seq.blocks)
        while need > self.blocks.num_free:
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        if need > 0:
            seq.blocks.extend(self.blocks.allocate(need))
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
