"""Request fields third-party clients send besides the core ones: OpenAI chat fields this server
accepts and ignores, vLLM's sampling extensions (honoured) and `stream_options`.

docs/api.md lists which are honoured and which are accepted without effect. Each is validated
like OpenAI or vLLM does, so a wrong type still gets a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from tpserve.server.chat import ParamError
from tpserve.server.request_parts import OpenAIModel

Metadata = dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    # vLLM's: usage (so far) on every chunk too; like vLLM, only together with include_usage
    continuous_usage_stats: bool = False
    include_obfuscation: bool | None = None  # OpenAI's; no obfuscation padding is ever sent


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: str


class Prediction(OpenAIModel):
    """OpenAI's predicted output (a latency hint): validated, not used."""

    type: Literal["content"]
    content: str | list[TextPart]


class ChatPassThrough(OpenAIModel):
    """OpenAI chat fields that change nothing here: no storage, tiers, prompt cache keys or audio."""

    store: bool | None = None
    metadata: Annotated[Metadata, Field(max_length=16)] | None = None
    service_tier: ServiceTier | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    prediction: Prediction | None = None
    modalities: list[str] | None = None

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: list[str] | None) -> list[str] | None:
        for m in value or ():
            if m != "text":
                raise ParamError("modalities", f"modalities: only 'text' output is supported, got {m!r}")
        return value


class StructuredOutputs(OpenAIModel):
    """vLLM's `structured_outputs`: exactly one constraint (server/structured.py compiles it)."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: Annotated[str, Field(min_length=1)] | None = None
    choice: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None
    grammar: Annotated[str, Field(min_length=1)] | None = None  # Lark (llguidance) or GBNF
    json_object: bool | None = None
    # accepted for vLLM compatibility: output JSON is always compact, objects closed unless opened
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    disable_fallback: bool | None = None

    @field_validator("json_")
    @classmethod
    def _json_schema(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ParamError("structured_outputs.json", "structured_outputs.json is not valid JSON") from None
            if not isinstance(value, dict):
                raise ParamError("structured_outputs.json", "structured_outputs.json must be a JSON schema object")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        kinds = [k for k in ("json_", "regex", "choice", "grammar") if getattr(self, k) is not None]
        kinds += ["json_object"] if self.json_object else []
        if len(kinds) != 1:
            raise ParamError("structured_outputs", "structured_outputs needs exactly one of json, regex, choice, "
                             f"grammar or json_object, got {len(kinds)}")
        return self


class VllmSampling(OpenAIModel):
    """vLLM's sampling extensions, honoured (passed on to SamplingParams)."""

    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputs | None = None

    def vllm_params(self) -> dict:
        return {"min_tokens": self.min_tokens, "skip_special_tokens": self.skip_special_tokens,
                "include_stop_str_in_output": self.include_stop_str_in_output}
