"""Fields that routers in front of replicas (sglang-router, vllm-router) add to every request body, at
their default values. tpserve accepts them at those values and refuses any other value with a 400 naming
the field, since it does not do what the other value asks. A field the request model declares itself
(e.g. `skip_special_tokens` once the model implements it) is left to the model."""

from __future__ import annotations

import json
from typing import Any

from tpserve.server.chat import ParamError

_COMMON = {"no_stop_trim": False, "return_hidden_states": False, "skip_special_tokens": True}
# request model name -> field -> the value the routers send (the only one tpserve serves)
ROUTER_FIELDS: dict[str, dict[str, bool]] = {
    "ChatCompletionRequest": {**_COMMON, "continue_final_message": False, "separate_reasoning": True,
                              "stream_reasoning": True, "include_reasoning": True},
    "CompletionRequest": dict(_COMMON),
    "TokenizeRequest": {"continue_final_message": False},  # vllm-router's cache_aware tokenizes on every worker
}


def without_router_defaults(model: type, body: dict[str, Any]) -> dict[str, Any]:
    """`body` less the router fields at their default values; ParamError for a router field at another value."""
    fields = ROUTER_FIELDS.get(model.__name__)
    if not fields or not fields.keys() & body.keys():
        return body
    declared = getattr(model, "model_fields", {})
    out = dict(body)
    for name, default in fields.items():
        if name not in out or name in declared:
            continue
        value = out.pop(name)
        if value is not None and value is not default:
            raise ParamError(name, f"{name}={json.dumps(value)} is not supported (tpserve serves only "
                                   f"{name}={json.dumps(default)}, the value routers send)")
    return out

