"""bench/host_overhead.py: its stand-in executor makes every draft accepted, so what it times is the
engine's host work for k + 1 tokens per step, and the engine's outputs follow the script."""

from __future__ import annotations

import pytest
from helpers import load_bench

from tpserve import LLM, SamplingParams


@pytest.mark.parametrize("chain,fused", [(0, False), (3, False), (3, True)], ids=["per-depth", "chain", "fused"])
def test_stand_in_drafts_are_all_accepted_and_follow_the_script(tiny, chain, fused):
    """chain 3: the speculator takes a chain graph's draws [2, depths, n] (engine/spec/speculator.py) and feeds
    each depth's drafts to the right sequence and position; fused: steps where every draft is pending run
    as fused steps (acceptance and next drafts from the executor at once: Speculator.verify_fused)."""
    mod = load_bench("host_overhead")
    llm = LLM(str(tiny("mtp")), device="cpu", max_num_seqs=8, kv_cache_memory="64MiB",
              speculative_config={"method": "mtp", "num_speculative_tokens": 3, "adaptive": False})
    mod.use_stand_in(llm, mod.StandInExecutor(llm.engine.executor, llm.engine.model_config.vocab_size, chain,
                                              fused=fused))
    calls = []
    if fused:
        execute_spec = llm.engine.executor.execute_spec
        llm.engine.executor.execute_spec = lambda plan, *rest: calls.append(plan) or execute_spec(plan, *rest)
    prompt = llm._tokens("Count from 1 to 5.")[0]
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=20,
                                                                     ignore_eos=True))[0].outputs[0].token_ids
    n = len(prompt)
    assert out == [mod.script_token(n + i) for i in range(20)]
    stats = llm.engine.stats()
    assert stats["spec_decode_num_accepted_tokens"] == stats["spec_decode_num_draft_tokens"] > 0
    assert (len(calls) >= 3) == fused  # 20 tokens: prefill, then 4 per step; the steps after the first fused
    step_ms, token_ms = mod.decode_ms(llm, ["Count from 1 to 5."], SamplingParams(temperature=0, max_tokens=17,
                                                                                  ignore_eos=True))
    assert step_ms > 0 and abs(step_ms / token_ms - 4) < 0.5  # k + 1 tokens per decode step
    llm.shutdown()


def test_stand_in_plain_decoding_follows_the_script_with_async_scheduling():
    """Plain decoding through the stand-in: async scheduling hands it the in-flight tokens (unused: its rows
    follow the positions), the outputs follow the script."""
    mod = load_bench("host_overhead")
    llm = mod.stand_in_llm(None, 0, False)
    prompt = llm._tokens("Count from 1 to 5.")[0]
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=12,
                                                                     ignore_eos=True))[0].outputs[0].token_ids
    assert out == [mod.script_token(len(prompt) + i) for i in range(12)]
    assert llm.engine.num_overlapped > 0
    llm.shutdown()
