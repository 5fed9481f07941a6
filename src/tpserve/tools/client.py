"""A small client for any OpenAI-compatible server, shared by the operator tools (smoke, bench,
quality, agent-tools): clear one-line errors for a wrong URL, a refused connection or a
rejected API key; streamed responses parsed strictly (a broken SSE stream is an error).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Iterator

from tpserve.tools.sse import SseError, sse_event


class ToolError(Exception):
    """A problem the operator can fix; printed as one line, no traceback."""


class ApiError(ToolError):
    """The server answered with an HTTP error status."""

    def __init__(self, status: int, body, what: str):
        self.status, self.body = status, body
        message = body.get("error", {}).get("message") if isinstance(body, dict) and isinstance(
            body.get("error"), dict) else str(body)[:200]
        super().__init__(f"{what}: HTTP {status}: {message}")


def add_client_args(p, *, url_required: bool = True) -> None:
    p.add_argument("--url", required=url_required, default=None,
                   help="the server's base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)")
    p.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    p.add_argument("--model", dest="served_model", default=None, help="model name (default: the first listed)")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON to this file ('-': stdout)")


def normalize_url(url: str) -> str:
    from urllib.parse import urlparse

    if not isinstance(url, str) or not url.strip():
        raise ToolError("--url is empty")
    parsed = urlparse(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ToolError(f"--url {url!r} is not a URL like http://host:port")
    base = url.strip().rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def _explain(exc: Exception, url: str) -> ToolError:
    import httpx

    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        if "refused" in text.lower() or "errno 111" in text.lower():
            return ToolError(f"cannot connect to {url}: connection refused (is the server running on that port?)")
        return ToolError(f"cannot connect to {url}: {text}")
    if isinstance(exc, httpx.TimeoutException):
        return ToolError(f"{url} did not answer in time ({type(exc).__name__})")
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return ToolError(f"--url {url!r} is not a usable URL: {text}")
    if isinstance(exc, httpx.RemoteProtocolError):
        return ToolError(f"{url} broke the connection: {text}")
    return ToolError(f"request to {url} failed: {type(exc).__name__}: {text}")


class Client:
    """Synchronous JSON client. `model` is the served model name (the first listed unless given)."""

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None, timeout: float = 120):
        import httpx

        self.url = normalize_url(url)
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.http = httpx.Client(timeout=timeout, headers=headers)
        self._model = model
        self.max_model_len: int | None = None

    @property
    def headers(self) -> dict:
        return dict(self.http.headers)

    def close(self) -> None:
        self.http.close()

    def _check(self, r, what: str):
        if r.status_code in (401, 403):
            raise ToolError(f"{self.url} rejected the API key (HTTP {r.status_code}): pass --api-key or set "
                            "OPENAI_API_KEY")
        try:
            body = r.json()
        except ValueError:
            body = r.text
        if r.status_code != 200:
            if r.status_code == 404 and what == "GET /v1/models":
                raise ToolError(f"{self.url} is not an OpenAI-compatible server (GET /v1/models: HTTP 404)")
            raise ApiError(r.status_code, body, what)
        if not isinstance(body, dict):
            raise ToolError(f"{what}: the server did not answer JSON: {str(body)[:120]!r}")
        return body

    def get(self, path: str) -> dict:
        try:
            r = self.http.get(self.url + path)
        except Exception as exc:  # noqa: BLE001 - turned into one clear line
            raise _explain(exc, self.url) from None
        return self._check(r, f"GET {path}")

    def post(self, path: str, body: dict) -> dict:
        try:
            r = self.http.post(self.url + path, json=body)
        except Exception as exc:  # noqa: BLE001
            raise _explain(exc, self.url) from None
        return self._check(r, f"POST {path}")

    def post_raw(self, path: str, body: dict):
        """(status, decoded body) without raising on HTTP errors other than auth."""
        try:
            r = self.http.post(self.url + path, json=body)
        except Exception as exc:  # noqa: BLE001
            raise _explain(exc, self.url) from None
        if r.status_code in (401, 403):
            self._check(r, f"POST {path}")
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    def models(self) -> list[dict]:
        data = self.get("/v1/models").get("data")
        if not isinstance(data, list):
            raise ToolError(f"{self.url}/v1/models has no 'data' list")
        return data

    @property
    def model(self) -> str:
        if self._model is None:
            cards = self.models()
            if not cards:
                raise ToolError(f"{self.url}/v1/models lists no model")
            self._model = cards[0]["id"]
            self.max_model_len = cards[0].get("max_model_len")
        return self._model

    def stream(self, path: str, body: dict) -> Iterator[tuple[float, dict]]:
        """(arrival time, chunk) for each SSE event; raises ToolError on a broken stream
        (an undecodable event, an error event, or no `data: [DONE]` at the end)."""
        body = dict(body, stream=True)
        try:
            with self.http.stream("POST", self.url + path, json=body) as r:
                if r.status_code != 200:
                    r.read()
                    self._check(r, f"POST {path} (stream)")
                done = False
                for line in r.iter_lines():
                    try:
                        kind, chunk = sse_event(line, done)
                    except SseError as exc:
                        raise ToolError(f"POST {path}: {exc}") from None
                    if kind == "done":
                        done = True
                    if kind != "chunk":
                        continue
                    if isinstance(chunk, dict) and "error" in chunk:
                        raise ApiError(stream_error_status(chunk["error"]), chunk, f"POST {path} (stream)")
                    yield time.perf_counter(), chunk
                if not done:
                    raise ToolError(f"POST {path}: the SSE stream ended without data: [DONE]")
        except ToolError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _explain(exc, self.url) from None


def collect_chat_stream(chunks) -> dict:
    """Merge streamed chat chunks into one message: content, reasoning, tool calls, finish_reason, usage."""
    msg = {"content": "", "reasoning_content": "", "tool_calls": {}, "finish_reason": None, "usage": None}
    for _, c in chunks:
        if c.get("usage"):
            msg["usage"] = c["usage"]
        for ch in c.get("choices") or []:
            d = ch.get("delta") or {}
            msg["content"] += d.get("content") or ""
            msg["reasoning_content"] += d.get("reasoning_content") or d.get("reasoning") or ""
            for tc in d.get("tool_calls") or []:
                slot = msg["tool_calls"].setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": ""})
                slot["id"] = slot["id"] or tc.get("id")
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            if ch.get("finish_reason"):
                msg["finish_reason"] = ch["finish_reason"]
    msg["tool_calls"] = [{"id": v["id"], "type": "function", "function": {"name": v["name"], "arguments": v["arguments"]}}
                         for _, v in sorted(msg["tool_calls"].items())]
    return msg


def emit_json(path: str | None, result) -> None:
    if not path:
        return
    text = json.dumps(result, indent=2, default=str)
    if path == "-":
        print(text)
    else:
        with open(path, "w") as f:
            f.write(text + "\n")


def friendly(func):
    """Wrap a tool's `run(args)`: a ToolError (or a connection problem) is one line on stderr, exit 2."""

    @functools.wraps(func)
    def wrapper(args) -> int:
        import httpx

        try:
            return func(args)
        except ToolError as exc:
            print(f"tpserve: error: {exc}", file=sys.stderr)
            return 2
        except httpx.HTTPError as exc:
            print(f"tpserve: error: {_explain(exc, getattr(args, 'url', '?'))}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("tpserve: interrupted", file=sys.stderr)
            return 130

    return wrapper


STREAM_ERROR_STATUS = {"ServiceUnavailableError": 503, "BadRequestError": 400, "NotFoundError": 404}


def stream_error_status(error: dict) -> int:
    """The HTTP status an error event inside a stream stands for (the stream's own status was 200): an
    integer `code` where a server sends one, else the status of its OpenAI error `type`, else 500."""
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    return STREAM_ERROR_STATUS.get(error.get("type") if isinstance(error, dict) else None, 500)

