"""Auth on every route, OpenAI-shaped 404/405/413, model routes, tool_calls omitted, /tokenize
options, and `tpserve serve` process behaviour (port taken, --log-level, drain cut)."""

import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from helpers import wait_healthy
from live import LiveServer
from tpserve.engine.tp.launch import free_port


def is_openai_error(r, status, code=None):
    err = r.json()["error"]
    assert r.status_code == status and set(err) == {"message", "type", "param", "code"}, r.text
    if code is not None:
        assert err["code"] == code
    return err


@pytest.fixture(scope="module")
def keyed(tiny):
    s = LiveServer(str(tiny("default")), api_key="k", state_options={"max_request_bytes": 4096})
    yield s
    s.close()


def test_api_key_guards_every_route_but_health(keyed):
    ok = {"Authorization": "Bearer k"}
    for method, path, body in [("POST", "/tokenize", {"prompt": "x"}), ("POST", "/detokenize", {"tokens": [5]}),
                               ("GET", "/metrics", None), ("GET", "/v1/models", None), ("GET", "/v1/models/tiny", None),
                               ("GET", "/openapi.json", None), ("GET", "/v1/nope", None),
                               ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}),
                               ("POST", "/reset_prefix_cache", None)]:
        r = httpx.request(method, keyed.url + path, json=body)
        is_openai_error(r, 401, "invalid_api_key")
        assert httpx.request(method, keyed.url + path, json=body, headers=ok).status_code in (200, 404), path
    assert httpx.get(keyed.url + "/health").status_code == 200


def test_metrics_public(tiny):
    s = LiveServer(str(tiny("default")), api_key="k", state_options={"metrics_public": True})
    try:
        assert httpx.get(s.url + "/metrics").status_code == 200
        assert httpx.get(s.url + "/v1/models").status_code == 401
    finally:
        s.close()


def test_404_405_413_shapes(keyed):
    ok = {"Authorization": "Bearer k"}
    is_openai_error(httpx.get(keyed.url + "/v1/nope", headers=ok), 404)
    is_openai_error(httpx.get(keyed.url + "/v1/completions", headers=ok), 405)
    err = is_openai_error(httpx.post(keyed.url + "/v1/completions", headers=ok, json={"prompt": "a" * 5000}), 413)
    assert "max-request-bytes" in err["message"]
    chunked = (b"{" b'"prompt":"' + b"a" * 5000 + b'"}' for _ in range(1))  # no content-length: streamed check
    is_openai_error(httpx.post(keyed.url + "/v1/completions", headers=ok, content=chunked), 413)


def test_models_routes(keyed):
    ok = {"Authorization": "Bearer k"}
    card = httpx.get(keyed.url + "/v1/models/tiny", headers=ok).json()
    assert card["id"] == "tiny" and card["object"] == "model"
    is_openai_error(httpx.get(keyed.url + "/v1/models/gpt-4", headers=ok), 404, "model_not_found")
    r = httpx.post(keyed.url + "/v1/completions", headers=ok, json={"prompt": "x", "model": "gpt-4"})
    assert is_openai_error(r, 404, "model_not_found")["param"] == "model"


def test_tool_calls_key_absent_without_calls(keyed):
    ok = {"Authorization": "Bearer k"}
    r = httpx.post(keyed.url + "/v1/chat/completions", headers=ok, timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert "tool_calls" not in r.json()["choices"][0]["message"]
    with httpx.stream("POST", keyed.url + "/v1/chat/completions", headers=ok, timeout=60,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: {")]
    assert lines and not any('"tool_calls"' in line for line in lines)


def test_tokenize_honours_tools_and_reasoning_effort(keyed):
    ok = {"Authorization": "Bearer k"}
    msgs = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "lookup_thing", "parameters": {"type": "object"}}}]

    def count(**extra):
        return httpx.post(keyed.url + "/tokenize", headers=ok, json={"messages": msgs, **extra}).json()["count"]

    plain = count()
    assert count(tools=tools) > plain
    assert count(reasoning_effort="none") != count(reasoning_effort="high")


def test_serve_exits_nonzero_when_the_port_is_taken(tiny):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "tpserve.cli", "serve", str(tiny("default")), "--device", "cpu",
                               "--port", str(port), "--kv-cache-memory", "8MiB", "--log-level", "info"],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"did not start: cannot listen on 127.0.0.1:{port}" in proc.stderr and "port taken" in proc.stderr
    # the port is bound before the engine starts (nothing the engine opens can take it meanwhile): no model loaded
    assert "engine ready" not in proc.stderr, proc.stderr


def start_serve(tiny, *extra):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tpserve.cli", "serve", str(tiny("default")), "--device", "cpu",
                             "--port", str(port), "--kv-cache-memory", "8MiB", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    return proc, url


def test_log_level_debug_and_drain_cut_streams_end_with_error_and_done(tiny):
    proc, url = start_serve(tiny, "--log-level", "debug", "--drain-timeout", "1")
    try:
        got = {}

        def stream():
            with httpx.stream("POST", url + "/v1/completions", timeout=60,
                              json={"prompt": "x", "max_tokens": 4000, "stream": True, "ignore_eos": True}) as r:
                got["lines"] = [line for line in r.iter_lines() if line.startswith("data:")]

        def plain():
            got["plain"] = httpx.post(url + "/v1/completions", timeout=60,
                                      json={"prompt": "y", "max_tokens": 4000, "ignore_eos": True})

        threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=30)
        assert proc.wait(timeout=30) == 0
        assert time.time() - start < 10
        lines = got["lines"]
        assert lines[-1] == "data: [DONE]"
        assert '"error"' in lines[-2] and "shutting down" in lines[-2]
        assert got["plain"].status_code == 503 and "shutting down" in got["plain"].json()["error"]["message"]
        out = proc.stdout.read()
        assert "INFO tpserve.engine: engine ready" in out  # tpserve's own loggers follow --log-level
        assert f"listening on {url} (OpenAI API under /v1" in out and "as model " in out  # uvicorn's own says none
    finally:
        if proc.poll() is None:
            proc.kill()


def test_no_tokenizer_length_warning(tiny):
    """The server checks max_model_len itself: transformers' warning about the tokenizer's smaller
    model_max_length ("will result in indexing errors") is not logged."""
    import logging

    from transformers import AutoTokenizer

    from tpserve.server.api import lift_tokenizer_limit

    class Grab(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    lib, grab = logging.getLogger("transformers"), Grab()
    level = lib.level
    lib.addHandler(grab)
    lib.setLevel(logging.WARNING)  # another test may have silenced transformers
    try:
        for lifted in (False, True):
            messages = []
            tok = AutoTokenizer.from_pretrained(str(tiny("default")))
            tok.model_max_length = 8
            if lifted:
                lift_tokenizer_limit(tok)
            assert len(tok.encode("hello world " * 40)) > 8
            warned = any("longer than the specified maximum sequence length" in m for m in messages)
            assert warned is not lifted, messages
    finally:
        lib.removeHandler(grab)
        lib.setLevel(level)
