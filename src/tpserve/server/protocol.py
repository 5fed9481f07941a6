"""Pydantic models for the OpenAI API subset tpserve serves (error bodies from errors.py re-exported).

Requests refuse unknown fields (as OpenAI does) and are validated strictly (no "5" for 5, no
NaN): wrong types and out-of-range values raise pydantic's ValidationError;
`validation_error_to_body` turns one into OpenAI's error shape with `param` naming the field (the
server answers 400). `to_sampling_params()` gives the engine's sampling parameters as a plain
dict. Responses are in `responses.py`; the fields clients pass through in `request_fields.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    StrictInt,
    WithJsonSchema,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tpserve.server.chat import REASONING_EFFORTS, ParamError, normalize_messages
from tpserve.server.errors import error_body, parse_request, validation_error_to_body
from tpserve.server.request_fields import ChatPassThrough, StreamOptions, VllmSampling
from tpserve.server.request_parts import MAX_LOGIT_BIAS, Messages, OpenAIModel, ResponseFormat
from tpserve.server.responses import *  # noqa: F403  (re-exported: one import for the app)
from tpserve.server.responses import __all__ as _response_names

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "FunctionDefinition",
    "NamedToolChoice",
    "ParamError",
    "SamplingRequest",
    "StreamOptions",
    "TokenizeRequest",
    "ToolDefinition",
    "error_body",
    "parse_request",
    "validation_error_to_body",
    *_response_names,
]

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
# Used for fields the request leaves unset and `defaults` does not give.
SAMPLING_FALLBACKS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,  # 0 = disabled (-1 is accepted as disabled too)
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}
TokenId = Annotated[StrictInt, Field(ge=0)]
Text = Annotated[str, Field(min_length=1)]



def check_cache_salt(value: str | None) -> str | None:
    """vLLM's rule: a cache_salt, when given, is a non-empty string."""
    if value is not None and not value:
        raise ParamError("cache_salt", "cache_salt must be a non-empty string")
    return value

class FunctionDefinition(OpenAIModel):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[^\s<>]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(OpenAIModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class SamplingRequest(VllmSampling):
    """Fields shared by chat and legacy completions (vLLM's sampling extensions included)."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    stop: Text | list[Text] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    user: str | None = None
    logit_bias: Annotated[dict[str, Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]] | None,
                          WithJsonSchema({"anyOf": [{"type": "object", "propertyNames": {"pattern": "^[0-9]{1,9}$"},
                                                     "additionalProperties": {"type": "number", "minimum": -100,
                                                                              "maximum": 100}},
                                                    {"type": "null"}]})] = None  # token id (as a string) -> bias
    response_format: ResponseFormat | None = None
    cache_salt: str | None = None  # vLLM's: requests share cached prefixes only with the same salt

    @field_validator("cache_salt")
    @classmethod
    def _check_cache_salt(cls, value: str | None) -> str | None:
        return check_cache_salt(value)

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not (key.isascii() and key.isdigit()) or len(key) > 9:
                raise ParamError("logit_bias", f"logit_bias keys must be token ids, got {key[:20]!r}")
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ParamError("logit_bias", f"logit_bias values must be in [-100, 100], got {bias}")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        for s in [value] if isinstance(value, str) else value or ():
            if not s:
                raise ValueError("stop strings must not be empty")
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    @model_validator(mode="after")
    def _min_tokens_fit(self) -> SamplingRequest:
        most = self.effective_max_tokens()
        if most is not None and self.min_tokens > most:
            raise ParamError("min_tokens", f"min_tokens ({self.min_tokens}) is more than max_tokens ({most})")
        return self

    @model_validator(mode="after")
    def _one_output_constraint(self) -> SamplingRequest:
        if self.structured_outputs is not None and self.response_format is not None \
                and self.response_format.type != "text":
            raise ParamError("structured_outputs", "structured_outputs and response_format cannot both constrain "
                             "the output; give one")
        return self

    def usage_options(self) -> tuple[bool, bool]:
        """(usage in a final chunk, usage on every chunk) of a stream."""
        opts = self.stream_options
        usage = bool(opts and opts.include_usage)
        return usage, usage and opts.continuous_usage_stats

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def effective_max_tokens(self) -> int | None:
        return self.max_tokens

    def logprobs_count(self) -> int | None:
        return None

    def to_sampling_params(self, defaults: Mapping[str, Any] | None = None) -> dict:
        """The engine's sampling parameters as a plain dict.

        Keys: temperature, top_p, top_k (0 = off), min_p, seed, max_tokens (None: up to
        max_model_len), stop (list), stop_token_ids, ignore_eos, presence_penalty,
        frequency_penalty, repetition_penalty, logprobs (None: off; k: k top logprobs,
        0 = only the sampled token), n, and vLLM's min_tokens, skip_special_tokens,
        include_stop_str_in_output. Unset fields come from `defaults` (e.g. the model's
        generation_config: temperature, top_p, top_k, max_tokens...) or SAMPLING_FALLBACKS.
        """
        defaults = defaults or {}
        params = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "seed": self.seed,
            "max_tokens": self.effective_max_tokens(),
            "stop": self.stop_list(),
            "stop_token_ids": list(self.stop_token_ids or []),
            "ignore_eos": self.ignore_eos,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "logprobs": self.logprobs_count(),
            "n": self.n,
            **self.vllm_params(),
        }
        for key in ("temperature", "top_p", "top_k", "min_p", "max_tokens", "presence_penalty",
                    "frequency_penalty", "repetition_penalty"):
            if params[key] is None:
                params[key] = defaults.get(key, SAMPLING_FALLBACKS.get(key))
        if params["top_k"] is not None and params["top_k"] < 0:
            params["top_k"] = 0
        return params


class ChatCompletionRequest(SamplingRequest, ChatPassThrough):
    """POST /v1/chat/completions. `messages` are checked by chat.normalize_messages."""

    messages: Messages = Field(min_length=1)
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # False: a forced tool_choice makes exactly one call
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    @field_validator("messages")
    @classmethod
    def _check_messages(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        normalize_messages(value)  # raises ParamError naming e.g. messages[1].content
        return value

    @field_validator("tool_choice")
    @classmethod
    def _check_tool_choice(cls, value: Any, info: ValidationInfo) -> Any:
        if "tools" not in info.data:  # tools itself failed validation
            return value
        names = [t.function.name for t in info.data["tools"] or ()]
        if value == "required" and not names:
            raise ParamError("tool_choice", "tool_choice 'required' needs a non-empty tools list")
        if isinstance(value, NamedToolChoice) and value.function.name not in names:
            raise ParamError(
                "tool_choice",
                f"tool_choice names function {value.function.name!r}, which is not in tools",
            )
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs is only allowed when logprobs is true")
        return value

    @field_validator("reasoning_effort")
    @classmethod
    def _check_effort(cls, value: str | None) -> str | None:
        if value is None:
            return None
        key = value.strip().lower()
        if key not in REASONING_EFFORTS:
            raise ValueError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}")
        return key

    @field_validator("chat_template_kwargs")
    @classmethod
    def _check_template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        thinking = (value or {}).get("enable_thinking")
        if thinking is not None and not isinstance(thinking, bool):
            raise ParamError(
                "chat_template_kwargs.enable_thinking",
                "chat_template_kwargs.enable_thinking must be a boolean",
            )
        return value

    def enable_thinking(self) -> bool | None:
        """chat_template_kwargs.enable_thinking (None when not given)."""
        return (self.chat_template_kwargs or {}).get("enable_thinking")

    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(SamplingRequest):
    """POST /v1/completions (legacy). suffix and best_of > 1 are rejected.

    `echo` returns the prompt before the completion (with `logprobs`, the prompt tokens' logprobs
    too, the first one null); with echo, max_tokens may be 0: the prompt alone comes back."""

    prompt: (Text | Annotated[list[Text], Field(min_length=1)] | Annotated[list[TokenId], Field(min_length=1)]
             | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)])
    max_tokens: int | None = Field(None, ge=0)
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=1)  # only 1 (the default) is supported
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # vLLM's; non-streamed only

    @field_validator("prompt_logprobs")
    @classmethod
    def _prompt_logprobs_not_streamed(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("stream"):
            raise ValueError("prompt_logprobs is only supported without stream")
        return value

    @model_validator(mode="after")
    def _zero_tokens_need_echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ParamError("max_tokens", "max_tokens must be at least 1 (0 is allowed with echo)")
        return self

    def to_sampling_params(self, defaults: Mapping[str, Any] | None = None) -> dict:
        params = super().to_sampling_params(defaults)
        if self.echo and self.logprobs is not None:  # the echoed prompt's logprobs
            params["prompt_logprobs"] = max(self.prompt_logprobs or 0, self.logprobs)
        elif self.prompt_logprobs is not None:
            params["prompt_logprobs"] = self.prompt_logprobs
        if self.max_tokens == 0:  # echo alone: the engine makes one token, which is not returned
            params["max_tokens"] = 1
        return params

    def prompt_only(self) -> bool:
        return self.max_tokens == 0

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: Any) -> Any:
        items = [value] if isinstance(value, str) else value
        if not items or any(isinstance(p, (str, list)) and len(p) == 0 for p in items):
            raise ValueError("prompt must not be empty")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value is not None and value > 1:
            raise ValueError("best_of > 1 is not supported")
        return value

    def prompts(self) -> list[str | list[int]]:
        """The prompt(s) as a list: each a string or a list of token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, int) for p in self.prompt):
            return [list(self.prompt)]
        return [p if isinstance(p, str) else list(p) for p in self.prompt]

    def logprobs_count(self) -> int | None:
        return self.logprobs


class TokenizeRequest(OpenAIModel):
    """POST /tokenize (vLLM shape): either `prompt` or `messages` (rendered by the template)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}, "not": {"required": ["messages"]}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}, "not": {"required": ["prompt"]}},
    ]})

    model: str | None = None
    prompt: str | None = None
    messages: Messages | None = None
    tools: list[ToolDefinition] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None  # default: True for prompt, False for messages
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ParamError("prompt", "give exactly one of prompt or messages")
        if self.messages is not None:
            normalize_messages(self.messages)
        return self

    def enable_thinking(self) -> bool | None:
        thinking = (self.chat_template_kwargs or {}).get("enable_thinking")
        if thinking is not None and not isinstance(thinking, bool):
            raise ParamError("chat_template_kwargs.enable_thinking",
                             "chat_template_kwargs.enable_thinking must be a boolean")
        return thinking

    def special_tokens(self) -> bool:
        if self.add_special_tokens is not None:
            return self.add_special_tokens
        return self.prompt is not None


class DetokenizeRequest(OpenAIModel):
    """POST /detokenize: {"tokens": [...]} -> {"prompt": "..."}."""

    model: str | None = None
    tokens: list[TokenId]
