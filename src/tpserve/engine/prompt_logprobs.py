"""prompt_logprobs (vLLM's SamplingParams.prompt_logprobs): the log-probability of every prompt
token given the tokens before it, plus the top-k alternatives at each position.

The engine asks for one logits row per prompt position of a chunk (`rows`, called from
`LLMEngine._plan`), and `take` splits those rows off the step's logits before sampling. The
row of position p predicts token p + 1, so a prompt of n tokens has n - 1 scored positions;
the first entry of the result is None, as in vLLM. Each position is scored once, from the
chunk that computes it: a preempted and recomputed sequence keeps the values it already has,
and the values do not depend on how the prompt is split into chunks (the model computes the
same hidden state at a position whatever the chunk boundaries).
"""

from __future__ import annotations

import torch

from tpserve.engine.outputs import Logprob


def wants(seq) -> bool:
    return getattr(seq.params, "prompt_logprobs", None) is not None


def _scored(seq, start: int, num_tokens: int) -> range:
    """Positions of this chunk whose row predicts a prompt token (p + 1 < prompt length)."""
    if not wants(seq):
        return range(0)
    return range(start, min(start + num_tokens, len(seq.prompt_ids) - 1))


def rows(seq, start: int, num_tokens: int, chunk_offset: int) -> list[int]:
    """Logits rows (indices into the step's flat token batch) this chunk needs for prompt logprobs."""
    return [chunk_offset + p - start for p in _scored(seq, start, num_tokens)]


def score(logits: torch.Tensor, targets: list[int], k: int) -> list[dict[int, Logprob]]:
    """logits [P, V] (fp32), targets [P] (the prompt token each row predicts) -> one dict per row:
    the target's logprob and rank, plus the top k."""
    lp = logits.float().log_softmax(-1)
    tgt = torch.tensor(targets, dtype=torch.long, device=lp.device)
    chosen = lp.gather(1, tgt[:, None])[:, 0]
    ranks = (lp > chosen[:, None]).sum(-1) + 1
    top_vals, top_ids = lp.topk(k, dim=-1) if k > 0 else (None, None)
    out = []
    for r, t in enumerate(targets):
        entry: dict[int, Logprob] = {}
        if k > 0:
            for j, (v, i) in enumerate(zip(top_vals[r].tolist(), top_ids[r].tolist())):
                entry[i] = Logprob(v, rank=j + 1)
        entry[t] = Logprob(float(chosen[r]), rank=int(ranks[r]))
        out.append(entry)
    return out


def take(logits: torch.Tensor, scheduled, tokenizer=None) -> torch.Tensor:
    """Split the prompt-logprob rows (laid out by `rows`, in `scheduled` order, before each
    sequence's sampling row) off `logits`; store them on the sequences; return the sampling rows.

    Call before the step advances `num_computed`."""
    if not any(wants(s.seq) for s in scheduled):
        return logits
    keep, row = [], 0
    for s in scheduled:
        seq = s.seq
        positions = _scored(seq, seq.num_computed, s.num_tokens)
        if len(positions):
            if seq.prompt_logprobs is None:
                seq.prompt_logprobs = [None]
            block = logits[row:row + len(positions)]
            row += len(positions)
            new = [(r, p) for r, p in enumerate(positions) if p + 1 >= len(seq.prompt_logprobs)]
            if new:
                targets = [seq.prompt_ids[p + 1] for _, p in new]
                scored = score(block[[r for r, _ in new]], targets, seq.params.prompt_logprobs)
                if tokenizer is not None:
                    for entry in scored:
                        for tid, lp in entry.items():
                            lp.decoded_token = tokenizer.decode([tid])
                seq.prompt_logprobs.extend(scored)
        elif wants(seq) and seq.prompt_logprobs is None and len(seq.prompt_ids) == 1:
            seq.prompt_logprobs = [None]
        if s.completes:  # the sampling row, and one more per draft verified
            n = 1 + s.num_drafts
            keep.extend(range(row, row + n))
            row += n
    return logits[keep]
