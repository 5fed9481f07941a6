"""--prefill-together: a step's prefill sequences attend (model/mla.py) and select (model/indexer.py) together rather
than one at a time: the tokens are the oracle's, and equal those of the one-at-a-time paths (the switch off)."""

import pytest
import torch

from helpers import random_prompts, reference_greedy
from tpserve import LLM, SamplingParams
from tpserve.model import indexer, mla

PARAMS = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=0)


def _run(path, prompts, monkeypatch, batched: bool, budget: int):
    calls = {"attend": 0, "select": 0}
    for name, cls, attr in (("attend", mla.MlaAttention, "_prefill_batched"),
                            ("select", indexer.Indexer, "_select_prefill")):
        original = getattr(cls, attr)

        def counted(self, *a, _original=original, _name=name, **kw):
            calls[_name] += 1
            return _original(self, *a, **kw)
        monkeypatch.setattr(cls, attr, counted)
    llm = LLM(str(path), device="cpu", kv_cache_memory="8MiB", block_size=16, max_num_batched_tokens=budget,
              prefill_together=batched)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)
    finally:
        llm.shutdown()
        monkeypatch.undo()
    return [o.outputs[0].token_ids for o in outs], [o.outputs[0].logprobs for o in outs], calls


@pytest.mark.parametrize("name", ["default", "variant", "notail", "shared"])
def test_prefills_together_match_the_oracle_and_one_at_a_time(tiny, monkeypatch, name):
    path = tiny(name)
    # short prompts: every pool they see is kept, so they also select together; the 41-token one is chunked
    # (a chunk with cached context beside new prompts) and past the top-k, so the steps with it select one at a time
    for lengths, budget in (((5, 11, 3, 9), 64), ((41, 6, 13, 2), 24)):
        prompts = random_prompts(lengths, seed=len(name) + budget)
        tokens, logprobs, calls = _run(path, prompts, monkeypatch, batched=True, budget=budget)
        alone, alone_logprobs, alone_calls = _run(path, prompts, monkeypatch, batched=False, budget=budget)
        assert calls["attend"] > 0 and alone_calls == {"attend": 0, "select": 0}
        assert calls["select"] > 0 or budget == 24
        assert tokens == alone
        for ours, theirs in zip(logprobs, alone_logprobs):
            torch.testing.assert_close(torch.tensor([next(iter(d.values())).logprob for d in ours]),
                                       torch.tensor([next(iter(d.values())).logprob for d in theirs]),
                                       atol=1e-5, rtol=1e-5)
        for prompt, out in zip(prompts, tokens):
            assert out == reference_greedy(path, prompt, len(out)), f"prompt of {len(prompt)}"


def test_dense_prefill_attention_never_takes_cudnn(tiny, monkeypatch):
    """The dense prefill's SDPA runs with cuDNN's backend off (model/mla.DENSE_SDPA): cuDNN builds a plan for every
    new shape, so each new prompt length would wait for one (0.4-0.65 s a call on an H100)."""
    enabled = []
    sdpa = mla.F.scaled_dot_product_attention

    def recorded(*a, **kw):
        enabled.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*a, **kw)

    monkeypatch.setattr(mla.F, "scaled_dot_product_attention", recorded)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # (on by default: what the context turns off)
    llm = LLM(str(tiny("default")), device="cpu", kv_cache_memory="8MiB", mla_prefill="dense")
    try:
        llm.generate([{"prompt_token_ids": p} for p in random_prompts((7, 12), seed=3)], PARAMS)
    finally:
        llm.shutdown()
    assert enabled and not any(enabled)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # (restored after each call)
