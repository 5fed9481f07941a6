"""The offline API, shaped like vLLM's: `LLM(model=...).generate(prompts, sampling_params)`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from collections.abc import Sequence as Seq
from typing import Any

from tpserve.config import EngineConfig
from tpserve.engine.engine import LLMEngine
from tpserve.engine.outputs import RequestOutput
from tpserve.engine.tokenizer import encode
from tpserve.sampling_params import SamplingParams


COUNTERS = ("prefix_cache_queries", "prefix_cache_hits")  # stats that only grow (besides spec_decode_num_*)


@dataclass(frozen=True)
class Metric:
    """One metric of LLM.get_metrics() (vLLM's Counter / Gauge / Vector have these fields)."""

    name: str
    kind: str                      # counter, gauge or vector
    value: float = 0.0
    values: list[int] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


class LLM:
    def __init__(self, model: str | None = None, *, device: str = "auto", dtype: str = "auto",
                 tensor_parallel_size: int = 1, skip_tokenizer_init: bool = False, seed: int = 0,
                 **engine_options: Any):
        self.config = EngineConfig.from_env(model=model, device=device, dtype=dtype,
                                            tensor_parallel_size=tensor_parallel_size,
                                            skip_tokenizer_init=skip_tokenizer_init, seed=seed, **engine_options)
        self.engine = LLMEngine(self.config)
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | dict | Seq[str | dict],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. Prompts are strings or {"prompt_token_ids": [...]} (or
        {"prompt": ...}), a dict with an optional "cache_salt" (vLLM's: prefixes are shared only within a salt)."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = list(sampling_params) if isinstance(sampling_params, Seq) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params: {len(params)} given for {len(prompts)} prompts")
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                token_ids, text = self._tokens(prompt)
                rid = f"offline-{next(self._ids)}"
                salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
                self.engine.add_request(rid, token_ids, p, prompt=text, final_only=True, cache_salt=salt)
                ids.append(rid)
        except Exception:
            for rid in ids:
                self.engine.abort(rid)
            raise
        done: dict[str, RequestOutput] = {}
        from tqdm import tqdm

        with tqdm(total=len(ids), desc="generating", disable=not use_tqdm) as bar:
            while len(done) < len(ids):
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        return [done[r] for r in ids]

    def chat(self, messages: Seq[dict] | Seq[Seq[dict]],
             sampling_params: SamplingParams | Seq[SamplingParams] | None = None, use_tqdm: bool = False, *,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             tools: list[dict] | None = None, chat_template_kwargs: dict[str, Any] | None = None
             ) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of OpenAI messages) or a list of them, rendered
        with the chat template (ours for GLM unless `chat_template` is given), then generated.
        The outputs hold the raw text (reasoning and tool calls are not parsed out)."""
        from tpserve.server.chat import apply_chat_template

        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("messages: chat needs a tokenizer (the engine runs with skip_tokenizer_init)")
        if not isinstance(messages, Seq) or isinstance(messages, str) or not messages:
            raise ValueError("messages: expected a non-empty list of messages or of conversations")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        kwargs = dict(chat_template_kwargs or {})
        prompts = []
        for conv in conversations:
            text = apply_chat_template(tok, list(conv), tools, add_generation_prompt=add_generation_prompt,
                                       chat_template=chat_template, chat_template_kwargs=kwargs,
                                       enable_thinking=kwargs.get("enable_thinking"),
                                       reasoning_effort=kwargs.get("reasoning_effort"))
            prompts.append({"prompt_token_ids": encode(tok, text, add_special_tokens=False), "prompt": text})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _tokens(self, prompt: str | dict) -> tuple[list[int], str | None]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"]), prompt.get("prompt")
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("prompt: a dict prompt needs 'prompt_token_ids' or 'prompt'")
        if not isinstance(prompt, str):
            raise ValueError(f"prompt: expected a string or a dict, got {type(prompt).__name__}")
        if self.engine.tokenizer is None:
            raise ValueError("prompt: text prompts need a tokenizer; with skip_tokenizer_init=True pass "
                             "{'prompt_token_ids': [...]}")
        return encode(self.engine.tokenizer, prompt), prompt

    def get_metrics(self) -> list["Metric"]:
        """vLLM's LLM.get_metrics(): the engine's counters and gauges, each with `name` and `value`
        (`values` for per-position vectors), named as on the server's /metrics."""
        out = []
        for key, value in self.engine.stats().items():
            name = "tpserve:" + key
            if isinstance(value, list):
                out.append(Metric(name, "vector", values=list(value)))
            else:
                kind = "counter" if key.startswith(("spec_decode_num", "preemptions")) or key in COUNTERS else "gauge"
                out.append(Metric(name, kind, value=value))
        return out

    def reset_prefix_cache(self) -> bool:
        """vLLM's LLM.reset_prefix_cache: forget every cached prefix. -> whether prefix caching is on."""
        return self.engine.reset_prefix_cache()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
