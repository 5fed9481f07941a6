"""/openapi.json that declares every request and response body (pydantic models), as vLLM's does.

Handlers read their body themselves (size limit, JSON depth, off-loop parsing: state.read_json),
so FastAPI does not see a body parameter; `route_docs` declares it and `install_openapi` adds the
request models' JSON schemas to components.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from tpserve.server import responses
from tpserve.server.responses import ErrorResponse

_ERROR_TEXT = {400: "bad input", 401: "missing or wrong API key", 404: "unknown model or route",
               413: "body over --max-request-bytes", 503: "queue full or engine dead"}


# one server-sent event: `data:` holds a JSON chunk (the 200 model's stream form), an error, or [DONE]
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}


def route_docs(request: type[BaseModel] | None, response: type[BaseModel] | str | None, *, stream: bool = False,
               errors: tuple[int, ...] = (), text: bool = False) -> dict[str, Any]:
    """Decorator kwargs (responses, openapi_extra) declaring a route's bodies."""
    if isinstance(response, str):
        response = getattr(responses, response)
    codes = sorted({401, *errors, *((400, 404, 413, 503) if request is not None else ())})
    out: dict[int, dict] = {code: {"model": ErrorResponse, "description": _ERROR_TEXT[code]} for code in codes}
    if response is not None:
        out[200] = {"model": response, "description": "OK"}
        if stream:
            out[200]["content"] = {"text/event-stream": {"schema": SSE_EVENT}}
    elif text:
        out[200] = {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}}
    else:
        out[200] = {"description": "OK (empty body)"}
    kwargs: dict[str, Any] = {"responses": out}
    if response is None:
        kwargs["response_class"] = Response  # no JSON body declared
    if request is not None:
        ref = {"$ref": f"#/components/schemas/{request.__name__}"}
        kwargs["openapi_extra"] = {"requestBody": {"required": True,
                                                   "content": {"application/json": {"schema": ref}}},
                                   "x-request-model": request.__name__}
    return kwargs


def install_openapi(app: FastAPI, model_names: list[str], vocab_size: int) -> None:
    """Serve the full schema at /openapi.json; `model` fields list the served names and token ids
    the vocabulary's range (what validation will accept)."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            models = []
            for path in schema.get("paths", {}).values():
                for op in path.values():
                    name = op.pop("x-request-model", None)
                    if name:
                        models.append(_request_models()[name])
            _, defs = models_json_schema([(m, "validation") for m in models],
                                         ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, body in defs.get("$defs", {}).items():
                components.setdefault(name, body)
                if name in _request_models() and "model" in body.get("properties", {}):
                    body["properties"]["model"] = {"anyOf": [{"enum": list(model_names)}, {"type": "null"}],
                                                   "title": "Model"}
            _narrow(schema, model_names, vocab_size)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _narrow(schema: dict, model_names: list[str], vocab_size: int) -> None:
    for param in schema["paths"].get("/v1/models/{model_id}", {}).get("get", {}).get("parameters", []):
        if param.get("name") == "model_id":
            param["schema"] = {"type": "string", "enum": list(model_names)}
    stack = [schema["components"]["schemas"]]
    while stack:  # token ids: {"type": "integer", "minimum": 0} -> add the vocabulary's maximum
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "integer" and node.get("minimum") == 0 and "maximum" not in node:
                node["maximum"] = vocab_size - 1
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _request_models() -> dict[str, type[BaseModel]]:
    from tpserve.server import protocol
    from tpserve.server.responses_protocol import ResponsesRequest

    return {"ResponsesRequest": ResponsesRequest,
            **{name: getattr(protocol, name) for name in ("ChatCompletionRequest", "CompletionRequest",
                                                          "TokenizeRequest", "DetokenizeRequest")}}
