"""Reasoning and GLM tool-call parsers: one-shot cases, and streaming at random chunk
boundaries (seeded) must equal the one-shot parse."""

from __future__ import annotations

import json
import random
import zlib

import pytest

from tpserve.server.parsers import (
    ChatOutputParser,
    ReasoningMode,
    ReasoningParser,
    ReasoningStreamParser,
    ToolCallStreamParser,
    chat_finish_reason,
    convert_argument,
    merge_deltas,
    parse_chat_output,
    parse_tool_calls,
    reasoning_mode_for_prompt,
    resolve_tool_choice,
    ToolPolicy,
)

WEATHER_PARAMS = {
    "city": {"type": "string"}, "days": {"type": "integer"}, "code": {"type": "string"},
    "metric": {"type": "boolean"}, "opts": {"type": "object"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "note": {"type": ["string", "null"]},
    "ratio": {"anyOf": [{"type": "number"}, {"type": "null"}]},
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": WEATHER_PARAMS}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]

WEATHER = (
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
    "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
)
TIME = "<tool_call>get_time</tool_call>"
WEATHER_45 = (
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>code</arg_key>\n<arg_value>007</arg_value>\n</tool_call>"
)


def random_chunks(text: str, rng: random.Random) -> list[str]:
    """Split text at random points (often 1-3 characters, so tags are cut everywhere)."""
    chunks, pos = [], 0
    while pos < len(text):
        size = rng.choice([1, 1, 2, 3, 5, 8, rng.randint(1, 40)])
        chunks.append(text[pos : pos + size])
        pos += size
    return chunks


def stream_reasoning(mode: ReasoningMode, chunks: list[str]) -> tuple[str, str, list[str]]:
    parser = ReasoningStreamParser(mode)
    reasoning, content, pieces = [], [], []
    for chunk in [*chunks, None]:
        r, c = parser.finish() if chunk is None else parser.feed(chunk)
        reasoning.append(r)
        content.append(c)
        pieces += [r, c]
    return "".join(reasoning), "".join(content), pieces


def collect(deltas: list[dict]) -> tuple[str, str, list[dict]]:
    """Accumulate OpenAI deltas like a client: (reasoning, content, calls)."""
    reasoning, content, calls = "", "", {}
    for delta in deltas:
        reasoning += delta.get("reasoning_content", "")
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            if "id" in call:
                assert call["id"].startswith("call_") and call["type"] == "function"
                assert call["index"] not in calls, "header sent twice"
                calls[call["index"]] = {"name": call["function"]["name"], "arguments": ""}
            calls[call["index"]]["arguments"] += call["function"].get("arguments", "")
    return reasoning, content, [calls[i] for i in sorted(calls)]


def strip_ids(calls: list[dict]) -> list[dict]:
    return [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]


REASONING_CASES = [
    (ReasoningMode.AUTO, "<think>plan it</think>\n\nThe answer.", ("plan it", "The answer.")),
    (ReasoningMode.AUTO, "\n<think>a < b</think>ok", ("a < b", "ok")),
    (ReasoningMode.AUTO, "Just an answer.", (None, "Just an answer.")),
    (ReasoningMode.AUTO, "no open tag</think>rest", (None, "no open tag</think>rest")),
    (ReasoningMode.AUTO, "<think>cut off by max_tokens", ("cut off by max_tokens", "")),
    (ReasoningMode.AUTO, "  <thi", (None, "  <thi")),
    (ReasoningMode.OPEN, "thinking</think>answer", ("thinking", "answer")),
    (ReasoningMode.OPEN, "<think>again</think>answer", ("again", "answer")),
    (ReasoningMode.OPEN, "never closed", ("never closed", "")),
    (ReasoningMode.OPEN, "</think>", ("", "")),
    (ReasoningMode.OPEN, "x </th", ("x </th", "")),
    (ReasoningMode.OFF, "<think>kept</think>as text", (None, "<think>kept</think>as text")),
    (ReasoningMode.AUTO, "<think>a</think>b</think>c", ("a", "b</think>c")),
]


@pytest.mark.parametrize("mode,text,expected", REASONING_CASES)
def test_reasoning_one_shot(mode, text, expected):
    assert ReasoningParser(mode).parse(text) == expected


@pytest.mark.parametrize("mode,text,expected", REASONING_CASES)
def test_reasoning_stream_matches_one_shot(mode, text, expected):
    rng = random.Random(zlib.crc32(f"{mode.value}:{text}".encode()))
    want_reasoning, want_content = ReasoningParser(mode).parse(text)
    splits = [[text], list(text)] + [random_chunks(text, rng) for _ in range(200)]
    for chunks in splits:
        reasoning, content, _ = stream_reasoning(mode, chunks)
        assert (reasoning, content) == (want_reasoning or "", want_content), chunks


def test_reasoning_stream_never_emits_partial_tags():
    text = "<think>step one\nstep two</think>\nfinal answer here"
    rng = random.Random(1)
    for _ in range(300):
        _, _, pieces = stream_reasoning(ReasoningMode.AUTO, random_chunks(text, rng))
        assert not any("<" in p or ">" in p for p in pieces)


def test_reasoning_holds_back_partial_close_tag():
    parser = ReasoningStreamParser(ReasoningMode.OPEN)
    assert parser.feed("abc</th") == ("abc", "")
    assert parser.feed("ink>def") == ("", "def")
    parser = ReasoningStreamParser(ReasoningMode.OPEN)
    assert parser.feed("abc</th") == ("abc", "")
    assert parser.feed("e end") == ("</the end", "")


def test_reasoning_mode_for_prompt():
    assert reasoning_mode_for_prompt("<|user|>hi<|assistant|><think>") is ReasoningMode.OPEN
    assert reasoning_mode_for_prompt("<|assistant|><think></think>") is ReasoningMode.OFF
    assert reasoning_mode_for_prompt("<|assistant|>\n<think></think>\n") is ReasoningMode.OFF
    assert reasoning_mode_for_prompt("<|assistant|>") is ReasoningMode.AUTO
    assert reasoning_mode_for_prompt("<|assistant|><think>", False) is ReasoningMode.OFF



STRING, NULLABLE = {"type": "string"}, {"type": ["string", "null"]}
ARGUMENT_CASES = [
    ("007", STRING, "007"), ('{"a": 1}', STRING, '{"a": 1}'), ("true", STRING, "true"),
    ("3", {"type": "integer"}, 3), (" 2.5 ", {"type": "number"}, 2.5),
    ("true", {"type": "boolean"}, True), ("False", {"type": "boolean"}, False),
    ('{"a": [1, 2]}', {"type": "object"}, {"a": [1, 2]}),
    ("{'a': 1}", {"type": "object"}, {"a": 1}),
    ('["x", "y"]', {"type": "array"}, ["x", "y"]), ("null", {"type": "null"}, None),
    ("three", {"type": "integer"}, "three"), ("null", NULLABLE, None), ("hello", NULLABLE, "hello"),
    ("12", NULLABLE, "12"), ("1.5", {"anyOf": [{"type": "number"}, {"type": "null"}]}, 1.5),
    ("celsius", {"enum": ["celsius", "fahrenheit"]}, "celsius"), ("42", None, 42),
    ("007", None, "007"), ("plain words", None, "plain words"), ("[1]", {"description": "x"}, [1]),
]


@pytest.mark.parametrize("raw,schema,expected", ARGUMENT_CASES)
def test_convert_argument(raw, schema, expected):
    assert convert_argument(raw, schema) == expected



def test_single_call_with_typed_arguments():
    content, calls = parse_tool_calls("Let me check.\n" + WEATHER, TOOLS)
    assert content == "Let me check."
    assert len(calls) == 1
    call = calls[0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert len(call["id"]) > len("call_") + 8
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "days": 3}


def test_string_param_stays_string_glm45_newlines():
    content, calls = parse_tool_calls(WEATHER_45, TOOLS)
    assert content == ""
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "code": "007"}


def test_no_argument_call_and_several_in_a_row():
    text = WEATHER + "\n" + TIME + "\n\n" + WEATHER_45
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == ""
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time", "get_weather"]
    assert calls[1]["function"]["arguments"] == "{}"
    assert len({c["id"] for c in calls}) == 3


def test_content_around_calls():
    content, calls = parse_tool_calls("Before. " + TIME + "\n After.\n", TOOLS)
    assert content == "Before.After.\n"
    assert len(calls) == 1


def test_all_types_and_unknown_params():
    text = (
        "<tool_call>get_weather<arg_key>metric</arg_key><arg_value>false</arg_value>"
        '<arg_key>opts</arg_key><arg_value>{"unit": "C"}</arg_value>'
        '<arg_key>tags</arg_key><arg_value>["a", "b"]</arg_value>'
        "<arg_key>note</arg_key><arg_value>null</arg_value>"
        "<arg_key>ratio</arg_key><arg_value>0.5</arg_value>"
        "<arg_key>extra</arg_key><arg_value>7</arg_value>"
        "<arg_key>words</arg_key><arg_value>not json</arg_value></tool_call>"
    )
    _, calls = parse_tool_calls(text, TOOLS)
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "metric": False, "opts": {"unit": "C"}, "tags": ["a", "b"], "note": None,
        "ratio": 0.5, "extra": 7, "words": "not json",
    }


def test_string_value_keeps_inner_whitespace_and_unicode():
    text = (
        "<tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value> São Paulo\n</arg_value></tool_call>"
    )
    _, calls = parse_tool_calls(text, TOOLS)
    assert calls[0]["function"]["arguments"] == '{"city": " São Paulo\\n"}'


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>bad name<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
        "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
        "<tool_call>f<arg_key>a</arg_key>no value</tool_call>",
        "<tool_call>f<arg_key>a</arg_key><arg_value>1</tool_call>",
        "<tool_call>f junk</tool_call>",
        "<tool_call>get_time never closed",
        "text with a lone </tool_call> closer",
    ],
)
def test_malformed_blocks_stay_content(text):
    content, calls = parse_tool_calls(text, TOOLS)
    assert calls == [] and content == text


def test_allowed_names_filter():
    text = WEATHER + TIME
    content, calls = parse_tool_calls(text, TOOLS, allowed_names={"get_time"})
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    assert content == WEATHER


TOOL_TEXTS = [
    "Let me check.\n" + WEATHER,
    WEATHER + "\n" + TIME + "\n" + WEATHER_45 + "\nDone.\n",
    "No tools here, just < and > signs and <tool text.",
    "Partial at end <tool_",
    "Broken " + "<tool_call>f junk</tool_call>" + " then " + TIME + " tail  ",
    "<tool_call>get_time unclosed <arg_key>",
    "a <tool_call>x <tool_call>get_time</tool_call> b",
    "  \n" + TIME + "  \n ",
    "",
]


def stream_tools(text: str, chunks: list[str], **kwargs) -> tuple[str, list[dict], list[dict]]:
    parser = ToolCallStreamParser(TOOLS, **kwargs)
    deltas = [d for chunk in chunks for d in parser.feed(chunk)] + parser.finish()
    _, content, calls = collect(deltas)
    return content, calls, deltas


@pytest.mark.parametrize("text", TOOL_TEXTS)
def test_tool_stream_matches_one_shot(text):
    want_content, want_calls = parse_tool_calls(text, TOOLS)
    rng = random.Random(len(text))
    splits = [[text], list(text)] + [random_chunks(text, rng) for _ in range(200)]
    for chunks in splits:
        content, calls, _ = stream_tools(text, chunks)
        assert content == want_content, chunks
        assert calls == strip_ids(want_calls), chunks


def test_tool_stream_never_emits_tag_fragments():
    text = "Checking. " + WEATHER + "\n" + TIME + " Done."
    rng = random.Random(7)
    for _ in range(300):
        _, _, deltas = stream_tools(text, random_chunks(text, rng))
        for delta in deltas:
            assert "<" not in delta.get("content", "")


def test_tool_stream_delta_shapes():
    parser = ToolCallStreamParser(TOOLS)
    assert parser.feed("Hi <tool_") == [{"content": "Hi"}]
    assert parser.feed("call>get_time</tool_call>") == [
        {"tool_calls": [{"index": 0, "id": parser.calls[0]["id"], "type": "function",
                         "function": {"name": "get_time", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
    ]
    assert parser.finish() == []


COMBINED = [
    (ReasoningMode.OPEN, "I should call the tool.</think>\n" + WEATHER),
    (ReasoningMode.AUTO, "<think>two calls</think>Sure. " + WEATHER + "\n" + TIME),
    (ReasoningMode.OPEN, "think about <tool_call>get_time</tool_call></think>answer"),
    (ReasoningMode.OFF, TIME + " after"),
    (ReasoningMode.OPEN, "cut off <tool_call>get_ti"),
]


def assert_chat_stream_matches(mode: ReasoningMode, text: str, splits: list[list[str]]):
    message = parse_chat_output(text, mode, TOOLS)
    calls = strip_ids(message.get("tool_calls", []))
    want = (message["reasoning_content"] or "", message["content"] or "", calls)
    for chunks in splits:
        parser = ChatOutputParser(mode, TOOLS)
        deltas = [d for c in chunks for d in parser.feed(c)] + parser.finish()
        assert collect(deltas) == want, (text, chunks)
        assert len(parser.tool_calls) == len(calls)


@pytest.mark.parametrize("mode,text", COMBINED)
def test_combined_stream_matches_one_shot(mode, text):
    rng = random.Random(len(text) * 31)
    splits = [[text], list(text)] + [random_chunks(text, rng) for _ in range(200)]
    assert_chat_stream_matches(mode, text, splits)


def test_combined_message_shape():
    message = parse_chat_output(COMBINED[0][1], ReasoningMode.OPEN, TOOLS)
    assert message["reasoning_content"] == "I should call the tool."
    assert message["content"] is None
    assert json.loads(message["tool_calls"][0]["function"]["arguments"])["days"] == 3
    inside = parse_chat_output(COMBINED[2][1], ReasoningMode.OPEN, TOOLS)
    assert "tool_calls" not in inside and inside["content"] == "answer"
    plain = parse_chat_output(TIME, ReasoningMode.OFF, TOOLS, parse_tools=False)
    assert plain == {"role": "assistant", "content": TIME, "reasoning_content": None}


def test_merge_deltas_and_finish_reason():
    parser = ChatOutputParser(ReasoningMode.OPEN, TOOLS)
    merged = merge_deltas(parser.feed("hm</think>ok " + TIME) + parser.finish())
    assert merged["reasoning_content"] == "hm" and merged["content"] == "ok"
    assert merged["tool_calls"] == [{"index": 0, "id": parser.tool_calls[0]["id"],
                                     "type": "function",
                                     "function": {"name": "get_time", "arguments": "{}"}}]
    assert merge_deltas([]) is None
    assert chat_finish_reason("stop", parser.tool_calls) == "tool_calls"
    assert chat_finish_reason("length", parser.tool_calls) == "length"
    assert chat_finish_reason("stop", []) == "stop"



def test_resolve_tool_choice():
    assert resolve_tool_choice(None, None).parse_tools is False
    assert resolve_tool_choice(TOOLS, "none") == ToolPolicy(None, False, None, False)
    auto = resolve_tool_choice(TOOLS, None)
    assert auto.parse_tools and auto.template_tools == TOOLS and auto.allowed_names is None
    required = resolve_tool_choice(TOOLS, "required")
    assert required.required and required.parse_tools
    named = resolve_tool_choice(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert named.template_tools == [TOOLS[1]] and named.allowed_names == {"get_time"}
    with pytest.raises(ValueError, match="not in tools"):
        resolve_tool_choice(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match="tool_choice"):
        resolve_tool_choice(TOOLS, "sometimes")


def test_named_choice_leaves_other_calls_as_content():
    policy = resolve_tool_choice(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    message = parse_chat_output(
        WEATHER + TIME, ReasoningMode.OFF, policy.template_tools,
        parse_tools=policy.parse_tools, allowed_names=policy.allowed_names,
    )
    assert message["content"] == WEATHER
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_time"]


FUZZ_PIECES = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
    "<arg_value>", "</arg_value>", "get_time", "get_weather", "city", "days", "7", "Oslo",
    "word", " ", "\n", "<", ">", "</th", "<tool_", "x y",
]


@pytest.mark.parametrize("mode", list(ReasoningMode))
def test_fuzz_stream_equals_one_shot(mode):
    """Random mixes of tags, fragments and text: streaming always agrees with one-shot."""
    rng = random.Random(zlib.crc32(mode.value.encode()))
    for _ in range(300):
        text = "".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.3:
            text += WEATHER if rng.random() < 0.5 else TIME
        assert_chat_stream_matches(mode, text, [random_chunks(text, rng) for _ in range(5)])
