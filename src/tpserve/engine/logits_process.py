"""Logit processors applied before sampling: `logit_bias` and grammar constraints (llguidance).

A request's SamplingParams may carry `logit_bias` ({token id: bias}, added to the logits) and
`structured_outputs` (a `StructuredOutput`: a grammar validated against the tokenizer by a
`GrammarCompiler`). Each constrained Sequence gets its own matcher (`seq.constraint`), made at its
first sampling step and advanced by `advance(seq, token)` after each sampled token. The masks of
all constrained rows are computed on the CPU into one int32 bitmask, unpacked once and moved to
the logits' device in one copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tpserve.model.h2d import to_device

# JSON output without free whitespace: a model cannot stall in an endless run of spaces
JSON_OPTIONS = {"whitespace_flexible": False}


@dataclass(frozen=True)
class StructuredOutput:
    """A validated grammar (llguidance's format: Lark or its JSON form) and the tokenizer it is for."""

    grammar: str
    tokenizer: Any  # llguidance.LLTokenizer
    kind: str       # json_object, json_schema, tool_call: for messages


class SeqConstraint:
    """One sequence's position in its grammar."""

    def __init__(self, spec: StructuredOutput):
        import llguidance

        self.matcher = llguidance.LLMatcher(spec.tokenizer, spec.grammar)

    def fill(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed tokens into bitmask[row]; False when the matcher is in an error state."""
        if self.matcher.is_error():
            return False
        # llguidance.torch.fill_next_token_bitmask without importing that module (it pulls torch.compile in)
        target = bitmask[row]
        self.matcher.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * target.element_size())
        return not self.matcher.is_error()


class GrammarCompiler:
    """Builds StructuredOutputs for one tokenizer; every error is a ValueError naming the problem."""

    def __init__(self, hf_tokenizer, vocab_size: int, eos_ids: list[int]):
        import llguidance.hf

        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=list(eos_ids))

    def json_schema(self, schema: dict, kind: str = "json_schema") -> StructuredOutput:
        import llguidance

        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"the JSON schema cannot be used: {exc}") from None
        return self._checked(grammar, kind)

    def json_object(self) -> StructuredOutput:
        return self.json_schema({"type": "object"}, kind="json_object")

    def lark(self, grammar: str, kind: str) -> StructuredOutput:
        return self._checked(grammar, kind)

    def _checked(self, grammar: str, kind: str) -> StructuredOutput:
        import llguidance

        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise ValueError(f"the grammar library rejects it: {messages[0] if messages else 'invalid'}")
        return StructuredOutput(grammar, self.tokenizer, kind)


def apply_logits_processors(logits: torch.Tensor, seqs: list) -> torch.Tensor:
    """logits [B, V] fp32, one row per Sequence: add logit_bias, mask tokens the grammar forbids."""
    rows, toks, vals = [], [], []
    vocab = logits.shape[1]
    for r, seq in enumerate(seqs):
        for tok, bias in (seq.params.logit_bias or {}).items():
            if 0 <= tok < vocab:
                rows.append(r)
                toks.append(tok)
                vals.append(float(bias))
    if rows:
        dev = logits.device
        logits.index_put_((to_device(rows, dev), to_device(toks, dev)), to_device(vals, dev, logits.dtype),
                          accumulate=True)
    constrained = [(r, seq) for r, seq in enumerate(seqs) if seq.params.structured_outputs is not None]
    if not constrained:
        return logits
    words = max((seq.params.structured_outputs.tokenizer.vocab_size + 31) // 32 for _, seq in constrained)
    bitmask = torch.zeros(len(constrained), words, dtype=torch.int32)
    fallback = []
    for i, (_, seq) in enumerate(constrained):
        if seq.constraint is None:
            seq.constraint = SeqConstraint(seq.params.structured_outputs)
        if not seq.constraint.fill(bitmask, i):
            fallback.append(i)
    allowed = unpack_bitmask(bitmask, vocab)
    for i in fallback:  # a matcher in an error state: only end of sequence is allowed
        allowed[i] = False
        allowed[i, [t for t in constrained[i][1].eos_ids if t < vocab]] = True
    idx = to_device([r for r, _ in constrained], logits.device)
    allowed = allowed.to(logits.device, non_blocking=True)
    logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))
    return logits


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 [n, words] (bit j of word w: token 32 w + j) -> bool [n, vocab]."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    flat = bits.reshape(bitmask.shape[0], -1).bool()
    if flat.shape[1] < vocab:
        flat = torch.cat([flat, flat.new_zeros(flat.shape[0], vocab - flat.shape[1])], 1)
    return flat[:, :vocab].clone()


def advance(seq, token: int) -> None:
    """Move the sequence's grammar past the token it just sampled (no-op without a grammar)."""
    if seq.constraint is not None and not seq.constraint.matcher.is_error():
        seq.constraint.matcher.consume_token(token)


def grammar_finished(seq) -> bool:
    """The sequence's grammar allows nothing but the end (or failed): min_tokens then no longer holds back a stop,
    since no other token could follow."""
    m = None if seq.constraint is None else seq.constraint.matcher
    return m is not None and (m.is_stopped() or m.is_error())

