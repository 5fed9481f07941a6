"""Engine: continuous batching gives the same tokens as running alone; preemption; exact freeing."""

import pytest
import torch

from helpers import random_prompts
from tpserve import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def path(tiny):
    return str(tiny("default"))


def _llm(path, **kw):
    kw.setdefault("kv_cache_memory", "4MiB")
    return LLM(path, device="cpu", skip_tokenizer_init=True, block_size=16, **kw)


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def _pools_full(llm):
    e = llm.engine
    return e.block_pool.num_free == e.block_pool.num_blocks and e.slot_pool.num_free == e.slot_pool.num_blocks


def test_sixteen_concurrent_equal_alone(path):
    prompts = [{"prompt_token_ids": p} for p in random_prompts([3 + 7 * i for i in range(16)], seed=5)]
    llm = _llm(path, max_num_batched_tokens=64, max_num_seqs=16)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)  # the batch changes from the first step
    together = _tokens(llm.generate(prompts, params))
    alone = [_tokens(llm.generate([p], params))[0] for p in prompts]
    assert together == alone
    assert _pools_full(llm)


def test_preemption_recomputes_same_tokens(path):
    prompts = [{"prompt_token_ids": p} for p in random_prompts([40, 50, 60, 45, 55], seed=6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    roomy = _tokens(_llm(path).generate(prompts, params))
    # 20 blocks of 16 tokens cannot hold five sequences of ~75 tokens: the scheduler must preempt
    from tpserve.model.cache import bytes_per_block, bytes_per_slot
    from tpserve.model.config import ModelConfig

    cfg = ModelConfig.from_file(path)
    state = 4 * bytes_per_slot(cfg, 1, torch.float32)  # four prefix-cache state checkpoints
    budget = 20 * bytes_per_block(cfg, 16, torch.float32) + 5 * bytes_per_slot(cfg, 1, torch.float32) + state
    tight = _llm(path, kv_cache_memory=budget, max_num_seqs=5, prefix_state_memory=state)
    assert tight.engine.block_pool.num_blocks == 20
    assert _tokens(tight.generate(prompts, params)) == roomy
    assert tight.engine.scheduler.num_preemptions > 0
    assert tight.engine.num_overlapped > 0  # async scheduling ran between the preemptions (engine/overlap.py)
    assert _pools_full(tight)


def test_abort_frees_everything(path):
    llm = _llm(path, max_num_batched_tokens=32)
    for i, p in enumerate(random_prompts([30, 70, 5], seed=7)):
        llm.engine.add_request(f"r{i}", p, SamplingParams(max_tokens=50))
    for _ in range(4):
        llm.engine.step()
    assert not _pools_full(llm)
    for i in range(3):
        assert llm.engine.abort(f"r{i}")
    assert _pools_full(llm) and not llm.engine.has_unfinished()


def test_stop_token_ids_and_eos(path):
    llm = _llm(path)
    prompt = {"prompt_token_ids": random_prompts([12], seed=8)[0]}
    free = _tokens(llm.generate([prompt], GREEDY))[0]
    stop_at = free[4]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_at]))[0].outputs[0]
    assert out.token_ids == free[:free.index(stop_at) + 1] and out.finish_reason == "stop"
    assert out.stop_reason == stop_at
    llm.engine.eos_ids = frozenset([stop_at])  # every EOS id ends generation unless ignore_eos
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10))[0].outputs[0]
    assert out.token_ids[-1] == stop_at and out.finish_reason == "stop"
    out = llm.generate([prompt], GREEDY)[0].outputs[0]
    assert out.token_ids == free


def test_seeded_sampling_is_reproducible_and_n(path):
    llm = _llm(path)
    prompt = {"prompt_token_ids": random_prompts([9], seed=9)[0]}
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=123, max_tokens=12, ignore_eos=True)
    a = _tokens(llm.generate([prompt], p))
    b = _tokens(llm.generate([prompt, prompt], p))
    assert a[0] == b[0] == b[1]
    many = llm.generate([prompt], SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12, ignore_eos=True))[0]
    assert len(many.outputs) == 3 and len({tuple(c.token_ids) for c in many.outputs}) > 1


def test_logprobs_and_penalties(path):
    llm = _llm(path)
    prompt = {"prompt_token_ids": random_prompts([9], seed=10)[0]}
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, logprobs=3, ignore_eos=True))[0].outputs[0]
    assert len(out.logprobs) == 6
    for tok, entry in zip(out.token_ids, out.logprobs):
        assert entry[tok].rank == 1 and len(entry) == 3  # greedy: the chosen token is the top one


def test_penalties_follow_vllm_semantics():
    from tpserve.engine import sampler
    from tpserve.engine.request import Sequence

    seq = Sequence("r", 0, [1, 2], SamplingParams(temperature=0, repetition_penalty=2.0, presence_penalty=0.5,
                                                  frequency_penalty=0.25), 10, frozenset())
    seq.output_ids = [3, 3, 4]
    logits = torch.tensor([[1.0, 2.0, -2.0, 4.0, 1.0, 1.0]])
    out = sampler._apply_penalties(logits.clone(), [seq])[0]
    # repetition: prompt and output tokens, positive logits divided, negative multiplied
    # presence / frequency: output tokens only
    expected = torch.tensor([1.0, 1.0, -4.0, 2.0 - 0.5 - 0.5, 0.5 - 0.5 - 0.25, 1.0])
    torch.testing.assert_close(out, expected)
    greedy = sampler.sample(logits.clone(), [seq], torch.Generator())
    assert greedy[0].token != 3  # token 3 led before the penalties


def test_min_tokens_holds_back_stop(path):
    llm = _llm(path)
    prompt = {"prompt_token_ids": random_prompts([12], seed=8)[0]}
    free = _tokens(llm.generate([prompt], GREEDY))[0]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, min_tokens=6,
                                                stop_token_ids=[free[0]]))[0].outputs[0]
    assert len(out.token_ids) >= 6


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"),
    (dict(n=0), "n"), (dict(logprobs=50), "logprobs"), (dict(stop=[""]), "stop"),
])
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_bad_requests_are_refused_and_nothing_leaks(path):
    llm = _llm(path, max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([{"prompt_token_ids": [5] * 60}], SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="out of range"):
        llm.generate([{"prompt_token_ids": [10**6]}])
    with pytest.raises(ValueError, match="empty"):
        llm.generate([{"prompt_token_ids": []}])
    with pytest.raises(ValueError, match="logit_bias"):  # an id the vocabulary does not have: not skipped
        llm.generate([{"prompt_token_ids": [5]}], SamplingParams(logit_bias={10**6: 5.0}))
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate(["text needs a tokenizer"])
    assert _pools_full(llm) and not llm.engine.has_unfinished()


def test_stop_strings_and_text(tiny):
    llm = LLM(str(tiny("default")), device="cpu", kv_cache_memory="4MiB")
    free = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    text = free.outputs[0].text
    stop = text[5:8]
    if not stop.strip("\ufffd") or "\ufffd" in stop:
        pytest.skip("random output has no clean substring to stop on")
    out = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                            stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[:text.index(stop)]
