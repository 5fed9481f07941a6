"""Pydantic response models for the OpenAI API subset (re-exported by protocol.py)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer

__all__ = [
    "ChatChoiceLogprobs",
    "ChatCompletionChoice",
    "ChatCompletionResponse",
    "ChatCompletionStreamChoice",
    "ChatCompletionStreamResponse",
    "ChatLogprobToken",
    "ChatMessage",
    "ChatTopLogprob",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionResponse",
    "CompletionStreamResponse",
    "DeltaFunctionCall",
    "DeltaMessage",
    "DeltaToolCall",
    "DetokenizeResponse",
    "ErrorInfo",
    "ErrorResponse",
    "FunctionCall",
    "ModelCard",
    "ModelList",
    "PromptTokensDetails",
    "TokenizeResponse",
    "ToolCall",
    "UsageInfo",
    "random_id",
]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _now() -> int:
    return int(time.time())


def _with_nulls(data: dict) -> dict:
    """A choice as OpenAI streams it: `logprobs` and `finish_reason` present even when null
    (chunks are dumped with exclude_none, which would drop them)."""
    data.setdefault("logprobs", None)
    data.setdefault("finish_reason", None)
    return data


class ErrorInfo(BaseModel):
    message: str
    type: str = "BadRequestError"
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "tpserve"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)


# --- logprobs -------------------------------------------------------------------------


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatLogprobToken] | None = None


class CompletionLogprobs(BaseModel):
    """Legacy completions shape (one entry per generated token in each list)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


# --- chat -------------------------------------------------------------------------------


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str = Field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # the same text as reasoning_content (newer clients read this)
    tool_calls: list[ToolCall] | None = None  # left out of the JSON when there are none

    @model_serializer(mode="wrap")
    def _omit_no_tool_calls(self, handler):
        data = handler(self)
        if not data.get("tool_calls"):
            data.pop("tool_calls", None)
        return data


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo = Field(default_factory=UsageInfo)
    system_fingerprint: str | None = None


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @classmethod
    def from_parser(cls, delta: dict[str, Any] | None) -> DeltaMessage:
        """From a parsers.merge_deltas result (None -> an empty delta)."""
        delta = dict(delta or {})
        if delta.get("reasoning_content"):
            delta["reasoning"] = delta["reasoning_content"]
        if not delta.get("tool_calls"):
            delta.pop("tool_calls", None)
        return cls.model_validate(delta)


class ChatCompletionStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @model_serializer(mode="wrap")
    def _nulls(self, handler):
        return _with_nulls(handler(self))


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionStreamChoice] = Field(default_factory=list)
    usage: UsageInfo | None = None  # the final chunk's with include_usage; every chunk's with continuous_usage_stats


# --- legacy completions ------------------------------------------------------------------


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @model_serializer(mode="wrap")
    def _nulls(self, handler):
        return _with_nulls(handler(self))


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo = Field(default_factory=UsageInfo)
    system_fingerprint: str | None = None


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice] = Field(default_factory=list)
    usage: UsageInfo | None = None


# --- tokenize -----------------------------------------------------------------------------


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str
