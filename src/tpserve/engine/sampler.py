"""Sampler: penalties, temperature, top-k / top-p / min-p, per-request seeds, logprobs.

Batched on the logits' device: the per-row settings become tensors and every filter runs on the
whole batch at once; the only per-row work is drawing noise from a request's own generator
(requests with a seed). Greedy rows take the argmax of the penalised logits. Sampled rows draw
with the exponential race (argmax p / E, E ~ Exp(1)), E from the request's generator when it has
a seed, else from the engine's. Logprobs are those of the raw model distribution (vLLM's
default). One device-to-host copy per step brings back the tokens (and logprobs when asked).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tpserve.model.h2d import to_device
from tpserve.engine.logits_process import apply_logits_processors, grammar_finished
from tpserve.engine.outputs import Logprob
from tpserve.engine.request import Sequence


@dataclass
class SampleResult:
    token: int
    logprob: float | None
    top: dict[int, Logprob] | None


def _padded_ids(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """Ragged id lists -> [B, L] long on `device`, padded with -1 (one host-to-device copy)."""
    width = max((len(r) for r in rows), default=0) or 1
    arr = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        arr[i, :len(r)] = r
    return torch.from_numpy(arr).to(device, non_blocking=True)


def _counts(rows: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """How often each token occurs in each row -> [B, V] float32."""
    ids = _padded_ids(rows, device)
    ok = ids >= 0
    counts = torch.zeros(len(rows), vocab + 1, device=device)
    counts.scatter_add_(1, torch.where(ok, ids, vocab), ok.float())
    return counts[:, :vocab]


def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """vLLM's semantics: repetition over prompt and output tokens (positive logits divided, negative
    multiplied); presence / frequency over output tokens only."""
    params = [s.params for s in seqs]
    dev, vocab = logits.device, logits.shape[1]
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = _counts([s.prompt_ids + s.output_ids for s in seqs], vocab, dev) > 0
        rep = to_device([p.repetition_penalty for p in params], dev).unsqueeze(1)
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalised, logits)
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        counts = _counts([s.output_ids for s in seqs], vocab, dev)
        freq = to_device([p.frequency_penalty for p in params], dev).unsqueeze(1)
        pres = to_device([p.presence_penalty for p in params], dev).unsqueeze(1)
        logits = logits - freq * counts - pres * (counts > 0).float()
    return logits


def _ban_stops_before_min_tokens(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    banned = []
    for seq in seqs:
        p = seq.params
        ids = set()
        if len(seq.output_ids) < p.min_tokens and not grammar_finished(seq):
            ids = set(p.stop_token_ids or []) | (set() if p.ignore_eos else set(seq.eos_ids))
        banned.append(sorted(ids))
    if not any(banned):
        return logits
    mask = _counts(banned, logits.shape[1], logits.device) > 0
    return logits.masked_fill(mask, float("-inf"))


def _filter(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
            top_p_on: bool, largest_k: int, min_p_on: bool) -> torch.Tensor:
    """Mask (to -inf) the tokens outside top-k, then min-p, then top-p, row by row in one batch.
    logits [n, V]; top_k [n] long (V = off); top_p, min_p [n] float (1 and 0 = off); top_p_on, min_p_on: some
    row uses that filter; largest_k: the largest top_k below V of any row, 0 when no row uses top-k. All known
    on the host: no device sync to find out. A filter no row uses is skipped (it would mask
    nothing), and top-k takes the largest k values instead of sorting the whole vocabulary."""
    vocab = logits.shape[1]
    if largest_k:
        top = logits.topk(largest_k, dim=-1).values
        kth = top.gather(1, (top_k.clamp(1, largest_k) - 1).unsqueeze(1))
        kth = kth.masked_fill((top_k >= vocab).unsqueeze(1), float("-inf"))  # a row without top-k keeps all
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if min_p_on:
        probs = logits.softmax(-1)
        low = probs < min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(low & (min_p > 0).unsqueeze(1), float("-inf"))
    if top_p_on:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        p_sorted = sorted_logits.softmax(-1)
        drop = (p_sorted.cumsum(-1) - p_sorted > top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1)
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    return logits


def filtered_probs(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Temperature, top-k, min-p, top-p of each row's request, then softmax -> probs [n, V]."""
    dev, vocab = logits.device, logits.shape[1]
    params = [s.params for s in seqs]
    k = [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params]  # any int
    temp = to_device([p.temperature for p in params], dev).unsqueeze(1)
    top_k, top_p, min_p = to_device(k, dev), to_device([p.top_p for p in params], dev), to_device(
        [p.min_p for p in params], dev)
    return _filter(logits / temp, top_k, top_p, min_p, any(p.top_p < 1.0 for p in params),
                   max((x for x in k if x < vocab), default=0), any(p.min_p > 0 for p in params)).softmax(-1)


def processed_logits(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Logits processors, penalties and the min_tokens ban, as `sample` applies them."""
    logits = _apply_penalties(apply_logits_processors(logits.clone(), seqs), seqs)
    return _ban_stops_before_min_tokens(logits, seqs)


def _sample_rows(logits: torch.Tensor, seqs: list[Sequence], engine_generator: torch.Generator) -> torch.Tensor:
    """Sampled (non-greedy) rows -> token ids [n] on the device."""
    dev, vocab = logits.device, logits.shape[1]
    probs = filtered_probs(logits, seqs)
    noise = torch.empty_like(probs)
    shared = [i for i, s in enumerate(seqs) if s.generator is None]
    if len(shared) == len(seqs):
        noise.exponential_(generator=engine_generator)
    elif shared:
        draws = torch.empty(len(shared), vocab, device=dev).exponential_(generator=engine_generator)
        noise[to_device(shared, dev)] = draws
    for i, s in enumerate(seqs):
        if s.generator is not None:
            noise[i].exponential_(generator=s.generator)
    return (probs / noise).argmax(-1)


def plain_argmax(seq: Sequence) -> bool:
    """The next token is the argmax of the raw logits, whatever the tokens before it: greedy, with no
    logits processor, penalty or min_tokens ban in force (so rows of a verify step can be chosen at once)."""
    p = seq.params
    return (p.greedy and not p.logit_bias and p.structured_outputs is None and p.repetition_penalty == 1.0
            and not p.presence_penalty and not p.frequency_penalty and len(seq.output_ids) >= p.min_tokens)


def sample(logits: torch.Tensor, seqs: list[Sequence], engine_generator: torch.Generator) -> list[SampleResult]:
    """logits [B, V] fp32, one row per sequence."""
    return results_for(logits, seqs, choose(logits, seqs, engine_generator))


def choose(logits: torch.Tensor, seqs: list[Sequence], engine_generator: torch.Generator) -> torch.Tensor:
    """The next token of each row [B] (device): argmax of the processed logits, or a draw for sampled rows."""
    processed = processed_logits(logits, seqs)
    sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if sampled and len(sampled) == len(seqs):  # (no index: its copy, and the gather and scatter, saved)
        return _sample_rows(processed, seqs, engine_generator)
    tokens = processed.argmax(-1)
    if sampled:
        idx = to_device(sampled, logits.device)
        tokens[idx] = _sample_rows(processed[idx], [seqs[i] for i in sampled], engine_generator)
    return tokens


def results_for(logits: torch.Tensor, seqs: list[Sequence], tokens: torch.Tensor) -> list[SampleResult]:
    """Chosen tokens [n] (device) of raw logits [n, V] -> results with the logprobs each request asked for
    (of the raw model distribution)."""
    return unpack_results(pack_results(logits, seqs, tokens).cpu().numpy(), seqs)


def pack_results(logits: torch.Tensor, seqs: list[Sequence], tokens: torch.Tensor) -> torch.Tensor:
    """What the host needs of a step's chosen tokens [n], as one device tensor for the step's one copy: the
    tokens [n, 1] (long), or with logprobs asked for by any row, float [n, 3 + 2k]: token, its logprob, its
    rank, then the k top logprobs and their ids (k the most any row asks for). `unpack_results` reads it."""
    k = max((s.params.logprobs or 0 for s in seqs if s.params.logprobs is not None), default=None)
    if k is None:
        return tokens.unsqueeze(1)
    raw_logprobs = logits.log_softmax(-1)
    chosen = raw_logprobs.gather(1, tokens.unsqueeze(1))
    rank = (raw_logprobs > chosen).sum(-1, keepdim=True) + 1
    packed = [tokens.unsqueeze(1).to(raw_logprobs.dtype), chosen, rank.to(raw_logprobs.dtype)]
    if k:
        top = raw_logprobs.topk(k, dim=-1)
        packed += [top.values, top.indices.to(raw_logprobs.dtype)]
    return torch.cat(packed, dim=1)


def unpack_results(host: np.ndarray, seqs: list[Sequence]) -> list[SampleResult]:
    """`pack_results`' rows, on the host -> one SampleResult per sequence."""
    if host.shape[1] == 1:
        return [SampleResult(t, None, None) for t in host[:, 0].tolist()]
    k = (host.shape[1] - 3) // 2
    results = []
    for row, seq in enumerate(seqs):
        tok = int(host[row, 0])
        n = seq.params.logprobs
        if n is None:
            results.append(SampleResult(tok, None, None))
            continue
        top_lp: dict[int, Logprob] = {int(host[row, 3 + k + r]): Logprob(float(host[row, 3 + r]), rank=r + 1)
                                      for r in range(n)}
        if tok not in top_lp:
            top_lp[tok] = Logprob(float(host[row, 1]), rank=int(host[row, 2]))
        results.append(SampleResult(tok, float(host[row, 1]), top_lp))
    return results
