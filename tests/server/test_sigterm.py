"""`tpserve serve` in a subprocess: SIGTERM lets running requests finish, then the process exits."""

import os
import signal
import subprocess
import sys
import threading
import time

import httpx

from helpers import wait_healthy
from tpserve.engine.tp.launch import free_port


def test_sigterm_drains_then_exits(tiny, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tpserve.cli", "serve", str(tiny("default")), "--device", "cpu",
                             "--port", str(port), "--kv-cache-memory", "8MiB", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        result = {}

        def stream():
            with httpx.stream("POST", url + "/v1/completions", timeout=60,
                              json={"prompt": "x", "max_tokens": 150, "stream": True, "ignore_eos": True}) as r:
                result["lines"] = [line for line in r.iter_lines() if line.startswith("data:")]

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        t.join(timeout=60)
        assert proc.wait(timeout=60) == 0
        lines = result["lines"]
        assert lines[-1] == "data: [DONE]"
        assert '"finish_reason":"length"' in lines[-2]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_replica_whose_fleet_is_gone_exits(tiny):
    """A replica of `serve -dp` (TPSERVE_PARENT_PID names the fleet) whose parent is another process (the fleet
    died and it was reparented) drains and exits by itself."""
    port = free_port()
    env = dict(os.environ, TPSERVE_PARENT_PID="1")  # not this test, its real parent
    proc = subprocess.Popen([sys.executable, "-m", "tpserve.cli", "serve", str(tiny("default")), "--device", "cpu",
                             "--port", str(port), "--kv-cache-memory", "8MiB", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        assert b"the fleet that started this replica (pid 1) is gone: draining and exiting" in out
    finally:
        if proc.poll() is None:
            proc.kill()
