"""Third-party clients against the server: the exact requests lm-eval, guidellm, instructor,
langchain-openai, litellm and the OpenAI SDK sent (fixtures/clients/*.json, recorded from the real
packages) replayed on the tiny checkpoint, each answer checked for what that client parses; and
the OpenAI SDK (a test dependency) driven directly."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from live import LiveServer

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "clients").glob("*.json"))


@pytest.fixture(scope="module")
def server(tiny):
    s = LiveServer(str(tiny("default")), max_num_seqs=8)
    yield s
    s.close()


def send(server, req) -> tuple[int, dict | list]:
    """(status, JSON body) or, for a stream, (status, the data events as JSON with "[DONE]" last)."""
    url = server.url + req["path"]
    body = req["body"]
    if not (isinstance(body, dict) and body.get("stream")):
        r = httpx.request(req["method"], url, json=body, timeout=120)
        return r.status_code, (r.json() if r.content else {})
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, r.json()
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    return 200, [json.loads(e) for e in events[:-1]] + ["[DONE]"]


def check_error(err: dict, status: int, body: dict) -> None:
    """OpenAI's error object: code a string or null (openai.APIError.code), param naming the field."""
    e = err["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    assert e["code"] is None or isinstance(e["code"], str)
    if status == 400:
        assert e["param"] in body and e["param"] in e["message"]
    if status == 404:
        assert e["code"] == "model_not_found"


def prompt_ids(server, prompt) -> list[list[int]]:
    tok = server.engine.tokenizer
    items = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt
    return [tok.encode(p) if isinstance(p, str) else list(p) for p in items]


def check_echo(server, body: dict, choice: dict, ids: list[int]) -> None:
    """lm-eval's parse_logprobs: token_logprobs[ctxlen:-1] summed, each against max(top_logprobs)."""
    lp, k = choice["logprobs"], body.get("logprobs")
    if k is None:
        assert lp is None
        return
    n = len(lp["tokens"])
    generated = 0 if body.get("max_tokens") == 0 else n - len(ids)
    assert n == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == len(ids) + generated
    assert 0 <= generated <= (body.get("max_tokens") or 16)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing predicts the first token
    assert all(isinstance(v, float) and v <= 0 for v in lp["token_logprobs"][1:])
    tok = server.engine.tokenizer
    assert lp["tokens"][:len(ids)] == [tok.decode([t]) for t in ids]
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    for top, value in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:]):
        if k:
            assert 1 <= len(top) <= k and value <= max(top.values()) + 1e-6
        else:
            assert top is None


def check_completion(server, body: dict, out: dict) -> None:
    ids = prompt_ids(server, body["prompt"])
    n = body.get("n", 1)
    assert out["object"] == "text_completion" and len(out["choices"]) == len(ids) * n
    for choice in out["choices"]:
        assert {"index", "text", "logprobs", "finish_reason"} <= set(choice)
        assert choice["finish_reason"] in ("stop", "length") and isinstance(choice["text"], str)
        if body.get("echo"):
            prompt_text = body["prompt"] if isinstance(body["prompt"], str) else None
            if prompt_text is not None:
                assert choice["text"].startswith(prompt_text)
            check_echo(server, body, choice, ids[choice["index"] // n])
    usage = out["usage"]
    assert usage["prompt_tokens"] == sum(map(len, ids))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def schema_of(body: dict) -> dict | None:
    """The JSON schema a request constrains its output with (instructor, langchain, litellm forms)."""
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return fmt["json_schema"]["schema"]
    if fmt.get("type") == "json_object":
        return fmt.get("schema", {"type": "object"})
    so = body.get("structured_outputs") or {}
    return so.get("json")


def check_json(value, schema: dict) -> None:
    """Objects closed unless the schema opens them: only listed keys, required ones present."""
    assert isinstance(value, dict)
    props = schema.get("properties")
    if props is not None and schema.get("additionalProperties") is None:
        assert set(value) <= set(props), (value, schema)
    assert set(schema.get("required", ())) <= set(value)


def check_chat(body: dict, out: dict) -> None:
    assert out["object"] == "chat.completion" and len(out["choices"]) == body.get("n", 1)
    schema = schema_of(body)
    forced = body.get("tool_choice")
    named = forced["function"]["name"] if isinstance(forced, dict) else None
    for choice in out["choices"]:
        msg, finish = choice["message"], choice["finish_reason"]
        assert msg["role"] == "assistant" and finish in ("stop", "length", "tool_calls")
        if finish == "tool_calls":
            for call in msg["tool_calls"]:
                tool = next(t["function"] for t in body["tools"] if t["function"]["name"] == call["function"]["name"])
                assert named in (None, tool["name"]) and call["type"] == "function" and call["id"]
                check_json(json.loads(call["function"]["arguments"]), tool.get("parameters") or {})
        elif named is not None:  # a forced call cut short by max_tokens: no call, never another text
            assert finish == "length"
        if schema is not None and finish == "stop":
            check_json(json.loads(msg["content"]), schema)
        choices = (body.get("structured_outputs") or {}).get("choice")
        if choices and finish == "stop":
            assert msg["content"] in choices
    usage = out["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def check_stream(body: dict, events: list, kind: str) -> None:
    """Chunks as OpenAI sends them: `finish_reason` and `logprobs` in every choice (null until
    set), one finish per choice and nothing after it, usage last (and on every chunk with vLLM's
    continuous_usage_stats, as guidellm reads it)."""
    chunks = events[:-1]
    opts = body.get("stream_options") or {}
    usage_last = bool(opts.get("include_usage"))
    continuous = usage_last and opts.get("continuous_usage_stats")
    finished, seen = set(), 0
    for i, c in enumerate(chunks):
        assert c["object"] == kind and c["id"] == chunks[0]["id"]
        last = i == len(chunks) - 1
        if usage_last and last:
            assert c["choices"] == [] and (not continuous or c["usage"]["completion_tokens"] == seen)
            continue
        for ch in c["choices"]:
            assert "finish_reason" in ch and "logprobs" in ch, ch
            assert ch["index"] not in finished
            if ch["finish_reason"] is not None:
                finished.add(ch["index"])
            if kind == "chat.completion.chunk":
                assert isinstance(ch["delta"], dict)
        if continuous:
            assert c["usage"]["completion_tokens"] >= seen and c["usage"]["prompt_tokens"] > 0
            seen = c["usage"]["completion_tokens"]
        else:
            assert "usage" not in c
    if kind == "chat.completion.chunk":
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len(finished) == body.get("n", 1) * (len(body["prompt"]) if isinstance(body.get("prompt"), list)
                                                 and isinstance(body["prompt"][0], (str, list)) else 1)
    if usage_last:
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or 1 << 30
        assert 0 < chunks[-1]["usage"]["completion_tokens"] <= limit


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_recorded_client_requests(server, path):
    fixture = json.loads(path.read_text())
    assert fixture["requests"]
    for req in fixture["requests"]:
        status, out = send(server, req)
        assert status == req["status"], (req, out)
        body = req["body"]
        if status != 200:
            check_error(out, status, body)
        elif req["path"] == "/v1/models":
            assert [m["id"] for m in out["data"]] == ["tiny"]
        elif req["path"] == "/v1/responses":
            assert out["object"] == "response" and out["status"] in ("completed", "incomplete")
        elif isinstance(out, list):
            check_stream(body, out, "text_completion" if req["path"] == "/v1/completions" else "chat.completion.chunk")
        elif req["path"] == "/v1/completions":
            check_completion(server, body, out)
        elif req["path"] == "/v1/chat/completions":
            check_chat(body, out)


def test_fixtures_cover_the_clients():
    for client in ("openai", "litellm", "langchain-openai", "instructor", "lm-eval", "guidellm"):
        assert any(p.stem.startswith(client + "-") for p in FIXTURES), client
    lm_eval = json.loads(next(p for p in FIXTURES if "local-completions" in p.stem).read_text())
    loglikelihood = [r["body"] for r in lm_eval["requests"] if r["body"].get("echo")]
    assert loglikelihood and all(b["logprobs"] == 1 and b["max_tokens"] == 1 for b in loglikelihood)
    guidellm = json.loads(next(p for p in FIXTURES if "guidellm" in p.stem).read_text())
    assert any((r["body"] or {}).get("stream_options", {}).get("continuous_usage_stats") for r in guidellm["requests"])


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_sdk_echo_loglikelihood(client):
    ctx, cont = [11, 42, 7, 99], [5, 6]
    r = client.completions.create(model="tiny", prompt=[ctx + cont], max_tokens=1, echo=True, logprobs=1,
                                  temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ctx + cont) + 1 and lp.token_logprobs[0] is None
    score = sum(lp.token_logprobs[len(ctx):-1])  # lm-eval's loglikelihood of the continuation
    assert score < 0 and len(lp.top_logprobs[len(ctx)]) == 1
    only = client.completions.create(model="tiny", prompt="abc", max_tokens=0, echo=True)
    assert only.choices[0].text == "abc" and only.usage.completion_tokens == 0


def test_sdk_chunks_and_fields(client):
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, store=False,
        metadata={"k": "v"}, service_tier="auto", prompt_cache_key="p", safety_identifier="s", verbosity="low",
        modalities=["text"], prediction={"type": "content", "content": "x"},
        extra_body={"min_tokens": 6, "skip_special_tokens": False, "ignore_eos": True})
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks)
    assert [c.usage.completion_tokens for c in chunks] == sorted(c.usage.completion_tokens for c in chunks)
    assert chunks[-1].usage.completion_tokens == 6
    finishes = [ch.finish_reason for c in chunks for ch in c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"frobnicate": 1})
    assert info.value.param == "frobnicate" and info.value.code is None
