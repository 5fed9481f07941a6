"""What every route handler shares: the server state, API errors, the body reader (size, depth and
Unicode limits) and off-loop work. Below api.py and the serving_* handlers (no import circle).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse

from tpserve.engine.async_engine import AsyncEngine
from tpserve.server.memory import MallocTrimmer, trim_interval_from_env
from tpserve.server.metrics import ServerMetrics
from tpserve.server.protocol import error_body, parse_request

T = TypeVar("T")
DEFAULT_MAX_REQUEST_BYTES = 8 << 20
# JSON nesting deeper than this is refused (tool schemas nest a few levels; 100,000 crashes json.loads)
MAX_JSON_DEPTH = 64


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "BadRequestError", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.type, self.param, self.code), status_code=self.status)


@dataclass
class ServerState:
    engine: AsyncEngine
    served_model_names: list[str]
    api_key: str | None = None
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    metrics: ServerMetrics | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    metrics_public: bool = False
    # tokenization, template rendering and body parsing run here, never on the event loop
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(4, thread_name_prefix="tpserve-cpu"))
    # set (on the event loop) when a SIGTERM drain runs out of time: open streams end with an error
    drain_cut: asyncio.Event | None = None
    grammar: Any = None  # engine.logits_process.GrammarCompiler, built on first use (server/structured.py)
    # seconds between glibc malloc_trim(0) calls while the app runs (0: off; server/memory.py)
    malloc_trim_interval: float = field(default_factory=trim_interval_from_env)
    trimmer: MallocTrimmer | None = None  # running between the app's startup and shutdown
    warm_routes: bool = False  # at startup, one request down each generation route first (server/route_warmup.py)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.engine.max_model_len

    @cached_property
    def max_token_chars(self) -> int:
        """The longest vocabulary entry in characters: a text of c characters is >= c / this tokens."""
        tok = self.tokenizer
        try:
            return max(1, max(len(t) for t in tok.get_vocab()))
        except Exception:  # noqa: BLE001 - a tokenizer without a vocab listing: no pre-check
            return 1 << 30

    def check_model(self, name: str | None) -> str:
        if name is None or name in self.served_model_names:
            return self.served_model_names[0]
        raise ApiError(404, f"The model `{name}` does not exist.", type="NotFoundError", param="model",
                       code="model_not_found")

    def need_tokenizer(self, what: str):
        if self.tokenizer is None:
            raise ApiError(400, f"{what} needs a tokenizer; this server runs with --skip-tokenizer-init "
                           "(send token ids)")
        return self.tokenizer

    def check_text_length(self, chars: int, param: str) -> None:
        """Refuse, before tokenizing, a text that cannot fit in max_model_len tokens."""
        if self.tokenizer is not None and chars > self.max_model_len * self.max_token_chars:
            raise ApiError(400, f"{param}: {chars} characters is more than max_model_len ({self.max_model_len}) "
                           "tokens can hold", param=param)

    def authorized(self, header: str) -> bool:
        if not self.api_key:
            return True
        token = header[7:] if header.lower().startswith("bearer ") else ""
        return secrets.compare_digest(token.encode(), self.api_key.encode())

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def _parse_float(text: str) -> float | int:
    """JSON Schema's integers include 1.0: an integral number reads as an int (strict int fields take it)."""
    value = float(text)
    return int(value) if value.is_integer() and abs(value) < 2**63 else value


def check_json_value(value: Any) -> None:
    """Raise ApiError 400 for nesting deeper than MAX_JSON_DEPTH or a string with lone surrogates."""
    stack = [(value, "", 1)]
    while stack:
        obj, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ApiError(400, f"request body is nested deeper than {MAX_JSON_DEPTH} levels",
                           param=path or None)
        if isinstance(obj, str):
            _check_text(obj, path)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                _check_text(k, path)
                stack.append((v, f"{path}.{k}" if path else k, depth + 1))
        elif isinstance(obj, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(obj))


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start:exc.end].encode("unicode_escape", "backslashreplace").decode()
        raise ApiError(400, f"{path or 'body'}: contains a lone UTF-16 surrogate ({bad}), which is not valid "
                       "Unicode", param=path or None) from None


def decode_body(raw: bytes, model) -> Any:
    """bytes -> validated request model (runs in the thread pool). Raises ApiError 400."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_no_constant,
                          parse_float=_parse_float)  # JSON is UTF-8 (RFC 8259)
    except RecursionError:
        raise ApiError(400, f"request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, NaN, a number too long
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    check_json_value(body)
    parsed, err = parse_request(model, body)
    if err is not None:
        e = err["error"]
        raise ApiError(400, e["message"], type=e.get("type") or "BadRequestError", param=e.get("param"))
    return parsed


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or ApiError 413 as soon as it passes `limit` bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():  # read to the end even when too large (a reset is no answer)
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
    if size > limit:
        raise too_large(limit)
    return b"".join(chunks)


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than {limit} bytes (--max-request-bytes)",
                    type="RequestTooLargeError")


async def read_json(state: ServerState, request: Request, model):
    raw = await read_body(request, state.max_request_bytes)
    return await state.off_loop(decode_body, raw, model)


async def until_disconnect(request: Request, coro, cut: asyncio.Event | None = None):
    """Run `coro`; cancel it (aborting its requests) if the client goes away, or with a 503 when
    `cut` (the SIGTERM drain deadline) is set first."""
    task = asyncio.ensure_future(coro)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if cut is not None and cut.is_set():
                task.cancel()
                raise ApiError(503, "the server is shutting down and the drain timeout has passed",
                               type="ServiceUnavailableError")
            if await request.is_disconnected():
                task.cancel()
                raise ApiError(499, "client disconnected", type="ClientClosedRequest")
    finally:
        if not task.done():
            task.cancel()
