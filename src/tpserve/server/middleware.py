"""A pure ASGI guard in front of every route: the API key and the declared body size.

Pure ASGI (not BaseHTTPMiddleware), so handlers still see a client that goes away.
"""

from __future__ import annotations

import json

from tpserve.server.protocol import error_body

OPEN_PATHS = frozenset({"/health"})


class GuardMiddleware:
    def __init__(self, app, state):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        public = path in OPEN_PATHS or (path == "/metrics" and self.state.metrics_public)
        if not public and not self.state.authorized(headers.get("authorization", "")):
            return await _send_error(send, 401, "Incorrect API key provided.", "AuthenticationError",
                                     "invalid_api_key")
        declared = headers.get("content-length", "")
        limit = self.state.max_request_bytes
        if declared.isdigit() and int(declared) > limit:
            await _discard_body(receive)  # read (not kept) so the client sees the answer, not a reset
            return await _send_error(send, 413, f"request body is larger than {limit} bytes (--max-request-bytes)",
                                     "RequestTooLargeError", None)
        return await self.app(scope, receive, send)


async def _discard_body(receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return


async def _send_error(send, status: int, message: str, type: str, code) -> None:
    body = json.dumps(error_body(message, type, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
