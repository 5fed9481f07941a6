"""MTP drafting: the catch-up over the positions a step made real, then up to k chained drafts per sequence.

The catch-up feeds the MTP layer the main model's hidden rows and the token after each position; every later
depth feeds it its own output at the next position (vLLM's MTP chaining). The MTP cache rows of drafted
positions are rewritten by the next catch-up before anything reads them. Where a chain graph runs the plan
(`--draft-graph chain|fused`) and every drafting sequence is greedy and drafts the chain's depth, one replay
drafts every depth (one host copy instead of one per depth). Truncation stops a sequence's chain once the
calibrated product of its drafts' probabilities falls below the policy's threshold.
"""

from __future__ import annotations

import torch

from tpserve.engine import sampler
from tpserve.model.h2d import to_device
from tpserve.engine.request import Sequence, Status
from tpserve.engine.runner import Drafted, StepPlan
from tpserve.engine.scheduler import Scheduled, Scheduler
from tpserve.engine.spec.policy import SpecPolicy
from tpserve.engine.spec.rates import Calibration
from tpserve.engine.spec.verify import sample_tokens

Drafting = list[tuple[Sequence, int]]  # (sequence, drafts it may take)


def fixed(seq: Sequence) -> bool:
    """A sampled request with a seed drafts a fixed k, never truncated: its random draws then do not depend
    on step timings (which the adaptive k does), so the same request gives the same output."""
    return seq.generator is not None and not seq.params.greedy


def room(seq: Sequence, max_model_len: int) -> int:
    """The most tokens `seq` may still emit, as max_tokens and max_model_len allow (its drafts one fewer:
    the step's own token is one of them)."""
    return min(seq.max_tokens - len(seq.output_ids), max_model_len + 1 - seq.num_tokens)


class MtpPlan:
    """An MTP step plan: per sequence the positions to draft at; the token fed at position p is p+1's."""

    def __init__(self):
        self.ids, self.pos, self.cu, self.ctx, self.slots, self.tables, self.logits = [], [], [0], [], [], [], []
        self.num_decode = 0  # leading sequences that take the per-token (decode / verify) attention

    def add(self, seq: Sequence, positions: list[int], want_logits: bool, decode: bool = True) -> None:
        if decode and self.num_decode == len(self.slots):
            self.num_decode += 1
        self.ids.extend(seq.token_at(p + 1) for p in positions)
        self.pos.extend(positions)
        self.cu.append(self.cu[-1] + len(positions))
        self.ctx.append(positions[0])  # the MTP cache holds the positions before
        self.slots.append(seq.slot)
        self.tables.append(list(seq.blocks))
        if want_logits:
            self.logits.append(self.cu[-1] - 1)

    def build(self) -> StepPlan:
        return StepPlan(self.ids, self.pos, self.cu, self.ctx, self.slots, self.tables, self.logits, [], False,
                        self.num_decode)


class Drafter:
    """Drafts the next step's tokens into each sequence's `drafts` (and `draft_sure`, `draft_probs`)."""

    def __init__(self, executor, scheduler: Scheduler, policy: SpecPolicy, calibration: Calibration,
                 generator: torch.Generator, max_model_len: int, max_k: int):
        self.executor, self.scheduler, self.policy, self.calibration = executor, scheduler, policy, calibration
        self.generator, self.max_model_len, self.max_k = generator, max_model_len, max_k
        self.prompt_rows = self.rows = 0  # the rows the last `draft` caught up: of prompts, of all

    def budget(self, seq: Sequence, k: int) -> int:
        """Drafts this sequence may take next step (room before max_tokens / max_model_len, blocks)."""
        if seq.mtp_computed < 0 or not seq.in_decode:
            return 0
        if fixed(seq):
            k = self.max_k
        if k == 0:
            return 0
        k = min(k, room(seq, self.max_model_len) - 1)
        while k >= 2 and not self.scheduler.reserve(seq, seq.num_tokens + k - 2):
            k -= 1
        return max(k, 0)

    def draft(self, scheduled: list[Scheduled], starts: list[int], k: int, explore: bool,
              prompt_pass=None) -> tuple[int, int] | None:
        """The catch-up over the positions this step made real (from `starts`), then up to k drafts per
        sequence -> (the most drafts a sequence asked for, sequences drafting); None: nothing caught up.
        Where a chain graph runs, a drafting prompt's rows before its last catch up first, on their own: its last
        row then drafts as a decode row does (all depths in one replay, not an eager pass and one call a depth;
        without graphs that would be one more eager pass). prompt_pass([(seq, rows), ...]) -> the prompts of the
        step whose MTP pass over their rows runs (the others decode plainly); None: every prompt's does."""
        plan, rows, drafting, head, head_rows = self._catch_up(scheduled, starts, k, prompt_pass)
        self.rows = len(plan.ids) + len(head.ids)
        if not plan.ids:
            return None
        if head.ids:
            self.executor.draft(head.build(), head_rows, True)
        built = plan.build()
        chain = self._chain_depths(built, drafting, len(plan.slots))
        drafted = self.executor.draft(built, rows, True, max(chain, 1))
        if chain:
            self._take_chain(drafting, drafted.greedy.tolist(), list(range(len(drafting))), explore)
        else:
            self._draft_depths(drafting, drafted, explore)
        return max((want for _, want in drafting), default=0), len(drafting)

    def from_chain(self, seqs: list[Sequence], k: int, draws: list, explore: bool) -> None:
        """After a fused step: each running sequence's drafts from the chain's draws [2][depth][sequence]."""
        drafting, at = [], []
        for i, seq in enumerate(seqs):
            want = self.budget(seq, k) if seq.status is Status.RUNNING else 0
            if want > 0:
                drafting.append((seq, want))
                at.append(i)
        self._take_chain(drafting, draws, at, explore)

    def _catch_up(self, scheduled: list[Scheduled], starts: list[int], k: int, prompt_pass=None):
        """The catch-up plan (the positions each sequence made real, with the main model's hidden rows), its
        source rows, the sequences that draft after it, and the plan (and rows) of drafting prompts' rows
        before their last."""
        plan, rows, drafting, base = MtpPlan(), [], [], 0
        self.prompt_rows = 0
        head, head_rows, split = MtpPlan(), [], self.executor.chain_depths(None) > 0
        caught = [s.seq.status is Status.RUNNING and s.seq.mtp_computed == start and s.seq.num_computed > start
                  for s, start in zip(scheduled, starts)]  # its MTP cache is current up to this step's rows
        passes = None
        if prompt_pass is not None:
            passes = prompt_pass([(s.seq, s.seq.num_tokens - start) for s, start, c in zip(scheduled, starts, caught)
                                  if c and not s.decode])
        for s, start, current in zip(scheduled, starts, caught):
            seq = s.seq
            if current and not s.decode and passes is not None and seq not in passes:
                seq.mtp_computed = -1  # drafting would not pay for its prompt's pass: it decodes plainly
            elif current:
                if not s.decode:
                    self.prompt_rows += seq.num_computed - start
                want = self.budget(seq, k)
                last = seq.num_computed - 1
                if want > 0 and not s.decode and split:
                    if last > start:
                        head.add(seq, list(range(start, last)), False, decode=False)
                        head_rows.extend(range(base, base + last - start))
                    plan.add(seq, [last], True)
                    rows.append(base + last - start)
                else:
                    plan.add(seq, list(range(start, seq.num_computed)), want > 0, s.decode)
                    rows.extend(range(base, base + seq.num_computed - start))
                if want > 0:
                    drafting.append((seq, want))
                seq.mtp_computed = seq.num_computed
            elif seq.status is Status.RUNNING and seq.mtp_computed != seq.num_computed:
                seq.mtp_computed = -1  # its MTP cache has a gap: this sequence no longer drafts
            base += s.num_tokens
        return plan, rows, drafting, head, head_rows

    def _chain_depths(self, plan: StepPlan, drafting: Drafting, num_seqs: int) -> int:
        """Depths one chain-graph replay drafts, 0 for one depth per call: a chain runs when every sequence of
        the catch-up drafts the chain's depth greedily (its draws are argmaxes, fed forward on the device)."""
        chain = self.executor.chain_depths(plan)
        if chain and len(drafting) == num_seqs and all(want == chain and seq.params.greedy for seq, want in drafting):
            return chain
        return 0

    def _keep(self, seq: Sequence, explore: bool, survival: float) -> bool:
        return fixed(seq) or self.policy.keep_drafting(explore, survival)

    def _take_chain(self, drafting: Drafting, chained: list, at: list[int], explore: bool) -> None:
        """Each sequence's run from a chain's draws [2][depth][at[i]], until it has its drafts or truncation
        stops it."""
        tokens, sure, factor = chained[0], chained[1], self.calibration.factor
        for (seq, want), i in zip(drafting, at):
            survival = 1.0
            for depth in range(want):
                p = sure[depth][i]
                seq.drafts.append(int(tokens[depth][i]))
                seq.draft_sure.append(p)
                survival *= min(1.0, factor * p)
                if not self._keep(seq, explore, survival):
                    break

    def _draft_depths(self, drafting: Drafting, drafted: Drafted, explore: bool) -> None:
        """Depth by depth from the catch-up's output: a draw per sequence, then one more MTP step for the
        sequences that go on."""
        survival = [1.0] * len(drafting)
        for depth in range(1, max((want for _, want in drafting), default=0) + 1):
            toks, probs, sure = self._draw(drafted, [s for s, _ in drafting])
            keep, nxt = [], MtpPlan()
            for i, (seq, want) in enumerate(drafting):
                seq.drafts.append(toks[i])
                if probs is not None:
                    seq.draft_probs = (seq.draft_probs or []) + [probs[i]]
                seq.draft_sure.append(sure[i])
                survival[i] *= min(1.0, self.calibration.factor * sure[i])
                if depth < want and self._keep(seq, explore, survival[i]):
                    keep.append(i)
                    nxt.add(seq, [seq.num_tokens - 2 + depth], True)
            if not keep:
                break
            drafting = [drafting[i] for i in keep]
            survival = [survival[i] for i in keep]
            drafted = self.executor.draft(nxt.build(), keep, False)

    def _draw(self, drafted: Drafted, seqs: list[Sequence]):
        """Draft one token per row: greedy rows the argmax, sampled rows a draw from q (kept for the
        rejection test). -> (tokens, q rows or None, probability of each token under the drafter)."""
        sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if not sampled:  # argmax and its probability, computed with the draft (in its graph on a GPU)
            host = drafted.greedy.tolist()  # one device-to-host copy
            return [int(t) for t in host[0]], None, host[1]
        logits = drafted.logits
        tokens = logits.argmax(-1)
        probs_all = logits.softmax(-1)
        idx = to_device(sampled, logits.device)
        sub = [seqs[i] for i in sampled]
        q = sampler.filtered_probs(logits[idx], sub)
        tokens[idx] = sample_tokens(q, [s.generator for s in sub], self.generator)
        probs_all[idx] = q
        q_rows = {i: q[r] for r, i in enumerate(sampled)}
        sure = probs_all.gather(1, tokens.unsqueeze(1)).squeeze(1)
        host = torch.stack([tokens.double(), sure.double()]).tolist()  # one device-to-host copy
        return [int(t) for t in host[0]], [q_rows.get(i) for i in range(len(seqs))], host[1]
