"""The router in front of the replicas: its process (started with no workers, on the public host/port, its
Prometheus metrics on a local port of their own) and its admin calls: add a worker once it is healthy,
remove one, list them.

- sglang-router (default, a pinned dependency) enforces `--api-key` on every route and sends the key on to
  the workers; its admin routes (`/workers*`) take a control-plane key that only this process knows, so a
  client key cannot add or remove workers.
- vllm-router (the `vllm-router` extra) checks no key: it passes the client's Authorization header on and
  the replicas check it. Its admin routes (`/add_worker`, `/remove_worker`) are open to whoever reaches its
  port, so it belongs on a trusted network."""

from __future__ import annotations

import logging
import secrets
import subprocess
import sys
import threading
import time

import httpx

from tpserve.engine.tp.launch import free_port
from tpserve.tools.fleet.replica import relay, wait_until_answers

POLICIES = ("cache_aware", "round_robin", "power_of_two")
ROUTERS = ("sglang-router", "vllm-router")
log = logging.getLogger("tpserve.fleet")
# the router's process gets SIGTERM when the fleet's main thread (which starts it) is gone (Linux's
# PR_SET_PDEATHSIG, kept across exec), so a killed fleet leaves no router holding the public port
_LAUNCH = ("import ctypes, os, signal, sys\n"
           "if sys.platform == 'linux': ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
           "os.execv(sys.executable, [sys.executable, '-m', sys.argv[1], *sys.argv[2:]])")


class RouterError(RuntimeError):
    pass


class Router:
    name, module = "", ""

    def __init__(self, host: str, port: int, policy: str, api_key: str | None, *, log_level: str = "error",
                 health_interval: int = 2):
        self.host, self.port, self.policy, self.api_key = host, port, policy, api_key
        self.log_level, self.health_interval = log_level, health_interval
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    @property
    def local_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def argv(self) -> list[str]:
        return [sys.executable, "-c", _LAUNCH, self.module, "--host", self.host, "--port", str(self.port),
                "--policy", self.policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
                "--health-check-interval-secs", str(self.health_interval), "--health-failure-threshold", "2",
                "--health-success-threshold", "1", "--worker-startup-timeout-secs", "1800"]

    def start(self, timeout: float = 120.0) -> None:
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        threading.Thread(target=relay, args=(self.proc.stdout, "[router] ", self.quiet), daemon=True).start()
        if wait_until_answers(self.local_url + "/liveness", self.alive, timeout, 0.2):
            return
        if not self.alive():
            raise RouterError(f"the router exited (code {self.proc.returncode}) before it listened on "
                              f"{self.host}:{self.port} (is the port taken?)")
        raise RouterError(f"the router did not answer on {self.host}:{self.port} within {timeout:.0f} s")

    def quiet(self, line: str) -> bool:
        """A line of the router's output not worth relaying."""
        return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _call(self, method: str, path: str, timeout: float = 10.0, **kw) -> httpx.Response:
        with httpx.Client(timeout=timeout) as client:
            return client.request(method, self.local_url + path, headers=self.admin_headers(), **kw)

    def admin_headers(self) -> dict[str, str]:
        return {}

    def workers(self) -> list[dict]:
        """[{"url", "is_healthy", ...}] as the router lists them."""
        r = self._call("GET", "/workers")
        if r.status_code != 200:
            raise RouterError(f"GET /workers answered {r.status_code}: {r.text[:200]}")
        return r.json().get("workers", [])

    def wait_healthy(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(w["url"] == url and w.get("is_healthy") for w in self.workers()):
                return
            time.sleep(0.2)
        raise RouterError(f"the router did not count {url} healthy within {timeout:.0f} s")

    def wait_gone(self, url: str, timeout: float) -> None:
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


class SglangRouter(Router):
    name, module = "sglang-router", "sglang_router.launch_router"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.admin_key = secrets.token_urlsafe(24)

    def argv(self) -> list[str]:
        level = {"warning": "warn", "critical": "error"}.get(self.log_level, self.log_level)
        argv = super().argv() + ["--control-plane-api-keys", f"fleet:tpserve:admin:{self.admin_key}",
                                 "--log-level", level]
        return argv + (["--api-key", self.api_key] if self.api_key else [])

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"}

    def add(self, url: str, timeout: float = 120.0, wait: bool = True) -> None:
        """Register `url` (with the API key it checks); with `wait`, return once the router counts it healthy."""
        with self._lock:
            r = self._call("POST", "/workers", json={"url": url, **({"api_key": self.api_key} if self.api_key else {})})
        if r.status_code not in (200, 201, 202):
            raise RouterError(f"adding worker {url}: the router answered {r.status_code}: {r.text[:200]}")
        if wait:
            self.wait_healthy(url, timeout)

    def remove(self, url: str, timeout: float = 30.0) -> None:
        """Take `url` out of rotation (requests already sent to it finish); return once it is gone."""
        with self._lock:
            for w in self.workers():
                if w["url"] == url:
                    r = self._call("DELETE", f"/workers/{w['id']}")
                    if r.status_code not in (200, 202, 204, 404):
                        raise RouterError(f"removing worker {url}: the router answered {r.status_code}")
        self.wait_gone(url, timeout)


class VllmRouter(Router):
    name, module = "vllm-router", "vllm_router.launch_router"

    def argv(self) -> list[str]:
        level = {"warn": "warning"}.get(self.log_level, self.log_level)
        return super().argv() + ["--worker-startup-check-interval", "1", "--log-level", level]

    def quiet(self, line: str) -> bool:
        return line.startswith("DEBUG:")  # printed whatever --log-level says

    def add(self, url: str, timeout: float = 120.0, wait: bool = True) -> None:
        """POST /add_worker answers once the worker is healthy; without `wait` that call runs in the background."""
        if not wait:
            threading.Thread(target=self._add, args=(url, 1800.0), daemon=True).start()
            return
        self._add(url, timeout)
        self.wait_healthy(url, timeout)

    def _add(self, url: str, timeout: float) -> None:
        r = self._call("POST", "/add_worker", timeout=timeout + 10.0, params={"url": url})
        if r.status_code != 200 and "already exists" not in r.text:
            raise RouterError(f"adding worker {url}: the router answered {r.status_code}: {r.text[:200]}")

    def remove(self, url: str, timeout: float = 30.0) -> None:
        with self._lock:
            r = self._call("POST", "/remove_worker", params={"url": url})
        if r.status_code != 200:
            raise RouterError(f"removing worker {url}: the router answered {r.status_code}: {r.text[:200]}")
        self.wait_gone(url, timeout)


def make_router(kind: str, host: str, port: int, policy: str, api_key: str | None, log_level: str) -> Router:
    cls = {"sglang-router": SglangRouter, "vllm-router": VllmRouter}[kind]
    try:
        __import__(cls.module.split(".")[0])
    except ImportError:
        hint = "sglang-router==0.3.2" if kind == "sglang-router" else "'tpserve[vllm-router]'"
        raise RouterError(f"--router {kind}: the package is not installed (pip install {hint})") from None
    if kind == "vllm-router" and policy == "power_of_two":
        # it starts with no workers (each joins once healthy), and its power_of_two refuses fewer than 2
        raise RouterError("--router vllm-router cannot start --router-policy power_of_two without workers; use "
                          "sglang-router or another policy")
    if kind == "vllm-router" and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("vllm-router checks no key on its admin routes (/add_worker, /remove_worker): whoever reaches "
                    "%s:%d can change the replicas; keep it on a trusted network or use sglang-router", host, port)
    return cls(host, port, policy, api_key, log_level=log_level)
