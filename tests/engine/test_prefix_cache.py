"""Prefix caching on the tiny checkpoint (engine/prefix_cache.py): what a later request reuses, and the same
greedy tokens and logprobs (within fp32 rounding) as an engine without the cache, for hits mid-prompt, turns
that continue through an earlier answer, chunked prefill and a pool small enough to evict and preempt."""

import pytest

from helpers import random_prompts
from tpserve import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2)
LOGPROB_TOL = 1e-4  # fp32: another chunking of the same positions reassociates sums (~1e-6 seen)


@pytest.fixture(scope="module")
def path(tiny):
    return str(tiny("default"))


def _llm(path, **kw):
    kw.setdefault("kv_cache_memory", "8MiB")
    kw.setdefault("max_num_batched_tokens", 32)  # chunked prefill
    return LLM(path, device="cpu", skip_tokenizer_init=True, block_size=16, **kw)


@pytest.fixture(scope="module")
def off(path):
    return _llm(path, enable_prefix_caching=False)


def _p(ids, salt=None):
    return {"prompt_token_ids": ids, **({"cache_salt": salt} if salt else {})}


def _same(got, want):
    """Identical tokens; logprobs of every reported token within fp32 rounding."""
    for x, y in zip(got, want):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        for lx, ly in zip(x.outputs[0].logprobs, y.outputs[0].logprobs):
            assert lx.keys() == ly.keys()
            assert max(abs(lx[t].logprob - ly[t].logprob) for t in lx) < LOGPROB_TOL


def _pools_full(llm):
    e = llm.engine
    ck = e.prefix_cache.ckpts
    return (e.block_pool.num_free == e.block_pool.num_blocks and e.slot_pool.num_free == e.slot_pool.num_blocks
            and ck.rolling == 0 and len(ck.free) + len(ck.lru) == ck.capacity)


def test_turns_and_shared_prefixes_reuse_the_cache_with_the_same_tokens(path, off):
    on = _llm(path)
    system, user1, user2, user3, more = random_prompts([70, 21, 9, 13, 15], seed=31)
    first = on.generate([_p(system + user1)], GREEDY)[0]
    assert first.num_cached_tokens == 0
    # the next turn: the whole first prompt and answer come back, then a new message; the answer's last full block
    # (91 + 20 tokens: position 96 was landed on while decoding) is where it resumes
    turn2 = system + user1 + first.outputs[0].token_ids + more
    second = on.generate([_p(turn2)], GREEDY)[0]
    assert second.num_cached_tokens == 96
    # the same system prompt, other questions: the second finds the blocks but no state at their end (64) and
    # keeps one there; the third resumes at it, mid-prompt
    other = on.generate([_p(system + user2)], GREEDY)[0]
    third = on.generate([_p(system + user3)], GREEDY)[0]
    assert other.num_cached_tokens == 0 and third.num_cached_tokens == 64
    want = off.generate([_p(system + user1), _p(turn2), _p(system + user2), _p(system + user3)], GREEDY)
    _same([first, second, other, third], want)
    stats = on.engine.stats()
    assert stats["prefix_cache_queries"] == 91 + len(turn2) + 79 + 83 and stats["prefix_cache_hits"] == 96 + 64
    metrics = {m.name: m for m in on.get_metrics()}
    assert metrics["tpserve:prefix_cache_hits"].kind == "counter" and metrics["tpserve:prefix_cache_hits"].value == 160
    assert metrics["tpserve:prefix_cache_queries"].value == stats["prefix_cache_queries"]
    assert _pools_full(on)


def test_concurrent_requests_share_blocks_and_salts_keep_tenants_apart(path, off):
    on = _llm(path, max_num_batched_tokens=64)
    stem, *tails = random_prompts([40, 5, 6, 7, 8], seed=32)
    on.generate([_p(stem + tails[0], "a")], GREEDY)
    outs = on.generate([_p(stem + t, salt) for t, salt in zip(tails, ("a", "a", "b", None))], GREEDY)
    # (the first: the prompt checkpoint at 32 of the same salt; the others find none at their branch point yet)
    assert [o.num_cached_tokens for o in outs] == [32, 32, 0, 0]
    _same(outs, off.generate([_p(stem + t) for t in tails], GREEDY))
    for bad in ("", 7):
        with pytest.raises(ValueError, match="cache_salt"):
            on.generate([{"prompt_token_ids": stem, "cache_salt": bad}], GREEDY)
    assert _pools_full(on)


def test_reset_forgets_and_prompt_logprobs_compute_every_row(path, off):
    on = _llm(path)
    prompt = random_prompts([50], seed=33)[0]
    on.generate([_p(prompt)], GREEDY)
    assert on.generate([_p(prompt)], GREEDY)[0].num_cached_tokens == 48
    assert on.reset_prefix_cache() is True
    assert on.engine.stats()["prefix_cache_blocks"] == 0
    assert on.generate([_p(prompt)], GREEDY)[0].num_cached_tokens == 0
    lp = SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=1)
    got = on.generate([_p(prompt)], lp)[0]
    want = off.generate([_p(prompt)], lp)[0]
    assert got.num_cached_tokens == 0 and got.outputs[0].token_ids == want.outputs[0].token_ids
    assert [None if e is None else sorted(e) for e in got.prompt_logprobs] == \
        [None if e is None else sorted(e) for e in want.prompt_logprobs]
    assert off.reset_prefix_cache() is False
    assert _pools_full(on)


def test_tiny_pool_evicts_and_preempts_and_every_request_finishes_exactly(path, off):
    """A pool of 12 blocks and 3 checkpoints for 3 conversations of 2 turns at once: blocks and checkpoints are
    evicted and requests preempted while others hold theirs; every answer equals the uncached engine's and
    the pools are whole afterwards."""
    import torch

    from tpserve.model.cache import bytes_per_block, bytes_per_slot
    from tpserve.model.config import ModelConfig

    cfg = ModelConfig.from_file(path)
    state = 3 * bytes_per_slot(cfg, 1, torch.float32)
    budget = 12 * bytes_per_block(cfg, 16, torch.float32) + 3 * bytes_per_slot(cfg, 1, torch.float32) + state
    on = _llm(path, kv_cache_memory=budget, max_num_seqs=3, prefix_state_memory=state)
    assert on.engine.block_pool.num_blocks == 12 and on.engine.prefix_cache.ckpts.capacity == 3
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    prompts = random_prompts([40, 33, 45], seed=34)
    news = random_prompts([7, 7, 7], seed=35)
    first = on.generate([_p(p) for p in prompts], sp)
    _same(first, off.generate([_p(p) for p in prompts], sp))
    later = [_p(p + o.outputs[0].token_ids + n) for p, o, n in zip(prompts, first, news)]
    second = on.generate(later, sp)
    _same(second, off.generate(later, sp))
    stats = on.engine.stats()
    assert sum(o.num_cached_tokens for o in second) > 0 and stats["prefix_state_checkpoints_used"] <= 3
    assert on.engine.scheduler.num_preemptions > 0
    assert _pools_full(on)


def test_checkpoints_inside_a_chunk_cost_no_step_and_a_second_one_ends_it(path, off):
    """A 91-token prompt in one 128-token chunk keeps its last full block's checkpoint (80) inside it: one prefill
    step. With checkpoints every 32 tokens too, the chunk keeps 32 inside and ends at 64 (kept before the next
    step), which keeps 80: two prefill steps. Later requests resume at each with the uncached engine's tokens."""
    prompt, other, short = random_prompts([91, 9, 6], seed=36)
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2)
    want = off.generate([_p(prompt), _p(prompt), _p(prompt[:70] + other), _p(prompt[:40] + short)], sp)
    for interval, prefill_steps, cached in ((0, 1, [0, 80, 0, 0]), (32, 2, [0, 80, 64, 32])):
        on = _llm(path, max_num_batched_tokens=128, prefix_state_interval=interval)
        first = on.generate([_p(prompt)], sp)[0]
        assert on.engine.step_count == prefill_steps + sp.max_tokens - 1
        again = on.generate([_p(prompt)], sp)[0]
        branch = on.generate([_p(prompt[:70] + other)], sp)[0]
        early = on.generate([_p(prompt[:40] + short)], sp)[0]
        got = [first, again, branch, early]
        assert [o.num_cached_tokens for o in got] == cached
        _same(got, want)
        assert _pools_full(on)
