"""OpenAI's error body, and the 400 body of a request that failed validation (`param` names the field)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ValidationError

from tpserve.server.chat import ParamError
from tpserve.server.router_fields import without_router_defaults

_FIELD_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
# pydantic puts the member of a union that failed into `loc`; those are not field names
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "dict", "list", "none"})


def error_body(message: str, type: str = "BadRequestError", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error JSON: {"error": {"message", "type", "param", "code"}}; code is a string or null."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _loc_to_param(loc: tuple) -> str | None:
    """("messages", 0, "content") -> "messages[0].content"; union member tags are skipped."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif _FIELD_NAME.match(part) and part not in _UNION_TAGS:
            param += f".{part}" if param else part
    return param or None


def validation_error_to_body(exc: ValidationError) -> dict:
    """The OpenAI error body (status 400) for a request that failed validation."""
    messages: list[str] = []
    first_param: str | None = None
    for err in exc.errors():
        cause = (err.get("ctx") or {}).get("error")
        param = getattr(cause, "param", None) or _loc_to_param(err["loc"])
        text = str(cause) if cause is not None else err["msg"]
        if not text.startswith(param or "\0"):
            text = f"{param}: {text}" if param else text
        if first_param is None:
            first_param = param
        if text not in messages:
            messages.append(text)
        if len(messages) == 3:
            break
    return error_body("; ".join(messages) or "invalid request", param=first_param)


def parse_request(model: type[BaseModel], body: Any) -> tuple[BaseModel | None, dict | None]:
    """(request, None) or (None, OpenAI error body) for a decoded JSON body."""
    if not isinstance(body, dict):
        return None, error_body("request body must be a JSON object")
    try:
        body = without_router_defaults(model, body)
    except ParamError as exc:
        return None, error_body(str(exc), param=exc.param)
    try:
        return model.model_validate(body), None
    except ValidationError as exc:
        return None, validation_error_to_body(exc)
