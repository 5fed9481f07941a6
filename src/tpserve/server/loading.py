"""While the engine loads, answer every request on the already bound socket with 503 (`Retry-After: 1`), so
a router or load balancer probing /health sees "not ready" instead of a connection that hangs. Stopped
before uvicorn takes the socket over; connections still queued then are served by uvicorn."""

from __future__ import annotations

import json
import select
import socket
import threading

from tpserve.server.protocol import error_body

MAX_HEAD = 64 << 10
MAX_DRAIN = 1 << 20  # request body bytes read (and dropped) so the client sees the answer, not a reset


class LoadingResponder:
    def __init__(self, sock: socket.socket):
        self.sock, self._stop = sock, threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpserve-loading", daemon=True)

    def start(self) -> "LoadingResponder":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.1)
            if not ready or self._stop.is_set():
                continue
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                _answer(conn)


def _answer(conn: socket.socket) -> None:
    conn.settimeout(1.0)
    data = b""
    try:
        while b"\r\n\r\n" not in data and len(data) < MAX_HEAD:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next((int(v) for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
                       if k.strip().lower() == b"content-length" and v.strip().isdigit()), 0)
        left = min(length, MAX_DRAIN) - len(rest)
        while left > 0 and (chunk := conn.recv(min(left, 65536))):
            left -= len(chunk)
        body = json.dumps(error_body("the model is loading; retry shortly", "ServiceUnavailableError", None,
                                     503)).encode()
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                     b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    except OSError:
        return
