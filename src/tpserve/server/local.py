"""A server in a thread of this process (benchmarks and tests): engine + FastAPI + uvicorn."""

from __future__ import annotations

import threading
import time

from tpserve.config import EngineConfig


class LocalServer:
    def __init__(self, cfg: EngineConfig, *, served_model_names: list[str] | None = None,
                 api_key: str | None = None, host: str = "127.0.0.1", port: int = 0, **state_options):
        import uvicorn

        from tpserve.engine.async_engine import AsyncEngine
        from tpserve.engine.engine import LLMEngine
        from tpserve.server.api import ServerState, build_app, generation_defaults
        from tpserve.server.runner import bind_socket

        sock = bind_socket(host, port)  # before the engine, which opens ports of its own (server/runner.py)
        try:
            self.engine = AsyncEngine(LLMEngine(cfg), max_waiting=cfg.max_waiting)
        except BaseException:
            sock.close()
            raise
        state_options.setdefault("warm_routes", self.engine.engine.boot.on and cfg.warmup_routes)
        self.state = ServerState(self.engine, served_model_names or ["tiny"], api_key=api_key,
                                 sampling_defaults=generation_defaults(self.engine.engine.model_dir),
                                 **state_options)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(build_app(self.state), host=host, port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs=dict(sockets=[sock]), name="tpserve-uvicorn",
                                       daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                self.engine.shutdown()
                raise RuntimeError("the local server did not start")
            time.sleep(0.05)
        self.url = f"http://{host}:{self.port}"

    def pools_full(self) -> bool:
        s = self.engine.stats()
        return s["blocks_free"] == s["blocks_total"] and s["slots_free"] == s["slots_total"] and not s["running"]

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.engine.shutdown()
