"""The routes' warm-up: with --warmup, each generation route serves one request in process before the server
accepts connections, and the metrics start after it."""

import logging

import httpx
import pytest

from live import LiveServer


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def _warm_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm-up routes:")]


@pytest.mark.parametrize("api_key", [None, "sk-warm"])
def test_each_route_serves_once_before_the_first_client_and_counts_nowhere(tiny, caplog, api_key):
    caplog.set_level(logging.INFO, logger="tpserve.warmup")
    s = LiveServer(str(tiny("default")), warmup=True, api_key=api_key, state_options={"metrics_public": True})
    try:
        assert s.state.warm_routes
        lines = _warm_lines(caplog)
        assert len(lines) == 1 and "(200, 200, 200)" in lines[0]
        text = httpx.get(s.url + "/metrics").text
        assert _metric(text, "tpserve:request_success_total") == 0
        assert _metric(text, "tpserve:prompt_tokens_total") == 0
        assert _metric(text, "tpserve:generation_tokens_total") == 0
        assert _metric(text, "tpserve:prefix_cache_queries_total") == 0
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        r = httpx.post(s.url + "/v1/completions", headers=headers,
                       json={"model": "tiny", "prompt": "hello there", "max_tokens": 2})
        assert r.status_code == 200
        text = httpx.get(s.url + "/metrics").text
        assert _metric(text, "tpserve:request_success_total") == 1
        assert _metric(text, "tpserve:prompt_tokens_total") == r.json()["usage"]["prompt_tokens"]
    finally:
        s.close()


def test_no_route_warmup_without_the_warmup_or_with_the_switch_off(tiny, caplog):
    caplog.set_level(logging.INFO, logger="tpserve.warmup")
    for kw in ({"warmup": False}, {"warmup": True, "warmup_routes": False}):
        s = LiveServer(str(tiny("default")), **kw)
        try:
            assert not s.state.warm_routes
        finally:
            s.close()
    assert _warm_lines(caplog) == []


def test_a_refused_warmup_request_is_logged_and_the_server_serves(tiny, caplog, monkeypatch):
    from tpserve.server import route_warmup

    monkeypatch.setattr(route_warmup, "ROUTES", (("/v1/completions", {"prompt": "x", "max_tokens": -1}),
                                           ("/v1/no_such_route", {})))
    caplog.set_level(logging.INFO, logger="tpserve.warmup")
    s = LiveServer(str(tiny("default")), warmup=True)
    try:
        assert any("(400, 404)" in line for line in _warm_lines(caplog))
        r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 2})
        assert r.status_code == 200
    finally:
        s.close()
