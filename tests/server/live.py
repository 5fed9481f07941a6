"""A live tpserve server on localhost for the API tests (the library's LocalServer)."""

from __future__ import annotations

from tpserve.config import EngineConfig
from tpserve.server.local import LocalServer


def LiveServer(model_dir: str, *, api_key: str | None = None, max_waiting: int = 64, state_options=None,
               **engine_kw) -> LocalServer:
    engine_kw.setdefault("kv_cache_memory", "8MiB")
    cfg = EngineConfig.from_env(model=model_dir, device="cpu", max_waiting=max_waiting, **engine_kw)
    return LocalServer(cfg, api_key=api_key, **(state_options or {}))
