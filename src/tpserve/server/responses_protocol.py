"""The request of POST /v1/responses (OpenAI's Responses API, stateless, as vLLM serves it) and its
translation into a chat request, so the chat path renders, samples and parses it.

`input` is a string (one user message) or a list of items: messages (role user / system /
developer / assistant, content a string or input_text / output_text parts), `function_call` and
`function_call_output` items (an earlier turn's tool call and its result) and `reasoning` items
(their text becomes the next assistant turn's reasoning). `instructions` becomes a system message
in front. Nothing is stored: `previous_response_id`, `background`, `prompt` templates, logprobs
(`include` message.output_text.logprobs / `top_logprobs`), `truncation: "auto"` and tools other
than functions are refused with a 400 naming the field; `store`, `service_tier`, `metadata`,
`user` and `text.verbosity` are accepted (metadata is echoed back).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, WithJsonSchema, field_validator, model_validator

from tpserve.server.chat import REASONING_EFFORTS, ParamError, normalize_messages
from tpserve.server.protocol import (ChatCompletionRequest, FunctionDefinition, check_cache_salt,
                                     validation_error_to_body)
from tpserve.server.request_fields import Metadata, ServiceTier
from tpserve.server.request_parts import OpenAIModel

__all__ = ["ResponsesRequest", "input_to_messages"]

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"enum": ["input_text", "output_text"]}, "text": {"type": "string"}}}
_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "type": {"const": "message"}, "role": {"enum": ["user", "system", "developer", "assistant"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}}}
_CALL = {"type": "object", "required": ["type", "call_id", "name", "arguments"], "properties": {
    "type": {"const": "function_call"}, "call_id": {"type": "string", "minLength": 1},
    "name": {"type": "string", "minLength": 1}, "arguments": {"type": "string"}}}
_CALL_OUTPUT = {"type": "object", "required": ["type", "call_id", "output"], "properties": {
    "type": {"const": "function_call_output"}, "call_id": {"type": "string"}, "output": {"type": "string"}}}
_REASONING = {"type": "object", "required": ["type", "summary"], "properties": {
    "type": {"const": "reasoning"}, "summary": {"type": "array", "items": {
        "type": "object", "required": ["type", "text"],
        "properties": {"type": {"const": "summary_text"}, "text": {"type": "string"}}}}}}
# what input_to_messages accepts, for /openapi.json (the check itself is input_to_messages)
INPUT_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {
    "anyOf": [_MESSAGE, _CALL, _CALL_OUTPUT, _REASONING]}}]}
ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")
# `include` values that only add data to output items this server never makes: accepted, no effect
VACUOUS_INCLUDES = ("code_interpreter_call.outputs", "computer_call_output.output.image_url",
                    "file_search_call.results", "message.input_image.image_url", "reasoning.encrypted_content",
                    "web_search_call.action.sources", "web_search_call.results")
_MESSAGES_PARAM = re.compile(r"^messages\[(\d+)\]")


def _text(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(where, f"{where} must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise ParamError(at, f"{at} must be an object with 'type' and 'text'")
        if part.get("type") not in kinds:
            raise ParamError(f"{at}.type", f"{at}.type {part.get('type')!r} is not supported (only "
                             f"{' / '.join(kinds)} parts are)")
        if not isinstance(part.get("text"), str):
            raise ParamError(f"{at}.text", f"{at}.text must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ParamError(f"{where}.{key}", f"{where}.{key} is required and must be a non-empty string")
    return value


def _arguments(item: dict, where: str) -> str:
    text = item.get("arguments")
    try:
        ok = isinstance(text, str) and isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        ok = False
    if not ok:
        raise ParamError(f"{where}.arguments", f"{where}.arguments must be a JSON object, as text")
    return text


def input_to_messages(value: Any, instructions: str | None = None) -> tuple[list[dict], list[str]]:
    """(chat messages, the request field each came from) for `input` and `instructions`.

    Raises ParamError naming the offending field, e.g. "input[2].content[0].type"."""
    messages: list[dict] = []
    origin: list[str] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
        origin.append("instructions")
    if isinstance(value, str):
        return messages + [{"role": "user", "content": value}], origin + ["input"]
    if not isinstance(value, list) or not value:
        raise ParamError("input", "input must be a string or a non-empty list of items")
    reasoning: str | None = None  # from a reasoning item, for the next assistant turn
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ParamError(where, f"{where} must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise ParamError(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
            if "content" not in item:
                raise ParamError(f"{where}.content", f"{where}.content is required")
            message = {"role": role, "content": _text(item["content"], f"{where}.content", TEXT_PARTS)}
            if role == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where), "arguments": _arguments(item, where)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and origin[-1] != "instructions" and reasoning is None:
                last.setdefault("tool_calls", []).append(call)  # parallel calls: one assistant turn
                continue
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            if reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
        elif kind == "function_call_output":
            message = {"role": "tool", "tool_call_id": _string(item, "call_id", where),
                       "content": _text(item.get("output"), f"{where}.output", ("input_text",))}
        elif kind == "reasoning":
            parts = [*(item.get("content") or ()), *(item.get("summary") or ())]
            reasoning = _text(parts, f"{where}.summary", ("reasoning_text", "summary_text"))
            continue
        else:
            raise ParamError(f"{where}.type", f"{where}.type {kind!r} is not supported (use message, function_call, "
                             "function_call_output or reasoning)")
        messages.append(message)
        origin.append(where)
    if all(o == "instructions" for o in origin):
        raise ParamError("input", "input needs a message or function call item (reasoning items alone are no turn)")
    try:
        normalize_messages(messages)
    except ParamError as exc:
        match = _MESSAGES_PARAM.match(exc.param or "")
        if match is None:
            raise ParamError("input", f"input: {exc}") from None
        at = origin[int(match.group(1))]
        raise ParamError(exc.param.replace(match.group(0), at, 1), str(exc).replace(match.group(0), at, 1)) from None
    return messages, origin


class FunctionTool(FunctionDefinition):
    """A Responses function tool: the chat tool's `function` fields, flat, with `type`."""

    type: Literal["function"]


class NamedFunctionChoice(OpenAIModel):
    type: Literal["function"]
    name: str


class TextFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> TextFormat:
        if (self.type == "json_schema") != (self.json_schema is not None and self.name is not None):
            raise ParamError("text.format", "text.format needs name and schema with type 'json_schema' (and only then)")
        return self


class TextConfig(OpenAIModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, no effect


class ReasoningConfig(OpenAIModel):
    effort: Literal[tuple(REASONING_EFFORTS)] | None = None  # type: ignore[valid-type]
    summary: Literal["auto", "concise", "detailed"] | None = None  # accepted: reasoning comes as text


class ResponsesRequest(OpenAIModel):
    """POST /v1/responses. See the module docstring for what is refused."""

    model: str | None = None
    input: Annotated[str | list[Any], WithJsonSchema(INPUT_SCHEMA)]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: Annotated[Metadata, Field(max_length=16)] | None = None
    user: str | None = None
    store: bool | None = None  # nothing is stored either way
    service_tier: ServiceTier | None = None
    truncation: Literal["disabled"] | None = None
    include: list[Literal[VACUOUS_INCLUDES]] | None = None  # type: ignore[valid-type]
    top_logprobs: Literal[0] | None = None  # logprobs are not offered here (use /v1/chat/completions)
    background: Literal[False] | None = None
    previous_response_id: None = None
    prompt: None = None
    cache_salt: str | None = None  # vLLM's: requests share cached prefixes only with the same salt

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for key, why in (("previous_response_id", "nothing is stored; send the whole conversation in input"),
                         ("background", "background responses need storage, which this server does not have"),
                         ("prompt", "prompt templates are not supported"),
                         ("top_logprobs", "logprobs are not supported on /v1/responses"),
                         ("truncation", "only 'disabled' is supported")):
            if data.get(key) not in (None, False, 0, "disabled"):
                raise ParamError(key, f"{key}: {why}")
        for i, tool in enumerate(data.get("tools") or ()):
            if isinstance(tool, dict) and tool.get("type") != "function":
                raise ParamError(f"tools[{i}].type", f"tools[{i}].type {tool.get('type')!r} is not supported "
                                 "(only 'function' tools are)")
        if "message.output_text.logprobs" in (data.get("include") or ()):
            raise ParamError("include", "include: message.output_text.logprobs is not supported")
        return data

    @field_validator("input")
    @classmethod
    def _check_input(cls, value: Any) -> Any:
        input_to_messages(value)
        return value

    @field_validator("cache_salt")
    @classmethod
    def _check_cache_salt(cls, value: str | None) -> str | None:
        return check_cache_salt(value)

    @field_validator("tool_choice")
    @classmethod
    def _check_tool_choice(cls, value: Any, info) -> Any:
        if "tools" not in info.data:  # tools itself failed validation
            return value
        names = [t.name for t in info.data.get("tools") or ()]
        if value == "required" and not names:
            raise ParamError("tool_choice", "tool_choice 'required' needs a non-empty tools list")
        if isinstance(value, NamedFunctionChoice) and value.name not in names:
            raise ParamError("tool_choice", f"tool_choice names function {value.name!r}, which is not in tools")
        return value

    def to_chat_request(self) -> ChatCompletionRequest:
        """The equivalent chat request (the chat path does the rest). Raises ParamError."""
        messages, _ = input_to_messages(self.input, self.instructions)
        chat: dict[str, Any] = {"model": self.model, "messages": messages,
                                "max_completion_tokens": self.max_output_tokens, "temperature": self.temperature,
                                "top_p": self.top_p, "top_k": self.top_k,
                                "parallel_tool_calls": self.parallel_tool_calls, "user": self.user,
                                "reasoning_effort": self.reasoning.effort if self.reasoning else None,
                                "cache_salt": self.cache_salt}
        if self.tools:
            chat["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                             for t in self.tools]
        if isinstance(self.tool_choice, NamedFunctionChoice):
            chat["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        else:
            chat["tool_choice"] = self.tool_choice
        fmt = self.text.format if self.text else None
        if fmt is not None:
            chat["response_format"] = {"type": fmt.type}
            if fmt.type == "json_schema":
                chat["response_format"]["json_schema"] = {"name": fmt.name, "schema": fmt.json_schema,
                                                          "description": fmt.description, "strict": fmt.strict}
        try:
            return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})
        except ValidationError as exc:  # not expected: the fields above were checked the same way
            err = validation_error_to_body(exc)["error"]
            raise ParamError("input", f"input: {err['message']}") from None
