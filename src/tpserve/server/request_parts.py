"""Parts of the request models: the strict base model, the JSON schema of chat messages (for
/openapi.json; chat.normalize_messages does the checking) and `response_format`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from tpserve.server.chat import ParamError


class OpenAIModel(BaseModel):
    """Unknown fields are refused (as OpenAI does); no coercion ("5" is not 5); no NaN/inf."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


_CONTENT_SCHEMA = {"anyOf": [
    {"type": "string"},
    {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                                "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}},
]}
_TOOL_CALL_SCHEMA = {"type": "object", "required": ["function"], "properties": {
    "id": {"type": "string"}, "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "minLength": 1}, "arguments": {"type": "string"}}}}}
# what chat.normalize_messages accepts, for /openapi.json (the check itself stays in normalize_messages)
MESSAGES_SCHEMA = {"type": "array", "minItems": 1, "items": {"anyOf": [
    {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"enum": ["system", "developer", "user"]}, "content": _CONTENT_SCHEMA, "name": {"type": "string"}}},
    {"type": "object", "required": ["role"], "properties": {
        "role": {"const": "assistant"}, "content": {"anyOf": [_CONTENT_SCHEMA, {"type": "null"}]},
        "reasoning_content": {"type": "string"}, "tool_calls": {"type": "array", "items": _TOOL_CALL_SCHEMA}}},
    {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"const": "tool"}, "content": _CONTENT_SCHEMA, "tool_call_id": {"type": "string"}}},
]}}
Messages = Annotated[list[dict[str, Any]], WithJsonSchema(MESSAGES_SCHEMA)]
MAX_LOGIT_BIAS = 100.0


class JsonSchemaFormat(OpenAIModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIModel):
    """`response_format`: text (no constraint), json_object (any JSON object) or json_schema.

    json_object may carry a `schema` (Together's and Anyscale's form, which instructor's
    JSON_SCHEMA mode sent before it moved to json_schema): the output follows it."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    object_schema: dict[str, Any] | None = Field(None, alias="schema")

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ParamError("response_format.json_schema",
                             "response_format.json_schema is required with type 'json_schema' (and only then)")
        if self.object_schema is not None and self.type != "json_object":
            raise ParamError("response_format.schema", "response_format.schema goes with type 'json_object' "
                             "(for json_schema, give json_schema.schema)")
        return self
