"""The OpenAI-compatible HTTP server (FastAPI): routes, auth, errors, health, metrics.

Every error is OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`): 400 for bad
input, 401 for a missing/wrong key, 503 when the queue is full or the engine is dead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tpserve.engine.async_engine import AsyncEngine, QueueFullError
from tpserve.engine.executor import EngineDeadError
from tpserve.server.metrics import ServerMetrics
from tpserve.server.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest,
                                     error_body, parse_request)
from tpserve.server.responses import DetokenizeResponse, ModelCard, ModelList, TokenizeResponse

log = logging.getLogger("tpserve.server")


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "BadRequestError", param: str | None = None,
                 code: str | int | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param
        self.code = status if code is None else code

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.type, self.param, self.code), status_code=self.status)


@dataclass
class ServerState:
    engine: AsyncEngine
    served_model_names: list[str]
    api_key: str | None = None
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    metrics: ServerMetrics | None = None

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.engine.max_model_len

    def check_model(self, name: str | None) -> str:
        if name is None or name in self.served_model_names:
            return self.served_model_names[0]
        raise ApiError(400, f"The model `{name}` does not exist.", type="NotFoundError", param="model",
                       code="model_not_found")

    def need_tokenizer(self, what: str):
        if self.tokenizer is None:
            raise ApiError(400, f"{what} needs a tokenizer; this server runs with --skip-tokenizer-init "
                           "(send token ids)")
        return self.tokenizer


def generation_defaults(model_dir: Path) -> dict[str, Any]:
    """Sampling defaults from generation_config.json (like vLLM's --generation-config auto)."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    return {k: raw[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty") if k in raw}


async def read_json(request: Request, model):
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    parsed, err = parse_request(model, body)
    if err is not None:
        e = err["error"]
        raise ApiError(400, e["message"], type=e.get("type") or "BadRequestError", param=e.get("param"))
    return parsed


async def until_disconnect(request: Request, coro):
    """Run `coro`; cancel it (aborting its requests) if the client goes away."""
    task = asyncio.ensure_future(coro)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise ApiError(499, "client disconnected", type="ClientClosedRequest")
    finally:
        if not task.done():
            task.cancel()


def build_app(state: ServerState) -> FastAPI:
    from tpserve.server.serving_chat import chat_completions
    from tpserve.server.serving_completion import completions

    app = FastAPI(title="tpserve", docs_url=None, redoc_url=None)
    app.state.tpserve = state
    state.metrics = state.metrics or ServerMetrics(state.engine.stats)

    async def check_key(request: Request) -> None:
        # a dependency, not a middleware: BaseHTTPMiddleware would hide client disconnects
        if state.api_key:
            header = request.headers.get("authorization", "")
            token = header[7:] if header.lower().startswith("bearer ") else ""
            if not secrets.compare_digest(token.encode(), state.api_key.encode()):
                raise ApiError(401, "Incorrect API key provided.", type="AuthenticationError",
                               code="invalid_api_key")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(QueueFullError)
    async def queue_full(_: Request, exc: QueueFullError):
        return ApiError(503, str(exc), type="ServiceUnavailableError").response()

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_: Request, exc: EngineDeadError):
        return ApiError(503, f"the engine is not running: {exc}", type="ServiceUnavailableError").response()

    @app.exception_handler(ValueError)
    async def bad_value(_: Request, exc: ValueError):
        return ApiError(400, str(exc), param=getattr(exc, "param", None)).response()

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception):
        log.exception("unhandled error")
        return ApiError(500, f"internal error: {type(exc).__name__}", type="InternalServerError").response()

    @app.get("/health")
    async def health():
        reason = state.engine.dead_reason
        if reason:
            return JSONResponse(error_body(f"engine is dead: {reason}", "ServiceUnavailableError", None, 503),
                                status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @v1.get("/models")
    async def models():
        cards = [ModelCard(id=name, root=str(state.engine.engine.model_dir), max_model_len=state.max_model_len)
                 for name in state.served_model_names]
        return JSONResponse(ModelList(data=cards).model_dump())

    @v1.post("/chat/completions")
    async def chat(request: Request):
        return await chat_completions(state, request, await read_json(request, ChatCompletionRequest))

    @v1.post("/completions")
    async def complete(request: Request):
        return await completions(state, request, await read_json(request, CompletionRequest))

    app.include_router(v1)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req: TokenizeRequest = await read_json(request, TokenizeRequest)
        state.check_model(req.model)
        tok = state.need_tokenizer("tokenize")
        if req.messages is not None:
            from tpserve.server.chat import apply_chat_template

            text = apply_chat_template(tok, req.messages, None, add_generation_prompt=req.add_generation_prompt)
            ids = tok.encode(text, add_special_tokens=False)
        else:
            ids = tok.encode(req.prompt, add_special_tokens=req.special_tokens())
        return JSONResponse(TokenizeResponse(tokens=ids, count=len(ids), max_model_len=state.max_model_len)
                            .model_dump(exclude_none=True))

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req: DetokenizeRequest = await read_json(request, DetokenizeRequest)
        state.check_model(req.model)
        tok = state.need_tokenizer("detokenize")
        vocab = state.engine.engine.model_config.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise ApiError(400, f"token ids {bad[:3]} are out of range for vocab_size {vocab}", param="tokens")
        return JSONResponse(DetokenizeResponse(prompt=tok.decode(req.tokens)).model_dump())

    return app
