"""Prefix caching for the hybrid model: full cache blocks shared between requests, and checkpoints of the
KDA layers' recurrent and conv states at some block ends (`--enable-prefix-caching`).

Blocks. Each full block (MLA latent, indexer and MTP rows) of a sequence is registered under a hash of its
parent's key and its tokens; a prompt's first block also carries the request's cache_salt. An entry keeps
its tokens and its parent entry's id, and a lookup walks the chain from the first block comparing both, so a
hash collision can never hand out another prefix. A registered block is immutable: its holders only write
positions past it. Blocks are reference-counted in the BlockPool; a cached block nobody holds waits in an
LRU and is evicted (with its entry) only when an allocation needs it.

States. A KDA layer's state exists only where a sequence stands, so a hit resumes only where a copy of every
KDA / conv state was kept: a checkpoint, one of the extra slots of the state tensors (ModelRunner), attached
to the entry of the block it follows. Saving and restoring are slot-to-slot copies on the device, queued here
(`copies`) and applied in order before the next step's forward (StepPlan.state_copies, on every rank).
Checkpoints are kept at the last full block of every prompt (and at the block end before its last token,
where the same prompt resumes), every `interval` prompt tokens, and where a prompt's cached blocks stopped
matching when it was admitted (a branch point: the next request with that prefix and another suffix resumes
there). A prefill chunk passing one such position does not end there: its step also computes the state there
(`saves`, ForwardBatch.state_saves), attached to its block once registered; a second such position ends the
chunk, its state copied before the next step (`progress`). And where a request stops: a
per-request rolling checkpoint follows each block end a step of its decoding begins at and becomes a cached
one when the request stops, unless it stops right at a block end, which is kept instead (with speculation a
verify may jump over a block end, and a request ending inside a verify keeps its rolling checkpoint). Cached
checkpoints have their own LRU and a fixed number of slots (the memory budget); evicting a block drops its
checkpoint, a checkpoint may go alone. Only a checkpoint where a prompt ends may evict a cached one: interval,
branch and rolling ones take free slots (else they are skipped), so concurrent conversations do not evict each
other's resume points. When a request stops, its prompt's end goes to the LRU's recent end and where its answer
ended to the old end: the next turn resumes at the prompt's end even when the answer it sends back tokenizes
otherwise.

A hit is the longest run of cached blocks from the first one that ends at a checkpoint, leaving at least
one token to compute (the last prompt token gives the logits). Requests asking for prompt logprobs skip the
lookup (every prompt row must be computed).

The MTP drafter's cache row p depends on token p + 1, so the last MTP row of a block shared by two
continuations holds the first one's value: the second never rewrites it (`mtp_computed` starts at the hit),
so only the quality of the drafts read there can differ; verified tokens are exact either way. A block whose
MTP rows were never computed (its sequence skipped its prompt's MTP pass, or had stopped drafting, when it
filled) is marked so (`Entry.mtp`). A request that is to draft (the scheduler asks the speculator: `mtp_wanted`)
resumes only from the blocks before the first such one (`with_mtp`) and computes the rest again, its MTP pass
included; its blocks then take the entries' place (`_register`), so the next hit on them drafts. Otherwise it takes
the whole hit and decodes plainly, as its drafts would read rows never written.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from tpserve.engine.cache import BlockPool
from tpserve.model.cache import bytes_per_block, bytes_per_slot
from tpserve.model.mtp import mtp_config

log = logging.getLogger("tpserve.prefix_cache")
_IDS = itertools.count(1)  # entry ids (0: no parent)


@dataclass(eq=False)
class Entry:
    """One cached full block: its tokens, the id of the entry before it (0: a prompt's first block, which keeps
    the salt) and the checkpoint holding the state after it, if any."""

    key: int
    parent: int
    tokens: tuple[int, ...]
    salt: str | None
    block: int
    ckpt: int | None = None
    live: bool = True  # False once evicted or reset: children registered under it are unreachable
    mtp: bool = False  # its MTP drafter rows are real (the registering sequence's catch-up covered the block)
    id: int = field(default_factory=lambda: next(_IDS))


@dataclass
class SeqPrefix:
    """A sequence's view of the index."""

    keys: list[int] = field(default_factory=list)        # hash chain of its full blocks (kept when preempted)
    entries: list[Entry] = field(default_factory=list)   # entries of its first blocks (held, or equal content)
    saved: int = 0              # the last position whose state was kept (or restored)
    rolling: int | None = None  # checkpoint slot holding the state at rolling_pos (its latest block end)
    rolling_pos: int = 0
    branch: int = 0             # where its cached blocks stopped matching when admitted: a checkpoint is kept there
    next: int = 0               # `progress` has nothing to do before num_computed reaches this (a block end)
    pending: list[tuple[int, int]] = field(default_factory=list)  # (position, checkpoint) written by a step,
    # attached to the block before the position once it is registered
    broken: bool = False        # its later blocks are not registered (a hash collision, or a reset)


class Checkpoints:
    """State checkpoint slots first .. first + capacity - 1: free, cached (an LRU of entries) or rolling."""

    def __init__(self, first: int, capacity: int):
        self.first, self.capacity = first, capacity
        self.free = list(range(first + capacity - 1, first - 1, -1))
        self.lru: OrderedDict[int, Entry] = OrderedDict()
        self.rolling = 0

    @property
    def used(self) -> int:
        return self.capacity - len(self.free)

    def allocate(self, evict: bool = True) -> int | None:
        """A free slot, else (evict) the least recently used cached one."""
        if self.free:
            return self.free.pop()
        if self.lru and evict:
            ckpt, entry = self.lru.popitem(last=False)
            entry.ckpt = None
            return ckpt
        return None

    def allocate_rolling(self) -> int | None:
        """A free slot for a rolling checkpoint, at most half the slots (the rest keep cached ones)."""
        if self.rolling >= self.capacity // 2:
            return None
        ckpt = self.allocate(evict=False)
        self.rolling += ckpt is not None
        return ckpt

    def attach(self, ckpt: int, entry: Entry) -> None:
        entry.ckpt = ckpt
        self.lru[ckpt] = entry

    def drop(self, entry: Entry) -> None:
        if entry.ckpt is not None:
            del self.lru[entry.ckpt]
            self.free.append(entry.ckpt)
            entry.ckpt = None


class PrefixCache:
    def __init__(self, blocks: BlockPool, block_size: int, *, first_ckpt_slot: int, num_ckpts: int,
                 interval: int, needs_state: bool = True):
        self.blocks, self.bs = blocks, block_size
        self.index: dict[int, Entry] = {}
        self.by_block: dict[int, Entry] = {}
        self.ckpts = Checkpoints(first_ckpt_slot, num_ckpts if needs_state else 0)
        self.interval = -(-interval // block_size) * block_size
        self.needs_state = needs_state  # the model has KDA layers: a hit needs a checkpoint
        self.copies: list[tuple[int, int]] = []  # (source slot, destination slot), for the next step
        self.queries = self.hits = 0  # prompt tokens looked up / found (first admissions)
        self.checkpoint_bytes, self.share = 0, 0.0  # one checkpoint per rank; their share of the cache memory
        # a sequence finishing inside a step stands at num_computed (False with speculation: a verify's rows are
        # committed to the state after the walk that may end it, or on the device past the host's stop)
        self.state_current_at_finish = True
        blocks.on_evict = self._evicted

    # ---------------------------------------------------------------- lookups
    def match(self, seq) -> list[Entry]:
        """The longest run of cached blocks from seq's first token that ends at a checkpoint (or anywhere,
        without KDA layers), leaving at least one token to compute."""
        if getattr(seq.params, "prompt_logprobs", None) is not None:
            return []
        st = self._state(seq)
        limit = (self._known(seq) - 1) // self.bs
        keys = self._keys(seq, st, limit)
        run: list[Entry] = []
        for i in range(limit):
            e = self.index.get(keys[i])
            if (e is None or e.parent != (run[-1].id if run else 0) or (not run and e.salt != seq.cache_salt)
                    or e.tokens != self._block_tokens(seq, i)):
                break
            run.append(e)
        st.branch = len(run) * self.bs  # (a later request with the same prefix and another suffix resumes here)
        if self.needs_state:
            while run and run[-1].ckpt is None:
                run.pop()
        return run

    def with_mtp(self, run: list[Entry]) -> list[Entry]:
        """The part of a hit (`match`) before its first block without MTP rows, ending at a checkpoint."""
        n = next((i for i, e in enumerate(run) if not e.mtp), len(run))
        run = run[:n]
        if self.needs_state:
            while run and run[-1].ckpt is None:
                run.pop()
        return run

    def admit(self, seq, run: list[Entry]) -> list[int]:
        """seq (its slot assigned) starts after `run`: hold its blocks, queue the state's restore.
        -> the blocks held."""
        st = self._state(seq)
        held = [e.block for e in run]
        self.blocks.take(held)
        st.entries, st.saved, st.broken = list(run), len(run) * self.bs, False
        st.next = st.saved + self.bs
        if run and self.needs_state:
            self.ckpts.lru.move_to_end(run[-1].ckpt)
            self.copies.append((run[-1].ckpt, seq.slot))
        if seq.num_preemptions == 0 and getattr(seq.params, "prompt_logprobs", None) is None:
            seq.num_cached_tokens = len(run) * self.bs
            self.queries += len(seq.prompt_ids)
            self.hits += seq.num_cached_tokens
        return held

    def saves(self, seq, start: int, n: int) -> tuple[int, list[tuple[int, int]]]:
        """The prefill chunk [start, start + n) keeps a checkpoint at the first prompt position inside it where
        one is kept -> (its length, [(rows into the chunk, checkpoint slot)] for the step to write). A second
        such position ends the chunk (kept by `progress` before the next step, as any at a chunk's end), so a
        step recomputes at most its own rows for its saves."""
        if not self.ckpts.capacity:
            return n, []
        st, n_prompt, bs = self._state(seq), len(seq.prompt_ids), self.bs
        stops = {(n_prompt - 1) // bs * bs, n_prompt // bs * bs, st.branch}
        if self.interval:
            stops.update(range((start // self.interval + 1) * self.interval, start + n, self.interval))
        out: list[tuple[int, int]] = []
        for p in sorted(p for p in stops if max(start, st.saved) < p < start + n and p <= n_prompt):
            if out:
                return p - start, out
            ckpt = self.ckpts.allocate(evict=self._is_end(seq, p))
            if ckpt is not None:
                st.pending.append((p, ckpt))
                out.append((p - start, ckpt))
        return n, out

    # --------------------------------------------------------------- progress
    def progress(self, seq) -> None:
        """Before a step (the steps before it are on the device, commits included, so seq's slot holds the
        state at num_computed): register seq's newly full blocks; at a block end worth it, keep the state."""
        st = self._state(seq)
        pos, known = seq.num_computed, self._known(seq)
        st.next = (pos // self.bs + 1) * self.bs
        self._register(seq, st, min(pos, known) // self.bs)
        self._attach_pending(st, pos)
        if not self.ckpts.capacity or pos % self.bs or pos <= st.saved or pos > known:
            return
        st.saved = pos
        if len(st.entries) < pos // self.bs:  # the chain is not registered that far
            return
        entry = st.entries[pos // self.bs - 1]
        if entry.ckpt is not None:
            return
        if pos <= len(seq.prompt_ids):
            n = len(seq.prompt_ids)
            if (pos in (n // self.bs * self.bs, (n - 1) // self.bs * self.bs) or pos == st.branch
                    or (self.interval and pos % self.interval == 0)):
                ckpt = self.ckpts.allocate(evict=self._is_end(seq, pos))
                if ckpt is not None:
                    self.copies.append((seq.slot, ckpt))
                    self.ckpts.attach(ckpt, entry)
            return
        if st.rolling is None:
            st.rolling = self.ckpts.allocate_rolling()
            if st.rolling is None:
                return
        self.copies.append((seq.slot, st.rolling))
        st.rolling_pos = pos

    def release(self, seq, state_current: bool = True) -> None:
        """seq stops (finished, aborted or preempted), before its blocks are freed: register its full blocks;
        keep its state where it stands if that is a block end (state_current: its slot holds the state at
        num_computed), else its rolling checkpoint becomes a cached one where none is kept yet."""
        st = seq.prefix
        if st is None:
            return
        if seq.slot is not None:
            self._register(seq, st, min(seq.num_computed, self._known(seq)) // self.bs)
            self._attach_pending(st, seq.num_computed)
            pos = seq.num_computed
            if (state_current and self.ckpts.capacity and pos % self.bs == 0 and pos > st.saved
                    and pos <= self._known(seq) and len(st.entries) >= pos // self.bs
                    and st.entries[pos // self.bs - 1].ckpt is None):
                ckpt = self.ckpts.allocate(evict=self._is_end(seq, pos))
                if ckpt is not None:
                    self.copies.append((seq.slot, ckpt))
                    self.ckpts.attach(ckpt, st.entries[pos // self.bs - 1])
        if st.rolling is not None:
            k = st.rolling_pos // self.bs
            entry = st.entries[k - 1] if len(st.entries) >= k else None
            self.ckpts.rolling -= 1
            if entry is not None and entry.live and entry.ckpt is None:
                self.ckpts.attach(st.rolling, entry)
            else:
                self.ckpts.free.append(st.rolling)
            st.rolling = None
        self.ckpts.free.extend(ckpt for _, ckpt in st.pending)  # (steps not run up to them: never attached)
        self._refresh_ends(seq, st)
        st.entries, st.saved, st.broken, st.pending = [], 0, False, []

    def _is_end(self, seq, pos: int) -> bool:
        """pos is where the same prompt resumes (its last full block ends): a checkpoint there may evict a cached
        one; one at an interval or branch point only takes a free slot."""
        n = len(seq.prompt_ids)
        return pos in ((n - 1) // self.bs * self.bs, n // self.bs * self.bs)

    def _refresh_ends(self, seq, st: SeqPrefix) -> None:
        """A request stops: the checkpoints at its prompt's end go to the LRU's recent end, those past it (where
        its answer ended) to the old end; its other checkpoints keep their age."""
        n = len(seq.prompt_ids)
        first = max((n - 1) // self.bs - 1, 0)
        for i, e in reversed(list(enumerate(st.entries[first:], first))):
            if e.ckpt is not None and e.ckpt in self.ckpts.lru:
                self.ckpts.lru.move_to_end(e.ckpt, last=(i + 1) * self.bs <= n)

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    def reset(self) -> None:
        """Forget every cached block and checkpoint (blocks still held stay with their holders, uncached)."""
        for e in list(self.by_block.values()):
            e.live = False
            self.ckpts.drop(e)
            self.blocks.uncache(e.block)
        self.index.clear()
        self.by_block.clear()

    def stats(self) -> dict:
        return {"prefix_cache_queries": self.queries, "prefix_cache_hits": self.hits,
                "prefix_cache_blocks": len(self.by_block), "prefix_state_checkpoints": self.ckpts.capacity,
                "prefix_state_checkpoints_used": self.ckpts.used,
                "prefix_state_checkpoint_bytes": self.checkpoint_bytes, "prefix_state_memory_share": self.share}

    # --------------------------------------------------------------- internals
    def _state(self, seq) -> SeqPrefix:
        if seq.prefix is None:
            seq.prefix = SeqPrefix()
        return seq.prefix

    @staticmethod
    def _known(seq) -> int:
        """Tokens whose ids the host knows (async scheduling leaves a placeholder, < 0, at the end)."""
        return seq.num_tokens - (1 if seq.output_ids and seq.output_ids[-1] < 0 else 0)

    def _block_tokens(self, seq, i: int) -> tuple[int, ...]:
        a, b, n = i * self.bs, (i + 1) * self.bs, len(seq.prompt_ids)
        if b <= n:
            return tuple(seq.prompt_ids[a:b])
        if a >= n:
            return tuple(seq.output_ids[a - n:b - n])
        return tuple(seq.prompt_ids[a:]) + tuple(seq.output_ids[:b - n])

    def _keys(self, seq, st: SeqPrefix, count: int) -> list[int]:
        while len(st.keys) < count:
            parent = st.keys[-1] if st.keys else hash(("tpserve-prefix", seq.cache_salt))
            st.keys.append(hash((parent, self._block_tokens(seq, len(st.keys)))))
        return st.keys

    def _register(self, seq, st: SeqPrefix, count: int) -> None:
        """Enter seq's first `count` blocks (full, computed, their tokens known) into the index."""
        while len(st.entries) < count and not st.broken:
            i = len(st.entries)
            parent = st.entries[-1] if i else None
            tokens = self._block_tokens(seq, i)
            key = self._keys(seq, st, i + 1)[i]
            e = self.index.get(key)
            if parent is not None and not parent.live:
                st.broken = True
            elif e is None:
                e = Entry(key, parent.id if parent else 0, tokens, seq.cache_salt if parent is None else None,
                          seq.blocks[i], mtp=seq.mtp_computed >= (i + 1) * self.bs)
                self.index[key] = e
                self.by_block[e.block] = e
                self.blocks.mark_cached(e.block)
                st.entries.append(e)
            elif (e.parent == (parent.id if parent else 0) and e.tokens == tokens
                  and (parent is not None or e.salt == seq.cache_salt)):
                if not e.mtp and seq.mtp_computed >= (i + 1) * self.bs and e.block != seq.blocks[i]:
                    self._replace_block(e, seq.blocks[i])  # the same content, with its MTP rows
                st.entries.append(e)  # the same content cached from another sequence: its children follow it
            else:
                st.broken = True  # a hash collision: this chain is not entered further

    def _attach_pending(self, st: SeqPrefix, upto: int) -> None:
        """The checkpoints written at positions up to `upto` go to their blocks' entries (registered by now;
        a slot whose entry is gone, or already has one, goes back to the free list)."""
        keep = []
        for p, ckpt in st.pending:
            if p > upto:
                keep.append((p, ckpt))
                continue
            entry = st.entries[p // self.bs - 1] if len(st.entries) >= p // self.bs else None
            if entry is not None and entry.live and entry.ckpt is None:
                self.ckpts.attach(ckpt, entry)
                st.saved = max(st.saved, p)
            else:
                self.ckpts.free.append(ckpt)
        st.pending = keep

    def _replace_block(self, e: Entry, block: int) -> None:
        """e's content now lives in `block`, with its MTP rows; the old block stays with its holders, uncached."""
        del self.by_block[e.block]
        self.blocks.uncache(e.block)
        e.block, e.mtp = block, True
        self.by_block[block] = e
        self.blocks.mark_cached(block)

    def _evicted(self, block: int) -> None:
        e = self.by_block.pop(block)
        if self.index.get(e.key) is e:
            del self.index[e.key]
        e.live = False
        self.ckpts.drop(e)


def check_cache_salt(salt) -> None:
    """cache_salt: None or a non-empty string (vLLM's rule)."""
    if salt is not None and (not isinstance(salt, str) or not salt):
        err = ValueError("cache_salt: must be a non-empty string")
        err.param = "cache_salt"
        raise err


def make_prefix_cache(ecfg, model_config, shape, dtype, blocks: BlockPool) -> PrefixCache | None:
    """The engine's prefix cache over `blocks` and the shape's checkpoint slots (None: off, or no checkpoint
    fits); logs one checkpoint's bytes per rank and the checkpoints' share of the cache memory."""
    if not ecfg.enable_prefix_caching:
        return None
    cfg = mtp_config(model_config) if ecfg.speculative is not None else model_config
    per = bytes_per_slot(cfg, ecfg.tensor_parallel_size, dtype)
    state = shape.num_checkpoints * per
    total = state + shape.num_slots * per + shape.num_blocks * bytes_per_block(cfg, shape.block_size, dtype)
    share = state / max(total, 1)
    if per and not shape.num_checkpoints:
        log.warning("prefix caching: no room for a KDA state checkpoint (%.2f MiB each), so no prefix can be "
                    "reused; raise --prefix-state-memory", per / 2**20)
        return None
    log.info("prefix caching: %d KDA state checkpoints of %.2f MiB per rank (%.1f MiB, %.1f%% of the cache), "
             "kept every %d prompt tokens and at each prompt's and request's last full block",
             shape.num_checkpoints, per / 2**20, state / 2**20, 100 * share, ecfg.prefix_state_interval)
    cache = PrefixCache(blocks, shape.block_size, first_ckpt_slot=shape.first_checkpoint,
                        num_ckpts=shape.num_checkpoints, interval=ecfg.prefix_state_interval, needs_state=per > 0)
    cache.checkpoint_bytes, cache.share = per, share
    return cache
