"""A Sequence: one sample being generated (a request with n > 1 owns n of them)."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import torch

from tpserve.engine.outputs import Logprob
from tpserve.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ORDER = itertools.count()


@dataclass(eq=False)
class Sequence:
    request_id: str
    index: int                       # which of the request's n samples
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int                  # resolved against max_model_len
    eos_ids: frozenset[int]
    arrival: int = field(default_factory=lambda: next(_ORDER))
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed: int = 0            # tokens whose state is in the cache
    blocks: list[int] = field(default_factory=list)
    slot: int | None = None
    generator: torch.Generator | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    text: str = ""                   # detokenized output (stop strings applied)
    num_preemptions: int = 0
    detok: object | None = None      # engine.detokenize.Detokenizer when a tokenizer is loaded
    final_only: bool = False         # the caller reads the finished output only (LLM.generate): no per-step
    # outputs, and without stop strings no per-token detokenization (`text` is decoded once at the end)
    prompt_logprobs: list | None = None  # engine.prompt_logprobs: [None, {token id: Logprob}, ...]
    constraint: object | None = None  # engine.logits_process.SeqConstraint when the output is constrained
    # speculative decoding (engine/spec/speculator.py)
    drafts: list[int] = field(default_factory=list)  # tokens drafted after the last one, verified next step
    draft_probs: list | None = None  # sampled requests: the draft distribution q of each draft [V]
    draft_sure: list[float] = field(default_factory=list)  # the drafter's probability of each draft
    mtp_computed: int = 0            # positions whose MTP drafter cache rows are real
    mtp_recompute: bool = False      # its prefix hit was cut to blocks with MTP rows: its prompt's pass runs
    # prefix caching (engine/prefix_cache.py)
    cache_salt: str | None = None    # requests with different salts share no cached block or state
    num_cached_tokens: int = 0       # prompt tokens found in the prefix cache when first scheduled
    prefix: object | None = None     # prefix_cache.SeqPrefix: its block keys and index entries

    @property
    def in_decode(self) -> bool:
        """Every token but the last is in the cache: the next step decodes (or verifies drafts)."""
        return self.num_computed == self.num_tokens - 1

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def token_at(self, pos: int) -> int:
        """Token at `pos`; positions past the known tokens are the pending drafts."""
        n = len(self.prompt_ids)
        if pos < n:
            return self.prompt_ids[pos]
        return self.output_ids[pos - n] if pos - n < len(self.output_ids) else self.drafts[pos - self.num_tokens]

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
