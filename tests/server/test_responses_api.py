"""POST /v1/responses: the official openai client, raw SSE event order, instructions, incomplete
responses, 400s naming the field, the API key, and reasoning / tool calls from a scripted output."""

import json
import time

import httpx
import openai
import pytest

from live import LiveServer
from tpserve.engine.outputs import CompletionOutput, RequestOutput

KEY = "secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
NO_THINKING = {"effort": "none"}  # the tiny model's random text stays out of reasoning


@pytest.fixture(scope="module")
def server(tiny):
    s = LiveServer(str(tiny("default")), api_key=KEY, max_num_seqs=8)
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def post(server, body, **kw):
    return httpx.post(server.url + "/v1/responses", json=body, headers=AUTH, timeout=60, **kw)


def sse_events(text):
    """[(event name, data dict)] of a Responses stream."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_create_with_the_openai_client(client):
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=6, temperature=0, reasoning=NO_THINKING,
                                metadata={"k": "v"})
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "tiny"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    assert r.output_text == message.content[0].text != ""
    assert r.usage.output_tokens == 6 and r.usage.total_tokens == r.usage.input_tokens + 6
    assert r.metadata == {"k": "v"} and r.max_output_tokens == 6 and r.temperature == 0


def test_instructions_become_a_system_message(server):
    def input_tokens(body):
        r = post(server, {"input": "hi", "max_output_tokens": 1, **body})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["input_tokens"]

    chat = httpx.post(server.url + "/tokenize", headers=AUTH, json={"messages": [
        {"role": "system", "content": "Answer in French."}, {"role": "user", "content": "hi"}]}).json()
    assert input_tokens({"instructions": "Answer in French."}) == chat["count"] > input_tokens({})
    as_items = {"input": [{"role": "developer", "content": "Answer in French."},
                          {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    r = post(server, {**as_items, "max_output_tokens": 1})
    assert r.json()["usage"]["input_tokens"] == chat["count"]


def test_stream_event_order_and_text(server):
    body = {"input": "hi", "max_output_tokens": 5, "temperature": 0, "reasoning": NO_THINKING}
    whole = post(server, body).json()
    r = post(server, {**body, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert set(names[4:-4]) == {"response.output_text.delta"}
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert text == events[-4][1]["text"] == whole["output"][0]["content"][0]["text"]
    final = events[-1][1]["response"]
    assert final["status"] == "incomplete" and final["usage"]["output_tokens"] == 5
    assert final["output"] == [events[-2][1]["item"]] and final["id"] == events[0][1]["response"]["id"]


@pytest.mark.parametrize("body,param", [
    ({"input": []}, "input"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "input[0].arguments"),
    ({"input": [{"type": "web_search_call"}]}, "input[0].type"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "store": True, "background": True}, "background"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs"),
    ({"input": "x", "include": ["message.output_text.logprobs"]}, "include"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "metadata": {"k": 5}}, "metadata.k"),
    ({"input": "x", "frobnicate": 1}, "frobnicate"),
    ({}, "input"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    r = post(server, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "BadRequestError" and param.split("[")[0] in err["message"]


def test_unknown_model_and_api_key(server):
    assert post(server, {"input": "x", "model": "gpt-9"}).status_code == 404
    assert httpx.post(server.url + "/v1/responses", json={"input": "x"}).status_code == 401
    r = httpx.post(server.url + "/v1/responses", json={"input": "x"}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_openapi_declares_the_route(server):
    spec = httpx.get(server.url + "/openapi.json", headers=AUTH).json()
    op = spec["paths"]["/v1/responses"]["post"]
    assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ResponsesRequest")
    assert {"200", "400", "401", "413"} <= set(op["responses"])
    assert spec["components"]["schemas"]["ResponsesRequest"]["additionalProperties"] is False


SCRIPT = ("plan the call</think>Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
          "</arg_value></tool_call>")
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}}}]


class ScriptedStream:
    """The engine's stream for a fixed output text, 5 characters at a time."""

    def __init__(self, request_id, prompt_ids, text=SCRIPT, step=5):
        self.request_id, self.arrival, self.prompt_ids = request_id, time.monotonic(), prompt_ids
        self.text, self.step = text, step

    async def __aiter__(self):
        for end in range(self.step, len(self.text) + self.step, self.step):
            done = end >= len(self.text)
            c = CompletionOutput(0, self.text[:end], list(range(end // self.step)),
                                 finish_reason="stop" if done else None)
            yield RequestOutput(self.request_id, None, self.prompt_ids, [c], finished=done)


@pytest.fixture
def scripted(server, monkeypatch):
    monkeypatch.setattr(server.engine, "add", lambda rid, ids, params, prompt=None, **_: ScriptedStream(rid, ids))


def items(output):
    return [(i.type, getattr(i, "status", None), i.content[0].text if i.type != "function_call" else
             (i.name, json.loads(i.arguments))) for i in output]


@pytest.mark.usefixtures("scripted")
def test_reasoning_and_function_calls(client):
    expected = [("reasoning", "completed", "plan the call"), ("message", "completed", "Let me check."),
                ("function_call", "completed", ("get_weather", {"city": "Paris"}))]
    r = client.responses.create(model="tiny", input="weather?", tools=TOOLS)
    assert r.status == "completed" and r.incomplete_details is None
    assert items(r.output) == expected and r.output[2].call_id.startswith("call_")
    with client.responses.stream(model="tiny", input="weather?", tools=TOOLS) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert items(final.output) == expected and json.loads("".join(deltas)) == {"city": "Paris"}
    none = client.responses.create(model="tiny", input="weather?", tools=TOOLS, tool_choice="none")
    assert [i.type for i in none.output] == ["reasoning", "message"]
    assert "<tool_call>get_weather" in none.output_text


@pytest.mark.usefixtures("scripted")
def test_earlier_turns_as_items(client):
    turns = [{"role": "user", "content": "weather?"},
             {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look it up"}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
    r = client.responses.create(model="tiny", input=turns, tools=TOOLS, instructions="be brief")
    assert r.status == "completed" and r.instructions == "be brief"
