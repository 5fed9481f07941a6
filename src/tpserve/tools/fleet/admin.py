"""The fleet's control port (`--admin-port`, default: the public port + 1, on the public host). The router
owns the public port and serves only the inference routes, so what belongs to the fleet lives here:

  GET  /health                  200 once the fleet has started, its router runs and a replica serves (or
                                remote ones are listed), else 503 (no key)
  GET  /metrics                 every replica's metrics labelled `replica`, the router's, replica_up
  GET  /admin/replicas          replicas (url, pid, state, start time, restarts), router, last rolling restart
  POST /admin/rolling_restart   202: a rolling restart starts (as SIGHUP does); 409 while one runs, 503 while
                                the fleet starts

Every route but /health needs `Authorization: Bearer <--api-key>` when a key is set (/metrics not with
--metrics-public)."""

from __future__ import annotations

import json
import logging
import secrets
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tpserve.tools.fleet.metrics import fleet_metrics

log = logging.getLogger("tpserve.fleet")


def _error(message: str, type: str, code: int) -> dict:
    return {"error": {"message": message, "type": type, "param": None, "code": code}}


class AdminServer:
    def __init__(self, fleet, host: str, port: int, api_key: str | None, metrics_public: bool = False):
        self.fleet, self.api_key, self.metrics_public = fleet, api_key, metrics_public
        admin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                admin.handle(self, "GET")

            def do_POST(self):
                admin.handle(self, "POST")

            def log_message(self, *args):
                pass

        server_cls = type("Server", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6}) if ":" in host \
            else ThreadingHTTPServer
        self.server = server_cls((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="fleet-admin", daemon=True)

    def start(self) -> "AdminServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def authorized(self, header: str) -> bool:
        if not self.api_key:
            return True
        token = header[7:] if header.lower().startswith("bearer ") else ""
        return secrets.compare_digest(token.encode(), self.api_key.encode())

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        length = int(req.headers.get("content-length") or 0)
        if length:
            req.rfile.read(min(length, 1 << 16))
        path = req.path.split("?", 1)[0]
        routes = {("GET", "/health"): self.health, ("GET", "/metrics"): self.metrics,
                  ("GET", "/admin/replicas"): self.replicas, ("POST", "/admin/rolling_restart"): self.rolling_restart}
        handler = routes.get((method, path))
        if handler is None:
            known = {p for _, p in routes}
            status = 405 if path in known else 404
            return self.send(req, status, _error(f"{method} {path}: no such route", "NotFoundError", status))
        public = path == "/health" or (path == "/metrics" and self.metrics_public)
        if not public and not self.authorized(req.headers.get("authorization", "")):
            return self.send(req, 401, _error("Incorrect API key provided.", "AuthenticationError", "invalid_api_key"))
        try:
            status, body = handler()
        except Exception as exc:  # noqa: BLE001 - one failed admin call must not stop the control port
            log.exception("admin %s %s failed", method, path)
            status, body = 500, _error(f"internal error: {exc}", "InternalServerError", 500)
        self.send(req, status, body)

    def send(self, req: BaseHTTPRequestHandler, status: int, body) -> None:
        if isinstance(body, bytes):
            data, kind = body, "text/plain; version=0.0.4"
        else:
            data, kind = json.dumps(body).encode(), "application/json"
        req.send_response(status)
        req.send_header("content-type", kind)
        req.send_header("content-length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def health(self):
        serving = self.fleet.serving()
        if self.fleet.started.is_set() and self.fleet.router.alive() and (serving or self.fleet.remote_urls):
            return 200, {"status": "ok", "replicas_serving": serving}
        return 503, _error("no replica is serving", "ServiceUnavailableError", 503)

    def metrics(self):
        return 200, fleet_metrics(self.fleet, self.api_key)

    def replicas(self):
        return 200, self.fleet.status()

    def rolling_restart(self):
        if not self.fleet.started.is_set():
            return 503, _error("the fleet is still starting", "ServiceUnavailableError", 503)
        if self.fleet.rolling_restart("admin endpoint"):
            return 202, {"status": "started", "replicas": len(self.fleet.replicas)}
        return 409, _error("a rolling restart is already running", "ConflictError", 409)
