"""Prefix caching through the server: real usage cached_tokens on chat / completions / responses, cache_salt
(tenants apart; bad salts a 400 naming the field), POST /reset_prefix_cache behind the API key, the
Prometheus counters, and structured output resuming from the cache with the tokens it gives without it."""

import json

import httpx
import pytest

from live import LiveServer

KEY = {"Authorization": "Bearer k"}
# a long system message: several 16-token blocks shared by every request below
SYSTEM = {"role": "system", "content": " ".join(f"rule {i}: answer briefly and in plain words." for i in range(12))}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
          "maximum": 99}}, "required": ["ok", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tiny):
    s = LiveServer(str(tiny("default")), api_key="k", max_num_seqs=4, block_size=16)
    yield s
    s.close()


def post(server, path, body, headers=KEY):
    return httpx.post(server.url + path, json=body, headers=headers, timeout=120)


def chat(server, content, **extra):
    body = {"messages": [SYSTEM, {"role": "user", "content": content}], "max_tokens": 6, "temperature": 0, **extra}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_second_request_reports_cached_tokens_and_salts_keep_apart(server):
    first = chat(server, "what is one plus one?")
    second = chat(server, "what is one plus one?")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["usage"]["prompt_tokens"] and cached % 16 == 0
    assert second["choices"][0]["message"] == first["choices"][0]["message"]
    assert chat(server, "what is one plus one?", cache_salt="tenant-b")["usage"]["prompt_tokens_details"][
        "cached_tokens"] == 0
    # streamed usage, completions and responses report it too
    body = {"messages": [SYSTEM, {"role": "user", "content": "what is one plus one?"}], "max_tokens": 3,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=KEY, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
    prompt = SYSTEM["content"] * 2
    post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    again = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 2}).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    resp = {"input": [SYSTEM, {"role": "user", "content": "what is one plus one?"}], "max_output_tokens": 4}
    r = post(server, "/v1/responses", resp).json()
    assert r["usage"]["input_tokens_details"]["cached_tokens"] == cached
    metrics = httpx.get(server.url + "/metrics", headers=KEY).text
    hits = [line for line in metrics.splitlines() if line.startswith("tpserve:prefix_cache_hits_total")]
    assert hits and float(hits[0].split()[-1]) >= 2 * cached
    assert "tpserve:prefix_cache_queries_total" in metrics and "tpserve:prefix_state_checkpoint_bytes" in metrics


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ("/v1/completions", {"prompt": "x"}),
    ("/v1/responses", {"input": "x"})])
@pytest.mark.parametrize("salt", ["", 7, ["a"]])
def test_bad_salts_get_400_naming_the_field(server, path, body, salt):
    r = post(server, path, {**body, "cache_salt": salt})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "cache_salt"


def test_reset_prefix_cache_needs_the_key_and_forgets(server):
    chat(server, "name a colour")
    assert chat(server, "name a colour")["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert post(server, "/reset_prefix_cache", None, headers={}).status_code == 401
    assert post(server, "/reset_prefix_cache", None).status_code == 200
    assert chat(server, "name a colour")["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_structured_output_from_the_cache_is_the_uncached_output(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
    post(server, "/reset_prefix_cache", None)
    first = chat(server, "weather?", response_format=fmt, max_tokens=60)
    second = chat(server, "weather?", response_format=fmt, max_tokens=60)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert second["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    assert set(json.loads(first["choices"][0]["message"]["content"])) == {"ok", "n"}
