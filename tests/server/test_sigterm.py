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
