"""Prefix caching's bookkeeping without a model (engine/cache.py, engine/prefix_cache.py, the scheduler): reference
counts, the LRU, the hash chain's equality checks, salts, checkpoints and the state copies queued for the device.

`FakeDevice` runs the scheduler's steps on a model-free device that records which token each cache row holds
and which token prefix each KDA state slot stands for, and checks before every step that a sequence's rows and
its (restored) state are exactly those of its own tokens: a wrong hit, a shared block overwritten or evicted
while held, or a checkpoint restored for another prefix fails there."""

import random

import pytest

from tpserve.engine.cache import BlockPool, SlotPool
from tpserve.engine.prefix_cache import PrefixCache
from tpserve.engine.request import Sequence
from tpserve.engine.scheduler import Scheduler
from tpserve.model.cache import copy_waves
from tpserve.sampling_params import SamplingParams

BS = 4


def _seq(tokens, salt=None, max_tokens=6, rid="r"):
    seq = Sequence(rid, 0, list(tokens), SamplingParams(max_tokens=max_tokens), max_tokens, frozenset())
    seq.cache_salt = salt
    return seq


def _tokens(seq):
    return seq.prompt_ids + seq.output_ids


class FakeDevice:
    def __init__(self, sched: Scheduler):
        self.sched, self.rows, self.state = sched, {}, {}

    def step(self) -> list:
        sched = self.sched
        scheduled = sched.schedule()
        for src, dst in sched.take_copies():  # in order, then the fresh slots zeroed (ModelRunner._prepare_slots)
            self.state[dst] = self.state.get(src)
        for slot in sched.take_fresh_slots():
            self.state[slot] = ()
        for s in scheduled:
            seq, start, toks = s.seq, s.seq.num_computed, _tokens(s.seq)
            assert self.state[seq.slot] == tuple(toks[:start]), "a state resumed for another prefix"
            for p in range(start):
                assert self.rows[seq.blocks[p // BS], p % BS] == toks[p], "a cached row of another prefix"
            for p in range(start, start + s.num_tokens):
                self.rows[seq.blocks[p // BS], p % BS] = toks[p]
            for rows, ckpt in s.saves:  # checkpoints kept inside the chunk (the states after its first rows)
                self.state[ckpt] = tuple(toks[:start + rows])
            self.state[seq.slot] = tuple(toks[:start + s.num_tokens])
        done = []
        for s in scheduled:
            seq, completes = s.seq, s.completes
            seq.num_computed += s.num_tokens
            if completes:
                seq.output_ids.append(hash(tuple(_tokens(seq))) % 50)  # a function of the prefix
                if len(seq.output_ids) >= seq.max_tokens:
                    sched.finish(seq, "length")
                    done.append(seq)
        return done

    def run(self, seqs: list) -> None:
        for seq in seqs:
            self.sched.add(seq)
        for _ in range(10_000):
            if not self.sched.has_work():
                return
            self.step()
        raise AssertionError("requests stalled")


def _sched(blocks=64, slots=4, ckpts=8, interval=0, budget=8, bs=BS):
    pool, slot_pool = BlockPool(blocks), SlotPool(slots)
    cache = PrefixCache(pool, bs, first_ckpt_slot=slots + 1, num_ckpts=ckpts, interval=interval)
    return Scheduler(pool, slot_pool, block_size=bs, max_num_seqs=slots, max_num_batched_tokens=budget,
                     prefix=cache), cache


def _full(sched, cache):
    return (sched.blocks.num_free == sched.blocks.num_blocks and sched.slots.num_free == sched.slots.num_blocks
            and cache.ckpts.rolling == 0 and len(cache.ckpts.free) + len(cache.ckpts.lru) == cache.ckpts.capacity)


def test_pool_counts_cached_idle_blocks_as_free_and_never_evicts_held_ones():
    pool = BlockPool(4)
    evicted = []
    pool.on_evict = evicted.append
    a = pool.allocate(2)
    for b in a:
        pool.mark_cached(b)
    pool.take([a[0]])  # a second holder
    pool.free(a)       # a[1] idle in the LRU, a[0] still held once
    assert pool.num_free == 3 and pool.refs(a[0]) == 1
    got = pool.allocate(3)  # the two never-used blocks, then the idle cached one
    assert evicted == [a[1]] and a[0] not in got
    with pytest.raises(RuntimeError, match="asked for 1"):
        pool.allocate(1)  # a[0] is held: never handed out
    pool.free(got)
    pool.free([a[0]])
    assert pool.num_free == 4
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.free([a[0]])


def test_lru_evicts_the_oldest_and_a_sequence_tail_first():
    pool = BlockPool(4)
    evicted = []
    pool.on_evict = evicted.append
    blocks = pool.allocate(4)
    for b in blocks:
        pool.mark_cached(b)
    pool.free(blocks[:2])
    pool.free(blocks[2:])
    pool.allocate(3)
    assert evicted == [blocks[1], blocks[0], blocks[3]]


def test_second_turn_resumes_after_the_first_prompt_and_answer():
    sched, cache = _sched()
    dev = FakeDevice(sched)
    first = _seq(range(10, 23), max_tokens=8)  # 13 tokens: the prompt's checkpoint at 12, the answer's at 20
    dev.run([first])
    assert first.num_cached_tokens == 0
    follow = _seq(_tokens(first) + [3, 4, 5])  # the next turn: prompt + answer + a new message
    dev.run([follow])
    assert follow.num_cached_tokens == 20  # the rolling checkpoint of the answer (positions 13..20)
    again = _seq(list(range(10, 23)) + [9, 9, 9, 9])  # same first prompt, another continuation
    dev.run([again])
    assert again.num_cached_tokens == 12
    assert cache.queries == 13 + 24 + 17 and cache.hits == 32
    assert _full(sched, cache)


def test_concurrent_conversations_keep_where_each_prompt_ended():
    """Six conversations at once, two checkpoints each, checkpoints every 8 tokens besides: each answer comes back
    in the next turn as other tokens (a re-tokenized text), so only the checkpoint where the previous prompt ended
    serves it. Interval, branch and rolling checkpoints take free slots only, and where a prompt ended may evict,
    so every later turn resumes there."""
    convs, turns = 6, 4
    sched, cache = _sched(blocks=400, slots=convs, ckpts=2 * convs, interval=8, budget=16)
    dev = FakeDevice(sched)
    prompts = [list(range(100 * c + 1000, 100 * c + 1022)) for c in range(convs)]
    live = {c: _seq(prompts[c], salt=f"c{c}", max_tokens=5, rid=f"{c}-0") for c in range(convs)}
    for seq in live.values():
        sched.add(seq)
    resumed, prev = [], {}
    for _ in range(10_000):
        if not live:
            break
        for seq in dev.step():
            c, t = map(int, seq.request_id.split("-"))
            if t:
                resumed.append((seq.num_cached_tokens, prev[c] // BS * BS))
            del live[c]
            if t + 1 < turns:
                prev[c] = len(seq.prompt_ids)
                prompts[c] = prompts[c] + [x + 5000 for x in seq.output_ids] + list(range(7 * t, 7 * t + 9))
                live[c] = _seq(prompts[c], salt=f"c{c}", max_tokens=5, rid=f"{c}-{t + 1}")
                sched.add(live[c])
    assert len(resumed) == convs * (turns - 1)
    assert [got for got, _ in resumed] == [want for _, want in resumed]
    assert _full(sched, cache)


def test_a_hit_leaves_one_token_and_a_branch_point_gets_a_checkpoint():
    sched, cache = _sched()
    dev = FakeDevice(sched)
    dev.run([_seq(range(100, 116), max_tokens=1)])  # 16 tokens: the prompt's checkpoint at 16
    same = _seq(range(100, 116), max_tokens=1)
    dev.run([same])
    assert same.num_cached_tokens == 12  # not 16: the last prompt token is computed for its logits
    other = _seq(list(range(100, 110)) + [1] * 6, max_tokens=1)  # shares two full blocks, no checkpoint at 8
    dev.run([other])
    assert other.num_cached_tokens == 0 and other.prefix.branch == 8
    third = _seq(list(range(100, 110)) + [2] * 7, max_tokens=1)
    dev.run([third])
    assert third.num_cached_tokens == 8  # the checkpoint `other` kept at the branch point
    assert _full(sched, cache)


def test_different_salts_share_nothing():
    sched, cache = _sched()
    dev = FakeDevice(sched)
    prompt = list(range(30, 47))
    dev.run([_seq(prompt, salt="tenant-a")])
    for salt in ("tenant-b", None):
        seq = _seq(prompt, salt=salt)
        dev.run([seq])
        assert seq.num_cached_tokens == 0
    seq = _seq(prompt, salt="tenant-a")
    dev.run([seq])
    assert seq.num_cached_tokens == 16
    assert _full(sched, cache)


def test_hash_collisions_never_hand_out_another_prefix(monkeypatch):
    """Every block key equal: the entries' token and parent checks alone keep prefixes apart."""
    monkeypatch.setattr(PrefixCache, "_keys", lambda self, seq, st, count: [0] * count)
    sched, cache = _sched()
    dev = FakeDevice(sched)
    dev.run([_seq(range(40, 57))])
    other = _seq(range(60, 77))  # same keys, other tokens
    dev.run([other])
    assert other.num_cached_tokens == 0
    # the chain of the first prompt is entered under key 0 once; its second block collides with its first
    assert [e.tokens for e in cache.index.values()] == [tuple(range(40, 44))]
    assert _full(sched, cache)


def test_a_checkpoint_is_restored_only_for_its_own_prefix():
    """Same blocks but a checkpoint kept for a longer prefix: the hit stops at the last block that has one."""
    sched, cache = _sched(interval=4)  # a checkpoint at every block end of the prompt
    dev = FakeDevice(sched)
    dev.run([_seq(range(1, 14))])
    seq = _seq(list(range(1, 11)) + [99] * 4)  # diverges inside the third block
    dev.run([seq])
    assert seq.num_cached_tokens == 8
    assert _full(sched, cache)


def test_prompt_logprobs_requests_compute_every_row():
    sched, cache = _sched()
    dev = FakeDevice(sched)
    dev.run([_seq(range(5, 18))])
    seq = _seq(range(5, 18))
    seq.params = SamplingParams(max_tokens=6, prompt_logprobs=1)
    dev.run([seq])
    assert seq.num_cached_tokens == 0 and sched.prefix.queries == 13


def test_reset_forgets_everything_and_the_pools_stay_whole():
    sched, cache = _sched()
    dev = FakeDevice(sched)
    prompt = list(range(50, 70))
    dev.run([_seq(prompt)])
    running = _seq(prompt, max_tokens=20)
    sched.add(running)
    dev.step()
    assert running.num_cached_tokens > 0
    cache.reset()
    assert not cache.index and not cache.ckpts.lru
    dev.run([])
    seq = _seq(prompt)
    dev.run([seq])
    assert seq.num_cached_tokens == 0
    assert _full(sched, cache)


@pytest.mark.parametrize("seed", range(4))
def test_stress_tiny_pools_every_request_finishes_exactly(seed):
    """Many requests over a few shared prefixes on pools that force eviction and preemption: the device checks
    pass on every step, every request finishes with the tokens it gets without a cache, the checkpoints never
    outnumber their slots, and everything is free afterwards."""
    rng = random.Random(seed)
    stems = [[rng.randrange(1, 50) for _ in range(rng.randrange(4, 30))] for _ in range(4)]
    prompts = [rng.choice(stems) + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 12))] for _ in range(40)]
    budgets = [rng.randrange(2, 12) for _ in prompts]
    results = []
    for cached in (True, False):
        sched, cache = _sched(blocks=16, slots=3, ckpts=3, interval=8, budget=7)
        if not cached:
            sched.prefix = None
        dev = FakeDevice(sched)
        seqs = [_seq(p, max_tokens=m, rid=f"r{i}") for i, (p, m) in enumerate(zip(prompts, budgets))]
        for i in range(0, len(seqs), 5):  # arrivals in waves while others run
            for seq in seqs[i:i + 5]:
                sched.add(seq)
            for _ in range(3):
                dev.step()
            if cached:
                assert cache.ckpts.used <= cache.ckpts.capacity
        dev.run([])
        results.append([s.output_ids for s in seqs])
        if cached:
            assert cache.hits > 0 and sched.num_preemptions > 0
            assert _full(sched, cache)
    assert results[0] == results[1]


def test_copy_waves_keep_the_order_of_dependent_copies():
    assert copy_waves([]) == []
    assert copy_waves([(1, 10), (2, 11)]) == [([1, 2], [10, 11])]
    # save into 10, then restore from 10; a slot saved twice
    assert copy_waves([(1, 10), (10, 3)]) == [([1], [10]), ([10], [3])]
    assert copy_waves([(1, 10), (2, 10)]) == [([1], [10]), ([2], [10])]
    assert copy_waves([(1, 10), (3, 1)]) == [([1], [10]), ([3], [1])]


def test_blocks_recomputed_with_mtp_rows_replace_the_cached_ones():
    """A prompt cached without MTP rows: a request that is not to draft takes the whole hit (and holds those
    blocks); one that is to draft resumes before them and computes them again; its blocks, with MTP rows, then
    replace the cached ones while the first still holds the old ones, which go back to the free list when it
    stops. The next request that is to draft takes the whole hit, on the new blocks."""

    class MtpDevice(FakeDevice):  # a sequence's MTP rows follow its computed rows where it drafts
        def step(self):
            done = super().step()
            for seq in self.sched.running + done:
                if seq.mtp_computed >= 0:
                    seq.mtp_computed = seq.num_computed
            return done

    sched, cache = _sched()
    dev = MtpDevice(sched)
    prompt = list(range(10, 23))  # 13 tokens: 3 full blocks, a checkpoint at 12
    plain = _seq(prompt, rid="plain")
    sched.add(plain)
    dev.step()
    plain.mtp_computed = -1  # it skipped its MTP pass: its blocks are registered without MTP rows
    dev.run([])
    old = [e.block for e in (cache.index[k] for k in plain.prefix.keys[:3])]
    assert not any(cache.by_block[b].mtp for b in old)
    sched.mtp_wanted = lambda seq, start, hit: seq.request_id != "holder"
    holder = _seq(prompt + [1, 2, 3, 4], rid="holder", max_tokens=20)
    sched.add(holder)
    dev.step()
    assert holder.num_cached_tokens == 12 and holder.mtp_computed == -1 and not holder.mtp_recompute
    drafter = _seq(prompt + [5], rid="drafter")
    dev.run([drafter])  # (the holder runs on meanwhile)
    assert drafter.num_cached_tokens == 0 and drafter.mtp_recompute
    entries = [cache.index[k] for k in plain.prefix.keys[:3]]
    assert all(e.mtp for e in entries) and not set(e.block for e in entries) & set(old)
    assert not set(old) & set(cache.by_block)
    again = _seq(prompt + [6], rid="again")
    sched.add(again)
    dev.step()
    assert again.num_cached_tokens == 12 and again.mtp_computed == 14 and not again.mtp_recompute
    dev.run([])
    assert _full(sched, cache)
    sched.blocks.free(sched.blocks.allocate(sched.blocks.num_free))  # every idle cached block evicted: the old
    assert not cache.index  # ones are no longer the index's
