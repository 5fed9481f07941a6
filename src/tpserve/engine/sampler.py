"""Sampler: penalties, temperature, top-k / top-p / min-p, per-request seeds, logprobs.

Greedy rows take the argmax of the penalised logits. Sampled rows draw with the exponential
race (argmax p / E, E ~ Exp(1)) from the request's own generator when it has a seed, else from
the engine's. Logprobs are those of the raw model distribution (vLLM's default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tpserve.engine.logits_process import apply_logits_processors
from tpserve.engine.outputs import Logprob
from tpserve.engine.request import Sequence


@dataclass
class SampleResult:
    token: int
    logprob: float | None
    top: dict[int, Logprob] | None


def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    for row, seq in enumerate(seqs):
        p = seq.params
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.prompt_ids) | set(seq.output_ids)), device=logits.device)
            vals = logits[row, seen]
            logits[row, seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and seq.output_ids:
            ids = torch.tensor(seq.output_ids, device=logits.device)
            counts = torch.bincount(ids, minlength=logits.shape[1]).to(logits.dtype)
            logits[row] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def _filter(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Mask (to -inf) the tokens outside top-k / top-p / min-p for one row of logits."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) > top_p  # keep the smallest prefix reaching top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, seqs: list[Sequence], engine_generator: torch.Generator) -> list[SampleResult]:
    """logits [B, V] fp32, one row per sequence."""
    want_logprobs = [s.params.logprobs is not None for s in seqs]
    raw_logprobs = logits.log_softmax(-1) if any(want_logprobs) else None
    logits = _apply_penalties(apply_logits_processors(logits.clone(), seqs), seqs)
    for row, seq in enumerate(seqs):  # suppress EOS / stop ids before min_tokens
        if len(seq.output_ids) < seq.params.min_tokens:
            banned = set(seq.params.stop_token_ids or []) | (set() if seq.params.ignore_eos else set(seq.eos_ids))
            if banned:
                logits[row, torch.tensor(sorted(banned), device=logits.device)] = float("-inf")
    tokens = logits.argmax(-1).tolist()
    for row, seq in enumerate(seqs):
        p = seq.params
        if p.greedy:
            continue
        row_logits = _filter(logits[row] / p.temperature, p.top_k, p.top_p, p.min_p)
        probs = row_logits.softmax(-1)
        gen = seq.generator if seq.generator is not None else engine_generator
        noise = torch.empty_like(probs).exponential_(generator=gen)
        tokens[row] = int((probs / noise).argmax())
    results = []
    for row, seq in enumerate(seqs):
        if not want_logprobs[row]:
            results.append(SampleResult(tokens[row], None, None))
            continue
        lp = raw_logprobs[row]
        chosen = float(lp[tokens[row]])
        top: dict[int, Logprob] = {}
        k = seq.params.logprobs
        if k:
            vals, ids = lp.topk(k)
            for r, (v, i) in enumerate(zip(vals.tolist(), ids.tolist())):
                top[i] = Logprob(v, rank=r + 1)
        if tokens[row] not in top:
            top[tokens[row]] = Logprob(chosen, rank=int((lp > lp[tokens[row]]).sum()) + 1)
        results.append(SampleResult(tokens[row], chosen, top))
    return results
