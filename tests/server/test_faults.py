"""`tpserve serve --tp 2` with a worker killed mid-request: the open stream ends with an error
event and [DONE], a waiting non-streamed request gets 503, /health turns 503, and the server
exits non-zero within seconds."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from helpers import wait_healthy
from tpserve.engine.tp.launch import free_port


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def spawned_workers(pid: int) -> list[int]:
    """The server's TP workers: its spawned children, or its fork server's (engine/tp/launch.py `mp_context`)."""
    workers = []
    for k in _children(pid):
        cmdline = Path(f"/proc/{k}/cmdline").read_bytes()
        workers += [k] if b"spawn_main" in cmdline else _children(k) if b"forkserver" in cmdline else []
    return workers


def test_killed_tp_worker_fails_requests_and_exits_nonzero(tiny):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tpserve.cli", "serve", str(tiny("default")), "--device", "cpu",
                             "--tp", "2", "--port", str(port), "--kv-cache-memory", "8MiB", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=180)
        got = {}
        long = {"prompt": "x", "max_tokens": 3000, "ignore_eos": True}

        def stream():
            with httpx.stream("POST", url + "/v1/completions", json={**long, "stream": True}, timeout=60) as r:
                got["lines"] = [line for line in r.iter_lines() if line.startswith("data:")]

        def plain():
            got["plain"] = httpx.post(url + "/v1/completions", json=long, timeout=60)

        threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        (worker,) = spawned_workers(proc.pid)
        os.kill(worker, signal.SIGKILL)
        killed = time.time()
        health = set()
        while proc.poll() is None and time.time() - killed < 30:
            try:
                health.add(httpx.get(url + "/health", timeout=2).status_code)
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        for t in threads:
            t.join(timeout=30)
        assert proc.wait(timeout=30) != 0
        assert time.time() - killed < 20
        assert 503 in health
        lines = got["lines"]
        assert lines[-1] == "data: [DONE]" and '"error"' in lines[-2] and "rank1" in lines[-2]
        assert got["plain"].status_code == 503
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
