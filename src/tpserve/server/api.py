"""The OpenAI-compatible HTTP server (FastAPI): routes, auth, errors, health, metrics.

Every error is OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`): 400 for bad
input, 401 for a missing/wrong key (every route but /health, and /metrics unless public), 404 for
an unknown route or model, 405 for a wrong method, 413 for a body over --max-request-bytes, 503
when the queue is full or the engine is dead. Request and response bodies are declared in
/openapi.json (server/openapi.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tpserve import __version__
from tpserve.engine.async_engine import QueueFullError
from tpserve.engine.executor import EngineDeadError
from tpserve.server.memory import MallocTrimmer
from tpserve.server.metrics import ServerMetrics
from tpserve.server.middleware import GuardMiddleware
from tpserve.server.openapi import install_openapi, route_docs
from tpserve.server.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest,
                                     error_body)
from tpserve.server.responses import DetokenizeResponse, ModelCard, ModelList, TokenizeResponse
from tpserve.server.responses_models import ResponsesResponse
from tpserve.server.responses_protocol import ResponsesRequest
from tpserve.server.serving_chat import chat_completions
from tpserve.server.serving_completion import completions
from tpserve.server.serving_responses import create_response
from tpserve.server.state import ApiError, ServerState, read_json  # noqa: F401  (ServerState re-exported)
from tpserve.server.tokenize import detokenize_request, tokenize_request
from tpserve.server.route_warmup import warm_routes

log = logging.getLogger("tpserve.server")

_STATUS_TYPES = {404: "NotFoundError", 405: "MethodNotAllowedError", 413: "RequestTooLargeError"}


def generation_defaults(model_dir: Path) -> dict[str, Any]:
    """Sampling defaults from generation_config.json (like vLLM's --generation-config auto)."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    return {k: raw[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty") if k in raw}


def lift_tokenizer_limit(tokenizer) -> None:
    """Prompts are checked against max_model_len; transformers' warning about the tokenizer's own
    model_max_length (often smaller, and no limit of this engine) would only mislead the log."""
    if tokenizer is not None and hasattr(tokenizer, "model_max_length"):
        tokenizer.model_max_length = int(1e30)  # transformers' value for "no limit"


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404:
            message = f"{request.method} {request.url.path}: no such route"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        body = error_body(message, _STATUS_TYPES.get(exc.status_code, "HTTPError"))
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "path", "query")]
        return ApiError(400, first.get("msg", "invalid request"), param=".".join(loc) or None).response()

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


def build_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        state.trimmer = MallocTrimmer(state.malloc_trim_interval).start()  # gives free heap pages back
        if state.warm_routes:
            await warm_routes(app, state)
        try:
            yield
        finally:
            state.trimmer.stop()

    app = FastAPI(title="tpserve", version="0.1.0", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.tpserve = state
    state.drain_cut = state.drain_cut or asyncio.Event()
    state.metrics = state.metrics or ServerMetrics(state.engine.stats)
    lift_tokenizer_limit(state.tokenizer)
    app.add_middleware(GuardMiddleware, state=state)
    _install_error_handlers(app)
    v1 = APIRouter(prefix="/v1")

    @app.get("/health", **route_docs(None, None, errors=(503,)))
    async def health():
        reason = state.engine.dead_reason
        if reason:
            return JSONResponse(error_body(f"engine is dead: {reason}", "ServiceUnavailableError"),
                                status_code=503)
        return Response(status_code=200)

    @app.get("/metrics", **route_docs(None, None, text=True))
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/server_info", **route_docs(None, None))
    @app.get("/get_server_info", include_in_schema=False)
    async def server_info():
        # what routers read when a worker registers: the model id is served_model_name (no model path, which
        # a router would try to load a tokenizer from)
        ecfg = state.engine.engine.ecfg
        return JSONResponse({"served_model_name": state.served_model_names[0],
                             "served_model_names": state.served_model_names, "tp_size": ecfg.tensor_parallel_size,
                             "dp_size": 1, "max_model_len": state.max_model_len, "version": __version__})

    @app.get("/get_load", **route_docs(None, None))
    async def get_load():
        # sglang-router's power_of_two sums num_tokens over this list (one entry per data-parallel rank)
        s, block = state.engine.stats(), state.engine.engine.executor.cache_shape.block_size
        return JSONResponse([{"dp_rank": 0, "num_reqs": s["running"], "num_waiting_reqs": s["waiting"],
                              "num_tokens": (s["blocks_total"] - s["blocks_free"]) * block}])

    @app.post("/reset_prefix_cache", **route_docs(None, None, errors=(503,)))
    async def reset_prefix_cache():
        """vLLM's route: forget every cached prefix (blocks and KDA state checkpoints not in use)."""
        reason = state.engine.dead_reason
        if reason:
            raise EngineDeadError(reason)
        await asyncio.wait_for(state.engine.reset_prefix_cache(), timeout=60)
        return Response(status_code=200)

    def card(name: str) -> ModelCard:
        return ModelCard(id=name, root=str(state.engine.engine.model_dir), max_model_len=state.max_model_len)

    @v1.get("/models", **route_docs(None, ModelList))
    async def models():
        return JSONResponse(ModelList(data=[card(n) for n in state.served_model_names]).model_dump())

    @v1.get("/models/{model_id:path}", **route_docs(None, ModelCard, errors=(404,)))
    async def model(model_id: str):
        if model_id not in state.served_model_names:
            state.check_model(model_id)  # raises 404 model_not_found
        return JSONResponse(card(model_id).model_dump())

    @v1.post("/chat/completions", **route_docs(ChatCompletionRequest, "ChatCompletionResponse", stream=True))
    async def chat(request: Request):
        return await chat_completions(state, request, await read_json(state, request, ChatCompletionRequest))

    @v1.post("/completions", **route_docs(CompletionRequest, "CompletionResponse", stream=True))
    async def complete(request: Request):
        return await completions(state, request, await read_json(state, request, CompletionRequest))

    @v1.post("/responses", **route_docs(ResponsesRequest, ResponsesResponse, stream=True))
    async def responses(request: Request):
        return await create_response(state, request, await read_json(state, request, ResponsesRequest))

    app.include_router(v1)

    @app.post("/tokenize", **route_docs(TokenizeRequest, TokenizeResponse))
    async def tokenize(request: Request):
        return await tokenize_request(state, await read_json(state, request, TokenizeRequest))

    @app.post("/detokenize", **route_docs(DetokenizeRequest, DetokenizeResponse))
    async def detokenize(request: Request):
        return await detokenize_request(state, await read_json(state, request, DetokenizeRequest))

    install_openapi(app, state.served_model_names, state.engine.engine.model_config.vocab_size)
    return app
