"""bench serve's own server: `tpserve serve` in a process of its own, its pools read from /metrics, stopped with
its process group; a server that cannot start is a ToolError, not a hang."""

import os
from types import SimpleNamespace

import httpx
import pytest

from tpserve.tools.bench.server_process import ServerProcess
from tpserve.tools.client import ToolError


def test_serves_from_its_own_process_and_stops(tiny):
    server = ServerProcess(SimpleNamespace(model=str(tiny("default")), device="cpu", kv_cache_memory="8MiB",
                                           log_level="warning"), timeout=300)
    try:
        assert server.proc.pid != os.getpid() and server.proc.poll() is None
        r = httpx.post(server.url + "/v1/completions", json={"model": str(tiny("default")), "prompt": "hello",
                                                              "max_tokens": 3}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert server.pools_full()
    finally:
        server.close()
    assert server.proc.poll() is not None


def test_a_server_that_cannot_start_is_a_tool_error(tmp_path):
    with pytest.raises(ToolError, match="did not start"):
        ServerProcess(SimpleNamespace(model=str(tmp_path / "no-such-model"), device="cpu", log_level="warning"),
                      timeout=300)
