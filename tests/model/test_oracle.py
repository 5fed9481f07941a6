"""Greedy tokens and prefill logits against transformers 5.23.0 (fp32, CPU)."""

import pytest
import torch

from helpers import TINY_CONFIGS, assert_logits_match_oracle, prefill_logits, random_prompts, reference_greedy
from tpserve import LLM, SamplingParams

LENGTHS = (7, 45, 90, 23)  # index_topk is 16/24: most prompts need the sparse selection
NEW_TOKENS = 12


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_greedy_and_logits_match_transformers(tiny, name):
    path = tiny(name)
    prompts = random_prompts(LENGTHS, seed=len(name))
    # a small token budget forces chunked prefill mixed with decodes
    llm = LLM(str(path), device="cpu", kv_cache_memory="8MiB", block_size=16, max_num_batched_tokens=40)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == reference_greedy(path, prompt, NEW_TOKENS), f"prompt of {len(prompt)}"
    ours = prefill_logits(llm, prompts[2])
    assert_logits_match_oracle(ours, path, prompts[2])
    with pytest.raises(AssertionError, match="float64 oracle"):  # the bound is tight enough to catch a bug
        assert_logits_match_oracle(ours + 1e-3 * ours.abs().max(), path, prompts[2])
    assert llm.engine.block_pool.num_free == llm.engine.block_pool.num_blocks
    assert llm.engine.slot_pool.num_free == llm.engine.slot_pool.num_blocks


def test_query_blocking_does_not_change_logits(tiny, monkeypatch):
    from tpserve.model import indexer, mla

    llm = LLM(str(tiny("default")), device="cpu", kv_cache_memory="8MiB", block_size=16)
    prompt = random_prompts([90], seed=3)[0]
    whole = prefill_logits(llm, prompt)
    monkeypatch.setattr(mla, "QUERY_BLOCK", 7)
    monkeypatch.setattr(indexer, "QUERY_BLOCK", 5)
    torch.testing.assert_close(prefill_logits(llm, prompt), whole, atol=1e-6, rtol=1e-6)
