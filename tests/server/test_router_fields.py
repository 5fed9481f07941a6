"""What routers in front of replicas need from one server: the fields they add to bodies accepted at their
default values (any other value a 400 naming the field), /server_info for the model id, /get_load, and a
/health that answers 503 while the engine loads."""

import threading

import httpx
import pytest

from live import LiveServer
from tpserve.server.loading import LoadingResponder
from tpserve.server.protocol import ChatCompletionRequest, CompletionRequest, TokenizeRequest, parse_request
from tpserve.server.router_fields import ROUTER_FIELDS
from tpserve.server.runner import bind_socket

# the bodies sglang-router 0.3.2 / vllm-router 0.1.17 send on (seen in their runs)
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "continue_final_message": False, "no_stop_trim": False, "return_hidden_states": False,
        "separate_reasoning": True, "skip_special_tokens": True, "stream_reasoning": True, "include_reasoning": True,
        "ignore_eos": False, "logprobs": False, "stream": False}
COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "no_stop_trim": False,
              "return_hidden_states": False, "skip_special_tokens": True, "echo": False, "ignore_eos": False,
              "stream": False}


def test_router_defaults_are_accepted():
    chat, err = parse_request(ChatCompletionRequest, CHAT)
    assert err is None and chat.max_tokens == 2
    completion, err = parse_request(CompletionRequest, COMPLETION)
    assert err is None and completion.prompt == "hi"
    tok, err = parse_request(TokenizeRequest, {"model": "tiny", "prompt": "hi", "continue_final_message": False})
    assert err is None and tok.prompt == "hi"


@pytest.mark.parametrize("model,body", [(ChatCompletionRequest, CHAT), (CompletionRequest, COMPLETION)])
def test_other_values_are_refused_naming_the_field(model, body):
    for name, default in ROUTER_FIELDS[model.__name__].items():
        if name in model.model_fields:  # the model implements it: not the router table's business
            continue
        _, err = parse_request(model, {**body, name: not default})
        assert err is not None and err["error"]["param"] == name, name
        assert f"{name}={'false' if default else 'true'} is not supported" in err["error"]["message"]
        _, err = parse_request(model, {**body, name: "yes"})
        assert err["error"]["param"] == name


def test_unknown_fields_are_still_refused():
    _, err = parse_request(CompletionRequest, {**COMPLETION, "bogus": 1})
    assert err["error"]["param"] == "bogus"


@pytest.fixture(scope="module")
def server(tiny):
    s = LiveServer(str(tiny("default")), api_key="K")
    yield s
    s.close()


def test_routed_bodies_and_server_info(server):
    auth = {"Authorization": "Bearer K"}
    r = httpx.post(server.url + "/v1/chat/completions", json=CHAT, headers=auth, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(server.url + "/v1/completions", json={**COMPLETION, "no_stop_trim": True}, headers=auth)
    assert r.status_code == 400 and r.json()["error"]["param"] == "no_stop_trim"
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(server.url + path, headers=auth).json()
        assert info["served_model_name"] == "tiny" and info["tp_size"] == 1 and "model_path" not in info
    assert httpx.get(server.url + "/server_info").status_code == 401  # behind the key, as the router sends it
    load = httpx.get(server.url + "/get_load", headers=auth).json()
    assert load[0]["num_reqs"] == 0 and load[0]["num_tokens"] >= 0
    assert httpx.get(server.url + "/health").status_code == 200  # no key


def test_health_is_503_while_loading():
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    loading = LoadingResponder(sock).start()
    try:
        r = httpx.get(url + "/health", timeout=5)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "ServiceUnavailableError"
        r = httpx.post(url + "/v1/completions", json={"prompt": "x" * 100_000}, timeout=5)
        assert r.status_code == 503  # the body is read, so the client gets the answer and not a reset
    finally:
        loading.stop()
    # the socket is handed on: a connection made now waits for whoever accepts next
    got = {}

    def accept_one():
        conn, _ = sock.accept()
        with conn:
            got["head"] = conn.recv(1024)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    t = threading.Thread(target=accept_one)
    t.start()
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    t.join(5)
    sock.close()
    assert got["head"].startswith(b"GET /health")
