"""The router in front of the replicas (sglang-router, a pinned dependency): its process, started with no
workers, and its admin calls (add a worker once it is healthy, remove one, list them).

It listens on the public host/port, enforces `--api-key` on every route (and sends the key on to the
workers), and keeps its admin routes (`/workers*`) behind a control-plane key that only this process
knows, so a client key cannot add or remove workers. Its Prometheus metrics are on a local port of
their own (read by the fleet's /metrics)."""

from __future__ import annotations

import secrets
import subprocess
import sys
import threading
import time

import httpx

from tpserve.engine.tp.launch import free_port
from tpserve.tools.fleet.replica import relay

POLICIES = ("cache_aware", "round_robin", "power_of_two")
ROUTERS = ("sglang-router",)
# the router's process gets SIGTERM when the fleet's main thread (which starts it) is gone (Linux's
# PR_SET_PDEATHSIG, kept across exec), so a killed fleet leaves no router holding the public port
_LAUNCH = ("import ctypes, os, signal, sys\n"
           "if sys.platform == 'linux': ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
           "os.execv(sys.executable, [sys.executable, '-m', 'sglang_router.launch_router', *sys.argv[1:]])")


class RouterError(RuntimeError):
    pass


class SglangRouter:
    def __init__(self, host: str, port: int, policy: str, api_key: str | None, *, log_level: str = "warn",
                 health_interval: float = 2.0):
        self.host, self.port, self.policy, self.api_key = host, port, policy, api_key
        self.log_level, self.health_interval = log_level, health_interval
        self.admin_key = secrets.token_urlsafe(24)
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    @property
    def local_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-c", _LAUNCH, "--host", self.host, "--port", str(self.port),
                "--policy", self.policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
                "--health-check-interval-secs", str(int(self.health_interval)), "--health-failure-threshold", "2",
                "--health-success-threshold", "1", "--worker-startup-timeout-secs", "1800",
                "--control-plane-api-keys", f"fleet:tpserve:admin:{self.admin_key}", "--log-level", self.log_level]
        return argv + (["--api-key", self.api_key] if self.api_key else [])

    def start(self, timeout: float = 120.0) -> None:
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        threading.Thread(target=relay, args=(self.proc.stdout, "[router] "), daemon=True).start()
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RouterError(f"the router exited (code {self.proc.returncode}) before it listened on "
                                      f"{self.host}:{self.port} (is the port taken?)")
                try:
                    if client.get(self.local_url + "/liveness").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise RouterError(f"the router did not answer on {self.host}:{self.port} within {timeout:.0f} s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _call(self, method: str, path: str, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        with httpx.Client(timeout=10.0) as client:
            return client.request(method, self.local_url + path, headers=headers, **kw)

    def workers(self) -> list[dict]:
        r = self._call("GET", "/workers")
        if r.status_code != 200:
            raise RouterError(f"GET /workers answered {r.status_code}: {r.text[:200]}")
        return r.json().get("workers", [])

    def add(self, url: str, timeout: float = 120.0, wait: bool = True) -> None:
        """Register `url` (with the API key it checks); with `wait`, return once the router counts it healthy."""
        with self._lock:
            r = self._call("POST", "/workers", json={"url": url, **({"api_key": self.api_key} if self.api_key else {})})
        if r.status_code not in (200, 201, 202):
            raise RouterError(f"adding worker {url}: the router answered {r.status_code}: {r.text[:200]}")
        deadline = time.monotonic() + timeout
        while wait and time.monotonic() < deadline:
            if any(w["url"] == url and w.get("is_healthy") for w in self.workers()):
                return
            time.sleep(0.2)
        if wait:
            raise RouterError(f"the router did not count {url} healthy within {timeout:.0f} s")

    def remove(self, url: str, timeout: float = 30.0) -> None:
        """Take `url` out of rotation (requests already sent to it finish); return once it is gone."""
        with self._lock:
            for w in self.workers():
                if w["url"] == url:
                    r = self._call("DELETE", f"/workers/{w['id']}")
                    if r.status_code not in (200, 202, 204, 404):
                        raise RouterError(f"removing worker {url}: the router answered {r.status_code}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(w["url"] != url for w in self.workers()):
                return
            time.sleep(0.1)
        raise RouterError(f"the router still lists {url} after {timeout:.0f} s")

    def metrics(self) -> str:
        with httpx.Client(timeout=5.0) as client:
            return client.get(f"http://127.0.0.1:{self.metrics_port}/metrics").text

    def stop(self, timeout: float) -> None:
        """SIGTERM: the router stops accepting and lets running requests finish; SIGKILL after `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
