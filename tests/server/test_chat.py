"""Chat template rendering and OpenAI message normalization."""

from __future__ import annotations

import json

import pytest

from tpserve.model.tiny_tokenizer import write_tiny_tokenizer
from tpserve.server.chat import (
    ParamError,
    apply_chat_template,
    default_chat_template,
    normalize_messages,
    thinking_enabled,
)
from tpserve.server.parsers import ReasoningMode, parse_chat_output, reasoning_mode_for_prompt

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tok")
    write_tiny_tokenizer(path, 512)
    return AutoTokenizer.from_pretrained(path)


def test_simple_prompt_thinking_on_and_off(tokenizer):
    on = apply_chat_template(tokenizer, USER, None)
    assert on == "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Hi<|assistant|><think>"
    off = apply_chat_template(tokenizer, USER, None, enable_thinking=False)
    assert off == "[gMASK]<sop><|user|>Hi<|assistant|><think></think>"
    assert apply_chat_template(tokenizer, USER, None, reasoning_effort="none") == off
    kwargs_off = apply_chat_template(
        tokenizer, USER, None, chat_template_kwargs={"enable_thinking": False}
    )
    assert kwargs_off == off
    reserved = {"tokenize": True, "add_generation_prompt": False, "messages": []}
    assert apply_chat_template(tokenizer, USER, None, chat_template_kwargs=reserved) == on
    assert reasoning_mode_for_prompt(on) is ReasoningMode.OPEN
    assert reasoning_mode_for_prompt(off) is ReasoningMode.OFF
    assert apply_chat_template(tokenizer, USER, None, add_generation_prompt=False).endswith("Hi")


@pytest.mark.parametrize(
    "effort,label",
    [("low", "Low"), ("minimal", "Low"), ("medium", "Medium"), (" HIGH ", "High"),
     ("max", "Max"), ("xhigh", "Max"), (None, "Max")],
)
def test_reasoning_effort_line(tokenizer, effort, label):
    prompt = apply_chat_template(tokenizer, USER, None, reasoning_effort=effort)
    assert prompt.startswith(f"[gMASK]<sop><|system|>Reasoning Effort: {label}<|user|>")


def test_bad_reasoning_effort(tokenizer):
    with pytest.raises(ParamError) as info:
        apply_chat_template(tokenizer, USER, None, reasoning_effort="extreme")
    assert info.value.param == "reasoning_effort"
    assert thinking_enabled("none", None) is False
    assert thinking_enabled("high", False) is False
    assert thinking_enabled(None, None) is True


def test_tools_are_listed(tokenizer):
    prompt = apply_chat_template(tokenizer, USER, TOOLS)
    assert "<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) + "\n</tools>" in prompt
    assert "<tool_call>{function-name}<arg_key>" in prompt
    assert prompt.index("# Tools") < prompt.index("<|user|>Hi")


def test_tool_call_history_and_observations(tokenizer):
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather"},
                                     {"type": "text", "text": "in Oslo?"}]},
        {"role": "assistant", "content": None, "reasoning_content": "use the tool",
         "tool_calls": [
             {"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}},
             {"id": "call_2", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "007"}'}},
         ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "9 C"}]},
    ]
    prompt = apply_chat_template(tokenizer, messages, TOOLS, enable_thinking=False)
    tail = prompt[prompt.index("<|system|>Be brief.") :]
    assert tail == (
        "<|system|>Be brief.<|user|>Weather\nin Oslo?<|assistant|><think>use the tool</think>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>007</arg_value></tool_call>"
        "<|observation|><tool_response>12 C</tool_response><tool_response>9 C</tool_response>"
        "<|assistant|><think></think>"
    )
    normalized = normalize_messages(messages)
    assert normalized[0]["role"] == "system"
    assert normalized[3]["name"] == "get_weather"


def test_old_reasoning_is_dropped(tokenizer):
    messages = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning_content": "old thoughts"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "<think>inline</think>\nA2"},
    ]
    prompt = apply_chat_template(tokenizer, messages, None, add_generation_prompt=False)
    assert "old thoughts" not in prompt
    assert "<|assistant|><think></think>A1<|user|>Q2<|assistant|><think>inline</think>A2" in prompt
    kept = apply_chat_template(
        tokenizer, messages, None, add_generation_prompt=False,
        chat_template_kwargs={"clear_thinking": False},
    )
    assert "<think>old thoughts</think>A1" in kept


def test_returned_turn_rerenders_as_generated(tokenizer):
    """A parsed assistant turn sent back renders to the exact text the model produced."""
    prompt = apply_chat_template(tokenizer, USER, TOOLS)
    generated = (
        "Need weather.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value>Oslo</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
    )
    message = parse_chat_output(generated, reasoning_mode_for_prompt(prompt), TOOLS)
    follow = [{"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "ok"}]
    next_prompt = apply_chat_template(tokenizer, [*USER, message, *follow], TOOLS)
    assert next_prompt.startswith(prompt + generated)


def test_fallback_and_override_templates(tokenizer):
    expected = apply_chat_template(tokenizer, USER, None)
    assert apply_chat_template(None, USER, None) == expected
    saved = tokenizer.chat_template
    tokenizer.chat_template = None
    try:
        assert apply_chat_template(tokenizer, USER, None) == expected
    finally:
        tokenizer.chat_template = saved
    custom = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    assert apply_chat_template(tokenizer, USER, None, chat_template=custom) == "[user]Hi"
    assert tokenizer.chat_template == default_chat_template()


@pytest.mark.parametrize(
    "messages,param",
    [
        ([], "messages"),
        ("hello", "messages"),
        (["hi"], "messages[0]"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
         "messages[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text"),
        ([{"role": "assistant", "tool_calls": [{"type": "function",
                                                "function": {"name": "f", "arguments": "{"}}]}],
         "messages[0].tool_calls[0].function.arguments"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
         "messages[0].tool_calls[0].function.arguments"),
        ([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
         "messages[0].tool_calls[0].function.name"),
        ([{"role": "tool", "content": "x", "tool_call_id": 3}], "messages[0].tool_call_id"),
    ],
)
def test_malformed_messages(tokenizer, messages, param):
    with pytest.raises(ValueError) as info:
        apply_chat_template(tokenizer, messages, None)
    assert isinstance(info.value, ParamError)
    assert info.value.param == param
    assert param in str(info.value)


def test_malformed_tools(tokenizer):
    with pytest.raises(ParamError, match=r"tools\[0\].function.name"):
        apply_chat_template(tokenizer, USER, [{"type": "function", "function": {}}])


def test_prompt_tokenizes_tags_as_single_ids(tokenizer):
    prompt = apply_chat_template(tokenizer, USER, TOOLS)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert tokenizer.decode(ids) == prompt
    assert ids[:2] == tokenizer.convert_tokens_to_ids(["[gMASK]", "<sop>"])
    assert ids[-2:] == tokenizer.convert_tokens_to_ids(["<|assistant|>", "<think>"])
