"""Run the app under uvicorn with tpserve's lifecycle: the drain deadline, a watchdog that exits
when the engine dies, and an exit code that says what happened (0: drained; 1: the server did not
start or the engine died). The listening socket comes bound (bind_socket, before the engine starts)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time

import uvicorn

log = logging.getLogger("tpserve.serve")
# after the engine dies: keep answering (503 on /health, errors to open streams) this long, then exit
DEAD_GRACE_S = 2.0
DRAIN_FLUSH_S = 2.0  # uvicorn's own graceful timeout is this much past ours (streams flush their [DONE])
PARENT_ENV = "TPSERVE_PARENT_PID"  # set by the fleet (tools/fleet): a replica whose supervisor is gone drains, exits


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state, drain_timeout: float):
        super().__init__(config)
        self.state, self.drain_timeout, self.loop = state, drain_timeout, None

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first and self.loop is not None and self.state.drain_cut is not None:
            self.loop.call_soon_threadsafe(self.loop.call_later, self.drain_timeout, self.state.drain_cut.set)


def bind_socket(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before the engine starts (as vLLM does): nothing the engine opens
    meanwhile (the tensor-parallel group's store, gloo's pairs) can take the port, and a taken port fails at once
    instead of after the model has loaded. port 0: any free port (read it back from getsockname())."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock  # not inheritable (Python's default): a child process never holds the port


class ServerRunner:
    def __init__(self, app, state, sock: socket.socket, *, host: str, port: int, log_level: str = "info",
                 drain_timeout: float = 120.0):
        """sock: from bind_socket (host and port name it in uvicorn's log)."""
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                timeout_graceful_shutdown=drain_timeout + DRAIN_FLUSH_S)
        self.server = _Server(config, state, drain_timeout)
        self.state, self.engine_died, self.sock = state, False, sock

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT or engine death; the exit code."""
        stop = threading.Event()
        watchdog = threading.Thread(target=self._watch, args=(stop,), name="tpserve-watchdog", daemon=True)
        watchdog.start()
        try:
            self.server.run(sockets=[self.sock])
        except SystemExit as exc:  # uvicorn exits 1 when it cannot start; our SIGTERM handler exits 0
            if exc.code not in (0, None) or not self.server.started:
                log.error("the server did not start")
                return 1
            log.info("SIGTERM: requests drained, shutting down")
        finally:
            stop.set()
        if not self.server.started:
            log.error("the server did not start")
            return 1
        if self.engine_died:
            log.error("exiting: the engine died (%s)", self.state.engine.dead_reason)
            return 1
        return 0

    def _watch(self, stop: threading.Event) -> None:
        parent = int(os.environ.get(PARENT_ENV) or 0)
        while not stop.wait(0.2):
            if parent and os.getppid() != parent and self.server.started and not self.server.should_exit:
                log.error("the fleet that started this replica (pid %d) is gone: draining and exiting", parent)
                self.server.handle_exit(signal.SIGTERM, None)
            if self.state.engine.dead_reason and self.server.started:
                log.error("the engine died: %s; shutting down in %.0f s", self.state.engine.dead_reason,
                          DEAD_GRACE_S)
                time.sleep(DEAD_GRACE_S)
                self.engine_died = True
                self.server.should_exit = True
                if stop.wait(5.0):
                    return
                self.server.force_exit = True
                return
