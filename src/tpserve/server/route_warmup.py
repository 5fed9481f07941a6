"""The HTTP layer's part of the warm-up: before the server accepts its first connection, one request down each
generation route, in process through the app's own ASGI interface: what those routes build on first use (the web
framework's route state, the async backend's import, the worker threads, the chat template) is built then, not
while the first clients wait (bench/first_request.py). The metrics start after it: the requests count nowhere."""

from __future__ import annotations

import logging
import time

import httpx

from tpserve.server.metrics import ServerMetrics

log = logging.getLogger("tpserve.warmup")
TIMEOUT_S = 120.0
ROUTES = (("/v1/completions", {"prompt": [0], "stream": True}),
          ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "stream": True}),
          ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}))


async def warm_routes(app, state) -> list[int]:
    """Send ROUTES (one token each, greedy) to `app`; the status codes. A refusal (a model without a chat
    template) or an error is logged, never raised: serving starts either way."""
    t0 = time.perf_counter()
    headers = {"Authorization": f"Bearer {state.api_key}"} if state.api_key else {}
    codes = []
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://warmup", timeout=TIMEOUT_S) as client:
        for path, body in ROUTES:
            try:
                r = await client.post(path, headers=headers, json={"model": state.served_model_names[0],
                                                                  "max_tokens": 1, "temperature": 0, **body})
                codes.append(r.status_code)
                if r.status_code != 200:
                    log.info("warm-up request to %s: %d %s", path, r.status_code, r.text[:200])
            except Exception as exc:  # noqa: BLE001 (the server must start even if this fails)
                log.warning("warm-up request to %s failed: %s", path, exc)
                codes.append(0)
    state.metrics = ServerMetrics(state.engine.stats, skip_to_now=True)
    log.info("warm-up routes: %d requests through the HTTP layer (%s) in %.0f ms", len(codes),
             ", ".join(map(str, codes)), (time.perf_counter() - t0) * 1e3)
    return codes
