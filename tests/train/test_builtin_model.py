"""The shipped demo model: the default of LLM()/serve, its tokenizer, and what it can do."""

from __future__ import annotations

import pytest


def test_default_model_is_the_shipped_demo(monkeypatch):
    from tpserve.engine.setup import DEMO_NAME, builtin_demo_model, default_model

    demo = builtin_demo_model()
    assert demo is not None and demo.name == DEMO_NAME
    monkeypatch.delenv("TPSERVE_DEFAULT_MODEL", raising=False)
    assert default_model() == demo
    monkeypatch.setenv("TPSERVE_DEFAULT_MODEL", "tiny")
    assert default_model().name.startswith("tiny-glm5-next")


def test_shipped_files_fit_the_budget():
    from tpserve.engine.setup import builtin_demo_model

    total = sum(f.stat().st_size for f in builtin_demo_model().iterdir() if f.is_file())
    assert total <= 25 * 10**6


def test_tokenizer_digits_tags_and_chat_template():
    from transformers import AutoTokenizer

    from tpserve.engine.setup import builtin_demo_model
    from tpserve.server.tool_calls import parse_tool_calls

    tok = AutoTokenizer.from_pretrained(str(builtin_demo_model()))
    pieces = [tok.decode([i]) for i in tok.encode("1, 20, 300")]
    assert pieces == ["1", ",", " 2", "0", ",", " 3", "0", "0"]
    for tag in ("<tool_call>", "</tool_call>", "<arg_key>", "<arg_value>", "<think>", "</think>", "<|observation|>"):
        assert len(tok.encode(tag)) == 1, tag
    tools = [{"type": "function", "function": {"name": "get_price", "parameters": {
        "type": "object", "properties": {"item": {"type": "string"}, "count": {"type": "integer"}}}}}]
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_price",
                                                             "arguments": {"item": "tea", "count": 3}}}]}
    text = tok.apply_chat_template([{"role": "user", "content": "price?"}, call], tools=tools, tokenize=False,
                                   enable_thinking=False)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    answer = text.split("<|assistant|><think></think>")[-1]
    _, calls = parse_tool_calls(answer, tools)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("get_price", '{"item": "tea", "count": 3}')]


@pytest.mark.timeout(300)
def test_demo_model_counts():
    from tpserve import LLM, SamplingParams
    from tpserve.engine.setup import builtin_demo_model

    llm = LLM(str(builtin_demo_model()), device="cpu", dtype="float32", kv_cache_memory="16MiB", block_size=16,
              max_num_seqs=4)
    tok = llm.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "Count from 1 to 10."}], tokenize=False,
                                     add_generation_prompt=True, enable_thinking=False)
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20))[0].outputs[0].text
    llm.shutdown()
    assert out.startswith("1, 2, 3, 4, 5, 6, 7, 8, 9, 10"), out


@pytest.mark.timeout(300)
def test_demo_model_speculates_in_the_published_layout():
    """Its MTP layer loads as the drafter (no hc_* tensors) and greedy output equals plain decoding's."""
    from tpserve import LLM, SamplingParams
    from tpserve.engine.setup import builtin_demo_model

    prompts = ["Count from 1 to 30.", "Write a JSON object with keys name and city for Ana from Lisbon."]
    outs, accepted = [], None
    for spec in (None, {"method": "mtp", "num_speculative_tokens": 3}):
        llm = LLM(str(builtin_demo_model()), device="cpu", dtype="float32", kv_cache_memory="16MiB", block_size=16,
                  max_num_seqs=4, speculative_config=spec)
        tok = llm.get_tokenizer()
        chats = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True,
                                         enable_thinking=False) for p in prompts]
        outs.append([r.outputs[0].token_ids for r in llm.generate(chats, SamplingParams(temperature=0, max_tokens=40))])
        if spec is not None:
            m = {x.name: x.value for x in llm.get_metrics()}
            accepted = m["tpserve:spec_decode_num_accepted_tokens"] / m["tpserve:spec_decode_num_draft_tokens"]
        llm.shutdown()
    assert outs[0] == outs[1]
    assert accepted >= 0.6, accepted  # the demo model's MTP target
