"""The server, driven with the official openai client and with raw HTTP for error cases."""

import json
import time

import httpx
import openai
import pytest

from live import LiveServer


@pytest.fixture(scope="module")
def server(tiny):
    s = LiveServer(str(tiny("default")), max_num_seqs=8)
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def wait_pools_full(server, seconds=1.5):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if server.pools_full():
            return True
        time.sleep(0.05)
    return server.pools_full()


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat(client, server):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    assert wait_pools_full(server)


def test_chat_stream_include_usage(client):
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=8, stream=True, stream_options={"include_usage": True},
                                            reasoning_effort="none")
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals[-1].choices[0].finish_reason == "length"


def test_completions_stream_and_not(client):
    r = client.completions.create(model="tiny", prompt="Once upon", max_tokens=6, temperature=0)
    s = list(client.completions.create(model="tiny", prompt="Once upon", max_tokens=6, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_n_and_token_prompts(client):
    r = client.completions.create(model="tiny", prompt=[[5, 6, 7], [8, 9]], n=3, max_tokens=4, seed=1)
    assert sorted(c.index for c in r.choices) == list(range(6))
    assert r.usage.completion_tokens == 24


def test_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       logprobs=True, top_logprobs=2, temperature=0)
    content = r.choices[0].logprobs.content
    assert len(content) == 5 and all(len(t.top_logprobs) == 2 for t in content)
    assert all(t.logprob == t.top_logprobs[0].logprob for t in content)  # greedy picks the top token
    c = client.completions.create(model="tiny", prompt="abc", max_tokens=4, logprobs=2)
    assert len(c.choices[0].logprobs.token_logprobs) == 4 and len(c.choices[0].logprobs.top_logprobs[0]) == 2


def test_stop_strings(client):
    free = client.completions.create(model="tiny", prompt="Stop test", max_tokens=24, temperature=0).choices[0].text
    clean = [i for i in range(4, len(free) - 3) if "\ufffd" not in free[i:i + 2] and free[i:i + 2].strip()]
    if not clean:
        pytest.skip("random output has no clean substring")
    stop = free[clean[0]:clean[0] + 2]
    r = client.completions.create(model="tiny", prompt="Stop test", max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == free[:free.index(stop)]


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "max_tokens": 5000}, None),                    # over max_model_len
    ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),             # wrong type
    ({"prompt": "x", "temperature": 9}, "temperature"),               # out of range
    ({"prompt": "x", "top_logprobs": 3}, "top_logprobs"),             # not a completions field: refused
    ({"prompt": [], "max_tokens": 3}, "prompt"),
    ({"prompt": [[99999999]]}, None),                                 # token id out of vocab
])
def test_bad_requests_get_400(server, body, param):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"] and err["code"] is None  # OpenAI: a string code or null; the status says 400
    if param:
        assert err["param"] == param


def test_malformed_json_and_chat_errors(server):
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages")
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": "hi"})
    assert r.status_code == 400
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "g"}}})
    assert r.status_code == 400 and "tool_choice" in (r.json()["error"]["param"] or r.json()["error"]["message"])
    # still serving
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "ok", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200


def test_tokenize_detokenize(server):
    r = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 4096
    back = httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == "Hello world"
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 3


def test_disconnect_aborts_within_a_second(server):
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                      json={"prompt": "long", "max_tokens": 3000, "stream": True, "ignore_eos": True}) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(x.startswith("data:") for x in got)
        assert not server.pools_full()
    assert wait_pools_full(server, 1.0)
    # a non-streaming request whose client gives up
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3000, "ignore_eos": True},
                   timeout=0.5)
    assert wait_pools_full(server, 1.5)


def test_metrics(server, client):
    client.completions.create(model="tiny", prompt="m", max_tokens=3)
    text = httpx.get(server.url + "/metrics").text
    for name in ("tpserve:num_requests_running", "tpserve:num_requests_waiting", "tpserve:kv_cache_usage_perc",
                 "tpserve:time_to_first_token_seconds_bucket", "tpserve:inter_token_latency_seconds_bucket",
                 "tpserve:prompt_tokens_total", "tpserve:generation_tokens_total"):
        assert name in text


def test_health_503_when_engine_dead(tiny):
    s = LiveServer(str(tiny("default")))
    try:
        assert httpx.get(s.url + "/health").status_code == 200
        s.engine.engine.dead = "simulated failure"
        r = httpx.get(s.url + "/health")
        assert r.status_code == 503 and "simulated" in r.json()["error"]["message"]
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x"})
        assert r.status_code == 503
    finally:
        s.close()


def test_api_key_and_queue_full(tiny):
    s = LiveServer(str(tiny("default")), api_key="secret", max_waiting=1, max_num_seqs=1)
    try:
        body = {"prompt": "x", "max_tokens": 4}
        assert httpx.post(s.url + "/v1/completions", json=body).status_code == 401
        assert httpx.post(s.url + "/v1/completions", json=body,
                          headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = openai.OpenAI(base_url=s.url + "/v1", api_key="secret", max_retries=0)
        assert ok.completions.create(model="tiny", prompt="x", max_tokens=2).choices
        assert httpx.get(s.url + "/health").status_code == 200  # not behind the key
        # one running + one waiting fill the queue; the next gets 503
        long = {"prompt": "x", "max_tokens": 3000, "ignore_eos": True, "stream": True}
        hdr = {"Authorization": "Bearer secret"}
        with httpx.stream("POST", s.url + "/v1/completions", json=long, headers=hdr, timeout=30) as r1:
            lines = r1.iter_lines()  # keep a reference: a collected iterator closes the response
            next(lines)
            with httpx.stream("POST", s.url + "/v1/completions", json=long, headers=hdr, timeout=30) as r2:
                time.sleep(0.2)
                r3 = httpx.post(s.url + "/v1/completions", json=body, headers=hdr)
                assert r3.status_code == 503 and "busy" in r3.json()["error"]["message"]
                assert r2.status_code == 200
        deadline = time.time() + 2
        while not s.pools_full() and time.time() < deadline:
            time.sleep(0.05)
        assert s.pools_full()
    finally:
        s.close()


def test_load_bench_small(tiny, tmp_path):
    """`tpserve bench serve` end to end at a CI-friendly size: no errors, pool full again."""
    from tpserve.cli import main

    out = tmp_path / "load.json"
    rc = main(["bench", "serve", str(tiny("default")), "--device", "cpu", "--kv-cache-memory", "8MiB",
               "--concurrency", "16", "--max-tokens", "20", "--json", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and res["errors"] == [] and res["pool_full_after"]
