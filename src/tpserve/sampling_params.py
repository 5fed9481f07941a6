"""SamplingParams, shaped like vLLM's (same names, defaults and meanings)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0              # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None  # top-k logprobs per token (0: only the sampled token)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = None  # logprob of every prompt token + its top-k (0: only that token)
    stop_list: list[str] = field(init=False, repr=False)
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (like vLLM)
    structured_outputs: object | None = None  # engine.logits_process.StructuredOutput (a grammar)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        def number(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                bad(name, "must be a number")
            return value

        def integer(name: str) -> int:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                bad(name, "must be an integer")
            return value

        if integer("n") < 1:
            bad("n", "must be at least 1")
        if number("temperature") < 0:
            bad("temperature", "must be non-negative")
        if not 0 < number("top_p") <= 1:
            bad("top_p", "must be in (0, 1]")
        if integer("top_k") < -1:
            bad("top_k", "must be -1 or 0 (off) or a positive integer")
        if not 0 <= number("min_p") <= 1:
            bad("min_p", "must be in [0, 1]")
        if self.seed is not None:
            integer("seed")
        if self.max_tokens is not None and integer("max_tokens") < 1:
            bad("max_tokens", "must be at least 1")
        if integer("min_tokens") < 0:
            bad("min_tokens", "must be non-negative")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= number(name) <= 2:
                bad(name, "must be in [-2, 2]")
        if number("repetition_penalty") <= 0:
            bad("repetition_penalty", "must be positive")
        if self.logprobs is not None and not 0 <= integer("logprobs") <= 20:
            bad("logprobs", "must be in [0, 20]")
        if self.prompt_logprobs is not None and not 0 <= integer("prompt_logprobs") <= 20:
            bad("prompt_logprobs", "must be in [0, 20]")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            bad("stop", "must be a non-empty string or a list of them")
        self.stop_list = stops
        ids = self.stop_token_ids or []
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
            bad("stop_token_ids", "must be a list of non-negative token ids")
        for tok, bias in (self.logit_bias or {}).items():
            if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                bad("logit_bias", "keys must be token ids")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
                bad("logit_bias", "values must be numbers in [-100, 100]")
        if self.top_k == -1:
            self.top_k = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def child(self, index: int) -> "SamplingParams":
        """The parameters of the index-th of n samples (seed + index, like vLLM)."""
        seed = None if self.seed is None else self.seed + index
        return replace(self, n=1, seed=seed)
