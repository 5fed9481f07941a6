"""Tool calls and reasoning through the HTTP API, with a scripted model output (a random tiny model
never writes a tool call): non-streamed `tool_calls`, streamed tool-call deltas, finish_reason."""

import json
import time

import openai
import pytest

from live import LiveServer
from tpserve.engine.outputs import CompletionOutput, RequestOutput

SCRIPT = ("plan the call</think>Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
          "</arg_value><arg_key>days</arg_key><arg_value>3</arg_value><arg_key>code</arg_key><arg_value>007"
          "</arg_value></tool_call>")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "code": {"type": "string"}}}}}]


class ScriptedStream:
    def __init__(self, request_id, prompt_ids, text, step=5):
        self.request_id, self.arrival, self.prompt_ids = request_id, time.monotonic(), prompt_ids
        self.text, self.step = text, step

    async def __aiter__(self):
        for end in range(self.step, len(self.text) + self.step, self.step):
            done = end >= len(self.text)
            part = self.text[:end]
            c = CompletionOutput(0, part, list(range(len(part) // self.step + 1)),
                                 finish_reason="stop" if done else None)
            yield RequestOutput(self.request_id, None, self.prompt_ids, [c], finished=done)


@pytest.fixture(scope="module")
def server(tiny):
    s = LiveServer(str(tiny("default")))
    s.engine.add = lambda rid, ids, params, prompt=None, **_: ScriptedStream(rid, ids, SCRIPT)
    yield s
    s.close()


def test_tool_call_non_streamed(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert choice.message.reasoning_content == "plan the call"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3, "code": "007"}


def test_tool_call_streamed(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "weather?"}],
                                                 tools=TOOLS, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    calls = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            slot = calls.setdefault(d.index, {"name": "", "arguments": "", "id": None})
            slot["id"] = slot["id"] or d.id
            if d.function and d.function.name:
                slot["name"] += d.function.name
            if d.function and d.function.arguments:
                slot["arguments"] += d.function.arguments
    assert content == "Let me check." and reasoning == "plan the call"
    assert calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 3, "code": "007"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_tool_choice_none_leaves_text(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
                                       tool_choice="none")
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert "<tool_call>get_weather" in r.choices[0].message.content
