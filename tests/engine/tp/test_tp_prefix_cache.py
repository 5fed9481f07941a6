"""Prefix caching at TP=2 on CPU (gloo): every rank applies the same state checkpoint copies, so a later turn
resumes from the cache with the greedy tokens of TP=1 without it."""

from helpers import random_prompts
from tpserve import LLM, SamplingParams

KW = dict(device="cpu", kv_cache_memory="8MiB", block_size=16, max_num_batched_tokens=32, sequence_parallel=False)


def _turns(llm, sp):
    system, user1, user2, user3, more = random_prompts([70, 21, 9, 13, 15], seed=41)
    first = llm.generate([{"prompt_token_ids": system + user1}], sp)[0]
    later = [system + user1 + first.outputs[0].token_ids + more, system + user2, system + user3]
    outs = [first] + [llm.generate([{"prompt_token_ids": p}], sp)[0] for p in later]
    return [o.outputs[0].token_ids for o in outs], [o.num_cached_tokens for o in outs]


def test_prefix_cache_at_tp2_gives_tp1_uncached_tokens(tiny):
    path = str(tiny("default"))
    sp = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain = LLM(path, enable_prefix_caching=False, **KW)
    try:
        want, _ = _turns(plain, sp)
    finally:
        plain.shutdown()
    llm = LLM(path, tensor_parallel_size=2, **KW)
    try:
        got, cached = _turns(llm, sp)
        assert got == want and cached == [0, 96, 0, 64]
        e = llm.engine
        assert e.executor.cache_shape.num_checkpoints > 0
        assert e.block_pool.num_free == e.block_pool.num_blocks and e.slot_pool.num_free == e.slot_pool.num_blocks
    finally:
        llm.shutdown()
