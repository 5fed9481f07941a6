"""The host's walk over a verify step's rows: emit each sequence's tokens while they equal its drafts.

A sequence's last token and its drafts d1..dk went through the target as 1+k rows; row j gives the target's
distribution after d1..dj. Walking j = 0, 1, ... the token emitted at j is the one plain decoding would choose
there (greedy: the argmax of the processed logits; sampled: the draft if the rejection test min(1, p/q)
accepts it, else a draw from the residual max(0, p - q), engine/spec/verify.py), and the walk goes on while
that token equals the draft. Every token goes through the engine's append (stop strings, max_tokens, EOS), so
nothing after a stop is emitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from tpserve.engine import sampler
from tpserve.model.h2d import to_device
from tpserve.engine.request import Sequence
from tpserve.engine.scheduler import Scheduled
from tpserve.engine.spec.verify import rejection_tokens

Append = Callable[[Sequence, sampler.SampleResult], None]  # the engine's append: output, stops, finish


@dataclass
class SpecCounters:
    """vLLM's spec_decode_* counters."""

    num_drafts: int = 0                 # verify runs (a sequence-step with >= 1 draft)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verify run (accepted drafts + the target's own token)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def record(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    def stats(self) -> dict:
        return {"spec_decode_num_drafts": self.num_drafts, "spec_decode_num_draft_tokens": self.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
                "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_pos),
                "spec_decode_mean_accepted_length": self.mean_accepted_length}


@dataclass
class Run:
    """One sequence's verify run: its drafts (their q rows when sampled, the drafter's probability of each)
    at logits rows base+1.., its own token's row at base; `evaluated` rows emitted, `accepted` drafts."""

    seq: Sequence
    base: int
    drafts: list[int]
    probs: list | None
    sure: list[float]
    accepted: int = 0
    evaluated: int = 0

    def emit(self, j: int, res: sampler.SampleResult, append: Append) -> bool:
        """Append the token chosen at row j; -> whether the walk goes on (the draft was hit)."""
        append(self.seq, res)
        self.evaluated = j + 1
        hit = j < len(self.drafts) and res.token == self.drafts[j]
        if hit:
            self.accepted += 1
        if self.seq.is_finished or not hit:
            return False
        self.seq.num_computed += 1  # the accepted draft's cache rows are real
        return True


def walk(seqs: list[Sequence], logits: torch.Tensor, append: Append, generator: torch.Generator) -> list[Run]:
    """Emit every sequence's tokens from its rows of `logits` (one, plus one per draft) -> the runs."""
    runs, row = [], 0
    for seq in seqs:
        runs.append(Run(seq, row, list(seq.drafts), seq.draft_probs, list(seq.draft_sure)))
        row += 1 + len(seq.drafts)
    if all(sampler.plain_argmax(r.seq) for r in runs):
        _walk_argmax(runs, logits[:row], append)
    else:
        _walk_rows(runs, logits, append, generator)
    return runs


def walk_fused(scheduled: list[Scheduled], greedy: list[list[int]], accepted: list[int], append: Append) -> list[Run]:
    """After a fused step: emit each sequence's run from its verify rows' argmaxes `greedy`; the device
    committed accepted[i] + 1 rows, which the host walk must match."""
    runs = []
    for i, s in enumerate(scheduled):
        seq = s.seq
        run = Run(seq, 0, list(seq.drafts), None, list(seq.draft_sure))
        for j, token in enumerate(greedy[i]):
            if not run.emit(j, sampler.SampleResult(token, None, None), append):
                break
        if not seq.is_finished and run.accepted != accepted[i]:
            raise RuntimeError(f"fused speculative step: the device accepted {accepted[i]} drafts of "
                               f"{seq.request_id}, the host walk {run.accepted}")
        runs.append(run)
    return runs


def _walk_argmax(runs: list[Run], rows: torch.Tensor, append: Append) -> None:
    """Every row's choice is its raw argmax: all of them with one host copy."""
    per_row = [r.seq for r in runs for _ in range(1 + len(r.drafts))]
    results = sampler.results_for(rows, per_row, rows.argmax(-1))
    for r in runs:
        for j in range(1 + len(r.drafts)):
            if not r.emit(j, results[r.base + j], append):
                break


def _walk_rows(runs: list[Run], logits: torch.Tensor, append: Append, generator: torch.Generator) -> None:
    """Position by position: row j of the sequences still walking, one host copy each."""
    active, j = list(runs), 0
    while active:
        rows = logits[to_device([r.base + j for r in active], logits.device)]
        seqs = [r.seq for r in active]
        results = sampler.results_for(rows, seqs, _choose(active, j, rows, generator))
        active, j = [r for r, res in zip(active, results) if r.emit(j, res, append)], j + 1


def _choose(active: list[Run], j: int, rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The token of each run's row j [n] (device): the sampler's choice, or for a sampled row with a draft
    there the rejection test's."""
    rej = [i for i, r in enumerate(active) if j < len(r.drafts) and not r.seq.params.greedy]
    plain = sorted(set(range(len(active))) - set(rej))
    tokens = torch.empty(len(active), dtype=torch.long, device=rows.device)
    if plain:
        idx = to_device(plain, rows.device)
        tokens[idx] = sampler.choose(rows[idx], [active[i].seq for i in plain], generator)
    if rej:
        idx = to_device(rej, rows.device)
        sub = [active[i].seq for i in rej]
        p = sampler.filtered_probs(sampler.processed_logits(rows[idx], sub), sub)
        q = torch.stack([active[i].probs[j] for i in rej])
        drafts = to_device([active[i].drafts[j] for i in rej], rows.device)
        # (on the device: results_for is the position's one host copy; the drafts are the drafter's, so in
        # range, which rejection_verify's copy would check)
        tokens[idx] = rejection_tokens(p, q, drafts, [s.generator for s in sub], generator)[1]
    return tokens
