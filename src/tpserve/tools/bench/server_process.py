"""`bench serve` without --url: the server as a `tpserve serve` process of its own, as clients meet it. In the load
generator's process the engine's host work would share the interpreter lock with the client's: on an H100 that
made the demo model's decode steps 1.8x longer (BENCHMARKS.md, First requests after boot)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

import httpx

from tpserve.engine.tp.launch import free_port
from tpserve.tools.client import ToolError
from tpserve.tools.fleet.replica import relay, replica_argv, wait_until_answers


def _access_log(line: str) -> bool:
    return 'HTTP/1.1" ' in line  # uvicorn's line per request


class ServerProcess:
    def __init__(self, args, timeout: float = 3600.0):
        """`tpserve serve` with the model and engine flags in `args` on a free local port; returns once /health
        answers 200 (ToolError if the process exits first). Its log goes to stderr, the access lines dropped."""
        port = free_port()
        env = dict(os.environ)
        env.pop("TPSERVE_API_KEY", None)  # the load generator sends no key to the server it started
        self.proc = subprocess.Popen(replica_argv(args, port, snapshots=False), env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.relay = threading.Thread(target=relay, args=(self.proc.stdout, "", _access_log), daemon=True)
        self.relay.start()
        self.url = f"http://127.0.0.1:{port}"
        if not wait_until_answers(self.url + "/health", lambda: self.proc.poll() is None, timeout, 0.25):
            self.close()
            raise ToolError(f"the server did not start (exit code {self.proc.returncode}; its log is above)")

    def pools_full(self) -> bool:
        """No request running, no cache block or KDA slot in use (its /metrics)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        values = {name: float(value) for name, _, value in (line.partition(" ") for line in text.splitlines())
                  if name in ("tpserve:num_requests_running", "tpserve:kv_cache_usage_perc",
                              "tpserve:kda_slot_usage_perc")}
        return len(values) == 3 and not any(values.values())

    def close(self, timeout: float = 60.0) -> None:
        """SIGTERM (it drains), then SIGKILL of its process group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.relay.join(5)
