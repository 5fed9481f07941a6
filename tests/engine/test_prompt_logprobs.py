"""prompt_logprobs: every prompt token's logprob equals transformers' log-softmax at the position
before it, whatever the prefill chunk size; top-k entries and ranks agree; mixed batches."""

import pytest
from helpers import oracle_bound, random_prompts
from tpserve import LLM, SamplingParams


@pytest.fixture(scope="module")
def path(tiny):
    return tiny("default")


def _llm(path, chunk):
    return LLM(str(path), device="cpu", skip_tokenizer_init=True, block_size=16, kv_cache_memory="4MiB",
               max_num_batched_tokens=chunk)


def _values(out):
    plp = out.prompt_logprobs
    assert plp[0] is None
    return plp


def test_prompt_logprobs_match_transformers_and_chunking(path):
    prompts = random_prompts([45, 7], seed=11)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=3)
    runs = {chunk: _llm(path, chunk).generate([{"prompt_token_ids": p} for p in prompts], params)
            for chunk in (16, 256)}  # 45 tokens in three chunks vs in one
    for k, prompt in enumerate(prompts):
        bound, exact = oracle_bound(path, prompt)
        ref, tol = exact.log_softmax(-1), 2 * bound  # log_softmax moves by at most 2x the logit error
        a, b = _values(runs[16][k]), _values(runs[256][k])
        assert len(a) == len(b) == len(prompt)
        for p in range(1, len(prompt)):
            tok = prompt[p]
            # the oracle bound of the model's logits (tests/helpers.py: oracle_bound), through log_softmax
            assert abs(a[p][tok].logprob - float(ref[p - 1, tok])) <= tol
            assert abs(a[p][tok].logprob - b[p][tok].logprob) <= 2 * tol
            above = lambda margin: int((ref[p - 1] > ref[p - 1, tok] + margin).sum())  # noqa: E731
            assert above(tol) + 1 <= a[p][tok].rank <= above(-tol) + 1  # rank, up to near-ties
            top = sorted((lp.rank, t) for t, lp in a[p].items() if lp.rank <= 3)
            assert [t for _, t in top][:3] == ref[p - 1].topk(3).indices.tolist()
            assert set(a[p]) - {tok} <= set(ref[p - 1].topk(3).indices.tolist())


def test_prompt_logprobs_off_and_mixed_batch(path):
    llm = _llm(path, 32)
    prompts = random_prompts([20, 30], seed=12)
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    plain = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy)
    assert all(o.prompt_logprobs is None for o in plain)
    # one request with prompt_logprobs=0 batched with one without: generated tokens unchanged
    llm.engine.add_request("a", prompts[0], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                           prompt_logprobs=0))
    llm.engine.add_request("b", prompts[1], greedy)
    finals = {}
    while llm.engine.has_unfinished():
        for out in llm.engine.step():
            finals[out.request_id] = out
    assert finals["a"].outputs[0].token_ids == plain[0].outputs[0].token_ids
    assert finals["b"].outputs[0].token_ids == plain[1].outputs[0].token_ids
    assert finals["b"].prompt_logprobs is None
    plp = finals["a"].prompt_logprobs
    assert len(plp) == 20 and all(set(e) == {prompts[0][i]} for i, e in enumerate(plp) if i)


def test_prompt_logprobs_validation():
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=1.5)
