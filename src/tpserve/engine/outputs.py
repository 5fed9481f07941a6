"""RequestOutput / CompletionOutput, shaped like vLLM's."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None  # per token: {token id: Logprob}
    finish_reason: str | None = None                   # "stop" | "length" | "abort" | None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    metrics: dict = field(default_factory=dict)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # [None, {token id: Logprob}, ...]
