"""Speculative decoding with the checkpoint's MTP layer: verify drafts, commit, draft again.

A step verifies each decoding sequence's pending drafts d1..dk: its last token and the drafts go
through the target model as 1+k query rows (the step model's per-sequence query lengths). Row j
gives the target's distribution after d1..dj; walking j = 0, 1, ... the token emitted at j is the
one plain decoding would choose there (greedy: the argmax of the processed logits; sampling: the
draft if a rejection test with min(1, p/q) accepts it, else a draw from the residual max(0, p-q)),
and the walk continues while that token equals the draft. Every emitted token goes through the
engine's normal append (stop strings, max_tokens, EOS), so nothing after a stop is emitted.

Then (`propose`): the KDA/conv states commit the accepted prefix (model/kda.py `commit`: a replay
through the plain decode update, so the state is what decoding without drafts leaves), the MTP
layer catches up over the positions this step made real (the main model's hidden rows and the
token after each), and chains k-1 more depths from its own output (vLLM's MTP chaining). The MTP
cache rows of drafted positions are rewritten by the next catch-up before anything reads them.
With `--draft-graph chain` and CUDA graphs, a step whose drafting sequences are all greedy and all draft
num_speculative_tokens runs the catch-up and the chained depths in one graph replay (engine/graphs.py):
the same drafts, one host copy instead of one per depth; truncation then keeps a prefix of them. With
`--draft-graph fused` (the default) a greedy step whose sequences all verify drafts (`fusable`) does all of
it on the device: the verify graph, then a graph with the acceptance, the commit, the catch-up and the
chain; the host walks the copied argmaxes (`verify_fused`: the same emits, stops and counters) and keeps
the drafts.
"""

from __future__ import annotations

import dataclasses

import time
from dataclasses import dataclass, field

import torch

from tpserve.config import SpeculativeConfig
from tpserve.engine import sampler
from tpserve.engine.h2d import to_device
from tpserve.engine.request import Sequence, Status
from tpserve.engine.runner import StepPlan
from tpserve.engine.scheduler import Scheduled
from tpserve.engine.spec.policy import SpecPolicy
from tpserve.engine.spec.rates import Calibration, MeasuredRates
from tpserve.engine.spec.verify import rejection_tokens, sample_tokens


IDLE_STEPS = 8  # after this many steps in a row with k = 0 the MTP layer stops running


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


def check_checkpoint(model_dir, cfg) -> None:
    """A clear error when the checkpoint has no MTP layer to draft with."""
    from tpserve.model.loader import tensor_info

    if cfg.num_nextn_predict_layers < 1:
        raise ValueError(f"speculative_config: method 'mtp' needs the checkpoint's MTP layer, but {model_dir}'s "
                         "config has num_nextn_predict_layers = 0")
    info = tensor_info(model_dir, cfg.num_hidden_layers, mtp=True)
    if "mtp.eh_proj.weight" not in info:
        raise ValueError(f"speculative_config: method 'mtp' needs the MTP layer's weights (layer "
                         f"{cfg.num_hidden_layers}: eh_proj, enorm, hnorm, ...), and {model_dir} has none")


class Speculator:
    def __init__(self, engine, spec: SpeculativeConfig):
        self.engine, self.spec = engine, spec
        cfg = engine.model_config
        self.policy = SpecPolicy(spec.num_speculative_tokens, adaptive=spec.adaptive,
                                 truncate_threshold=spec.truncate_threshold, num_experts=cfg.n_routed_experts,
                                 experts_per_token=cfg.num_experts_per_tok,
                                 num_moe_layers=sum(t == "sparse" for t in cfg.mlp_layer_types))
        self.counters = SpecCounters(accepted_per_pos=[0] * spec.num_speculative_tokens)
        self.choice = self.policy.begin_step()
        self.idle_steps = 0  # consecutive steps the policy chose k = 0
        self.idle_since: int | None = None  # engine.num_added when the running requests last stopped drafting
        self.idle_above_graphs = False  # ... because the batch was above the verify graphs (else: k = 0 for long)
        self.rates = MeasuredRates()
        self.calibration = Calibration()
        self.last_k, self.last_draft_seconds, self.emitted = 0, 0.0, 0
        self.step_drafted = False  # the step just run verified drafts (what MeasuredRates files it under)
        self.fused_limit = 0  # the largest batch of a fused step, as `fusable` last read it
        self.pending_rate: tuple | None = None  # a fused step's MeasuredRates observation, filed by `while_waiting`

    def set_adaptive(self, on: bool, fixed_k: int | None = None) -> None:
        """Switch between adaptive k and a fixed k in a running engine (bench/spec_ab.py --one-engine: both modes
        on the same engine, graphs and memory). fixed_k (when `on` is false): 1..num_speculative_tokens, default
        num_speculative_tokens; below it, a greedy step that can be fused still runs the fused graphs'
        num_speculative_tokens rows (it costs what the largest k costs), so a smaller fixed k is a fair stand-in
        for an engine built with it only where steps are not fused (sampled requests). What the adaptive mode
        learned is kept; the fixed mode observes nothing (as an engine built fixed)."""
        k = self.spec.num_speculative_tokens if fixed_k is None else fixed_k
        if on and fixed_k is not None:
            raise ValueError("fixed_k: only with adaptive off")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.spec.num_speculative_tokens:
            raise ValueError(f"fixed_k: must be an int in 1..num_speculative_tokens "
                             f"({self.spec.num_speculative_tokens}), got {fixed_k!r}")
        self.spec = dataclasses.replace(self.spec, adaptive=bool(on))
        self.policy.adaptive, self.policy.fixed_k = bool(on), k

    def while_waiting(self) -> None:
        """File the observation a fused step left pending (`_next_k`): ModelRunner.execute_spec calls this after
        launching the next step and before waiting for its results, so on a GPU the bookkeeping runs while the
        device works instead of between steps (adaptive k at batch 1 on an H200 measured 0.4% below fixed k,
        its host walk after a fused step 11-14 us longer: BENCHMARKS.md, thirtieth session). Every other
        observation files a pending one first, so they stay in order."""
        pending = self.pending_rate
        if pending is not None:
            self.pending_rate = None
            self.rates.observe(*pending)

    # ------------------------------------------------------------------ verify
    def verify(self, sampled: list[Scheduled], logits: torch.Tensor) -> list[int]:
        """Emit every completing sequence's tokens (one row each, plus one per draft); return the commit
        counts (tokens now real) of the sequences that verified drafts, in step order."""
        eng = self.engine
        self.step_drafted = any(s.seq.drafts for s in sampled)
        if not self.step_drafted:  # nothing to verify (k = 0): the plain engine's sampling
            eng.sample_and_append([s.seq for s in sampled], logits)
            self.finished([s.seq for s in sampled])
            self.emitted += len(sampled)
            return []
        groups, row = [], 0
        for s in sampled:
            groups.append(_Walk(s.seq, row, list(s.seq.drafts), s.seq.draft_probs, list(s.seq.draft_sure)))
            row += 1 + len(s.seq.drafts)
        if all(sampler.plain_argmax(g.seq) for g in groups):  # every row's choice at once: one host copy
            rows = logits[:row]
            per_row = [g.seq for g in groups for _ in range(1 + len(g.drafts))]
            results = sampler.results_for(rows, per_row, rows.argmax(-1))
            for g in groups:
                for j in range(1 + len(g.drafts)):
                    if not self._emit(g, j, results[g.base + j]):
                        break
            return self._finish(groups)
        active, j = list(groups), 0
        while active:
            rows = logits[to_device([g.base + j for g in active], logits.device)]
            seqs = [g.seq for g in active]
            rej = [i for i, g in enumerate(active) if j < len(g.drafts) and not g.seq.params.greedy]
            plain = sorted(set(range(len(active))) - set(rej))
            tokens = torch.empty(len(active), dtype=torch.long, device=logits.device)
            if plain:
                idx = to_device(plain, logits.device)
                tokens[idx] = sampler.choose(rows[idx], [seqs[i] for i in plain], eng.generator)
            if rej:
                idx = to_device(rej, logits.device)
                sub = [seqs[i] for i in rej]
                p = sampler.filtered_probs(sampler.processed_logits(rows[idx], sub), sub)
                q = torch.stack([active[i].probs[j] for i in rej])
                drafts = to_device([active[i].drafts[j] for i in rej], logits.device)
                # (on the device: results_for below is the position's one host copy; the drafts are the
                # drafter's, so in range, which rejection_verify's copy would check)
                tokens[idx] = rejection_tokens(p, q, drafts, [s.generator for s in sub], eng.generator)[1]
            results = sampler.results_for(rows, seqs, tokens)
            active, j = [g for g, res in zip(active, results) if self._emit(g, j, res)], j + 1
        return self._finish(groups)

    def _emit(self, g: "_Walk", j: int, res) -> bool:
        """Append the token chosen at row j of g's run; -> whether the walk goes on (the draft was hit)."""
        self.emitted += 1
        self.engine._append(g.seq, res)
        g.evaluated = j + 1
        hit = j < len(g.drafts) and res.token == g.drafts[j]
        if hit:
            g.accepted += 1
        if g.seq.is_finished or not hit:
            return False
        g.seq.num_computed += 1  # the accepted draft's cache rows are real now
        return True

    def _finish(self, groups: list["_Walk"]) -> list[int]:
        """Counters and estimators after the walk; -> the commit counts."""
        counts = []
        for g in groups:
            g.seq.drafts, g.seq.draft_probs, g.seq.draft_sure = [], None, []
            if not g.drafts:
                continue
            counts.append(0 if g.seq.is_finished else 1 + g.accepted)
            c = self.counters
            c.num_drafts += 1
            c.num_draft_tokens += len(g.drafts)
            c.num_accepted_tokens += g.accepted
            for i in range(g.accepted):
                c.accepted_per_pos[i] += 1
            seen = min(len(g.drafts), g.evaluated)
            self.policy.observe_acceptance(g.seq, seen, g.accepted, self.choice.explore)
            if self.choice.explore:
                self.calibration.observe(g.sure[:seen], g.accepted)
        for g in groups:
            if g.seq.is_finished:  # after its last observation: the policy keeps nothing of it
                self.policy.forget(g.seq)
        return counts

    # ----------------------------------------------------------------- propose
    def forget(self, seq: Sequence) -> None:
        self.policy.forget(seq)

    def idle(self) -> bool:
        """Whether the coming step may run as plain decoding with no speculator call, so with async scheduling
        (engine/overlap.py) as an engine without speculation runs it: `_next_k` stopped drafting for every
        running request (no drafts, the MTP stopped, nothing observed), because the batch was above the
        verify graphs (while it still is) or because the policy chose k = 0 for IDLE_STEPS steps, and no
        request was added since; so no sequence has drafts or a fixed k and every running one is marked
        already. Saves verify's and propose's passes over the sequences and keeps async scheduling on such
        steps (batch 64 on an H200: the adaptive engine at k = 0 ran 0.914x of no speculation while these
        steps went through the speculator, BENCHMARKS.md sixteenth session)."""
        eng = self.engine
        if self.idle_since is None:  # (drafting not stopped)
            return False
        if self.idle_since != eng.num_added:  # a request added: the policy decides afresh
            self.idle_since, self.idle_steps = None, 0
            return False
        if self.idle_above_graphs:
            limit = eng.executor.verify_graph_batch()
            if limit is None or len(eng.scheduler.running) <= limit:
                return False
        self.idle_steps += 1
        self.rates.tick()  # (a probe due then comes with the next request)
        return True

    def finished(self, seqs: list[Sequence]) -> None:
        """After a step without drafts: the policy keeps nothing of the requests that ended in it."""
        if self.policy.tracking():
            for seq in seqs:
                if seq.is_finished:
                    self.policy.forget(seq)

    def fusable(self, scheduled: list[Scheduled]) -> bool:
        """Whether this step can verify, commit and draft on the device in one go (`verify_fused`): every
        sequence verifies 1 to num_speculative_tokens drafts, greedily with nothing but the argmax in force and no
        logprobs, its MTP cache current, and blocks (reserved here, before the step's plan) for the rows the
        next drafts' chain writes, up to position num_computed + 2k - 1 (else they would land in the shared
        dummy block, where other sequences' rows overwrite them)."""
        limit, positions = self.engine.executor.spec_step_limits()  # (0, 0): none
        self.fused_limit, k = limit, self.spec.num_speculative_tokens
        if not limit or len(scheduled) > limit:
            return False
        for s in scheduled:
            seq = s.seq
            if not (s.decode and 0 < s.num_drafts <= k and seq.draft_probs is None
                    and seq.mtp_computed == seq.num_computed and _argmax_only(seq)
                    and seq.num_computed + 2 * k <= positions):  # the chain's last row: num_computed + 2k - 1
                return False
        return all(self.engine.scheduler.reserve(s.seq, s.seq.num_computed + 2 * k) for s in scheduled)

    def verify_fused(self, scheduled: list[Scheduled], verified, step_seconds: float, step_tokens: int) -> None:
        """After a fused step (ModelRunner.execute_spec; the KDA commit and the MTP catch-up ran on the device):
        emit each sequence's accepted run from the verify rows' argmaxes, then take the next drafts from the
        chain's draws (truncation and the policy's k as in `propose`)."""
        greedy, accepted, draws = verified
        self.step_drafted = True
        groups = []
        for i, s in enumerate(scheduled):
            seq = s.seq
            g = _Walk(seq, 0, list(seq.drafts), None, list(seq.draft_sure))
            for j, token in enumerate(greedy[i]):
                if not self._emit(g, j, sampler.SampleResult(token, None, None)):
                    break
            if not seq.is_finished and g.accepted != accepted[i]:  # the device committed accepted[i] + 1 rows
                raise RuntimeError(f"fused speculative step: the device accepted {accepted[i]} drafts of "
                                   f"{seq.request_id}, the host walk {g.accepted}")
            groups.append(g)
        self._finish(groups)
        for s in scheduled:
            s.seq.mtp_computed = s.seq.num_computed  # the catch-up covered every accepted row
        k = self._next_k(scheduled, step_seconds, step_tokens, fused=True)  # (the drafts ran inside the step)
        if k is None:
            return
        drafting, at = [], []
        for i, s in enumerate(scheduled):
            want = self._budget(s.seq, k) if s.seq.status is Status.RUNNING else 0
            if want > 0:
                drafting.append((s.seq, want))
                at.append(i)
        self._extend_drafts(drafting, None, draws, at)

    def propose(self, scheduled: list[Scheduled], starts: list[int], step_seconds: float, step_tokens: int) -> None:
        """After a step's tokens are emitted: draft the next step's tokens with the MTP layer."""
        t0 = time.perf_counter()
        k = self._next_k(scheduled, step_seconds, step_tokens)
        if k is None:
            return
        self._draft_all(scheduled, starts, k, all(s.decode for s in scheduled), t0)

    def _next_k(self, scheduled: list[Scheduled], step_seconds: float, step_tokens: int,
                fused: bool = False) -> int | None:
        """Observe the step just run (its time and tokens), then choose the next step's k; None: the MTP layer
        stops for the running sequences (they draft no more)."""
        eng, adaptive = self.engine, self.spec.adaptive
        batch = len(eng.scheduler.running)
        # (after a fused step of the whole batch the batch is within the verify graphs: spec_step_limits' batch
        # is their largest)
        limit = eng.executor.verify_graph_batch() if adaptive and not (fused and batch <= self.fused_limit) else None
        above_graphs = limit is not None and batch > limit
        if above_graphs and not any(_fixed(s.seq) for s in scheduled):
            # plain steps replay a graph here and drafting steps could not (eager steps cost several times a
            # replay on a GPU: BENCHMARKS.md, batch 64), exploration included: no drafts, and the MTP catch-up
            # stops too (an eager MTP pass per step cost batch 64 ~15%: BENCHMARKS.md, tenth session); the
            # running requests no longer draft (their MTP cache would have a gap), requests that arrive later
            # do when the batch is small again. Nothing is observed (no step here drafts), so these steps cost
            # about what plain decoding costs
            self.emitted, self.last_draft_seconds, self.last_k, self.step_drafted = 0, 0.0, 0, False
            self.idle_steps += 1
            for s in scheduled:
                s.seq.mtp_computed = -1
            self._stop_drafting(above_graphs=True)
            return None
        self.idle_since = None
        running = [s.seq for s in scheduled if s.seq.status is Status.RUNNING]
        # steps with prefill chunks say nothing of decode costs or rates; a fixed k uses neither (a fused step
        # decodes only: `fusable`)
        if adaptive and (fused or all(s.decode for s in scheduled)):
            if not fused:  # (a fused step's time holds its drafting too: the cost model fits them apart)
                self.policy.observe_step(step_tokens, max(step_seconds, 1e-9))
            if self.last_draft_seconds is not None:  # None: the drafts came with a prompt's MTP catch-up
                # a fused step's pending observation first (after a fused step the next one's launch filed it)
                self.while_waiting()
                seen = (batch, self.step_drafted, self.emitted, step_seconds + self.last_draft_seconds)
                if fused:  # filed while the next step runs (its choice reads the rates of the steps before)
                    self.pending_rate = seen
                else:
                    self.rates.observe(*seen)
        self.emitted, self.last_draft_seconds, self.step_drafted = 0, 0.0, False
        self.choice = self.policy.begin_step()
        if above_graphs:  # (requests with a fixed k draft it: `_budget`)
            k = 0
        else:
            # (a fixed k is max_k on every step: whether the next step is padded does not matter to it; after a
            # fused step `fusable` has read the limit this step and passed every sequence, and they still pass:
            # `_padded`)
            max_k = self.spec.num_speculative_tokens
            padded = adaptive and (batch <= self.fused_limit if fused else self._padded(running, batch))
            # the next step is fused, so k is 0 or max_k, and where both were measured here the measurements decide
            # (the policy's cost model would only guess at the same thing)
            decided = self.rates.measured_k(batch, max_k) if padded else None
            if decided is not None:
                k, within = decided
                if k and within >= 2 and 2 <= self._left(running) <= within:
                    # `within` plain steps finish the batch sooner than one fused step, which costs its
                    # max_k rows and depths however few tokens it may keep (an H200 at batch 1: plain ~0.9 ms,
                    # fused k = 7 ~2.05 ms, so a request 2 tokens from its end); the fused step taken at its best
                    # (every draft accepted), so this errs toward drafting. A fixed k cannot do this
                    k = 0
            else:
                k = self.policy.choose_k(batch, running)
                if adaptive:
                    k = self.rates.override(batch, k)
                if padded and 0 < k < max_k:
                    k = max_k
        self.last_k = k
        self.idle_steps = self.idle_steps + 1 if k == 0 else 0
        if self.idle_steps > IDLE_STEPS and not any(_fixed(seq) for seq in running):
            # speculation has not paid for a while (large batches): stop the MTP catch-up too, as above the
            # graphs; the running requests no longer draft, requests that arrive later do when k > 0 again
            for seq in running:
                seq.mtp_computed = -1
            self._stop_drafting(above_graphs=False)
            return None
        return k

    def _left(self, running: list[Sequence]) -> int:
        """The most tokens a running request may still emit (`_room`)."""
        max_model_len, left = self.engine.max_model_len, 0
        for seq in running:  # (a loop: a generator's max costs more at the batch of 1 this matters for)
            n = _room(seq, max_model_len)
            if n > left:
                left = n
        return left

    def _stop_drafting(self, above_graphs: bool) -> None:
        """The running requests draft no more: unless one has a fixed k, the next steps may skip the speculator
        until a request is added (`idle`)."""
        eng = self.engine
        if not any(_fixed(seq) for seq in eng.scheduler.running):
            self.idle_since, self.idle_above_graphs = eng.num_added, above_graphs

    def _padded(self, running: list[Sequence], batch: int) -> bool:
        """Whether the next step can be fused (`fusable`): its verify and chain graphs run num_speculative_tokens
        rows and depths whatever k is, so fewer drafts would save nothing and emit fewer tokens (an H200 at
        batch 1: adaptive chose k = 3 or 4 of 5 on 5% of steps). After a fused step `_next_k` checks the batch
        alone: every running sequence passed `_argmax_only` in `fusable` and still does (its parameters are
        fixed; its output only grows past min_tokens)."""
        return batch <= self.engine.executor.spec_step_limits()[0] and all(map(_argmax_only, running))

    def _draft_all(self, scheduled: list[Scheduled], starts: list[int], k: int, decode_only: bool,
                   t0: float) -> None:
        """The MTP catch-up over the positions the step made real, then up to k drafts per sequence."""
        eng = self.engine
        # catch-up: the positions this step made real, with the main model's hidden rows
        plan, rows, drafting = _Plan(), [], []
        base = 0
        for s, start in zip(scheduled, starts):
            seq, n_rows = s.seq, s.num_tokens
            if seq.status is Status.RUNNING and seq.mtp_computed == start and seq.num_computed > start:
                want = self._budget(seq, k)
                plan.add(seq, list(range(start, seq.num_computed)), want > 0, s.decode)
                rows.extend(range(base, base + seq.num_computed - start))
                if want > 0:
                    drafting.append((seq, want))
                seq.mtp_computed = seq.num_computed
            elif seq.status is Status.RUNNING and seq.mtp_computed != seq.num_computed:
                seq.mtp_computed = -1  # its MTP cache has a gap: this sequence no longer drafts
            base += n_rows
        if not plan.ids:
            return
        built = plan.build()
        deepest, num_drafting = max((want for _, want in drafting), default=0), len(drafting)
        # a chain graph drafts every depth in one replay when all of them go the same way: every sequence of the
        # catch-up drafts the chain's depth, greedily (its draws are argmaxes, fed to the next depth on the GPU)
        chain = eng.executor.chain_depths(built)
        if not (chain and num_drafting == len(plan.slots) and all(w == chain for _, w in drafting)
                and all(seq.params.greedy for seq, _ in drafting)):
            chain = 0
        drafted = eng.executor.draft(built, rows, True, max(chain, 1))
        chained = drafted.greedy.tolist() if chain else None  # [2][depth][sequence]: one host copy
        self._extend_drafts(drafting, drafted, chained, list(range(len(drafting))))
        self.last_draft_seconds = time.perf_counter() - t0
        if not decode_only:  # the catch-up ran over prompt rows too: not what a decode step's drafts cost
            self.last_draft_seconds = None  # (the next step's measured rate would be charged with it)
        elif deepest > 0 and self.spec.adaptive:
            self.policy.observe_draft(deepest, max(self.last_draft_seconds, 1e-9), num_drafting)

    def _extend_drafts(self, drafting: list[tuple[Sequence, int]], drafted, chained, at: list[int]) -> None:
        """Each drafting sequence's drafts until it has `want` of them or truncation stops it: from `chained`
        draws [2][depth][at[i]] (a chain graph's, every depth drafted), else depth by depth from `drafted` (the
        first depth's output) and one more MTP step per depth."""
        eng = self.engine
        if chained is not None:  # every depth is drafted already: each sequence's run at once
            tokens, sure, factor, explore = chained[0], chained[1], self.calibration.factor, self.choice.explore
            for (seq, want), i in zip(drafting, at):
                survival = 1.0
                for depth in range(want):
                    p = sure[depth][i]
                    seq.drafts.append(int(tokens[depth][i]))
                    seq.draft_sure.append(p)
                    survival *= min(1.0, factor * p)
                    if not (_fixed(seq) or self.policy.keep_drafting(explore, survival)):
                        break
            return
        survival = [1.0] * len(drafting)
        for depth in range(1, max((want for _, want in drafting), default=0) + 1):
            toks, probs, sure = self._draw(drafted, [s for s, _ in drafting])
            keep, nxt = [], _Plan()
            for i, (seq, want) in enumerate(drafting):
                seq.drafts.append(toks[i])
                if probs is not None:
                    seq.draft_probs = (seq.draft_probs or []) + [probs[i]]
                seq.draft_sure.append(sure[i])
                survival[i] *= min(1.0, self.calibration.factor * sure[i])
                if depth < want and (_fixed(seq) or self.policy.keep_drafting(self.choice.explore, survival[i])):
                    keep.append(i)
                    nxt.add(seq, [seq.num_tokens - 2 + depth], True)
            if not keep:
                break
            drafting = [drafting[i] for i in keep]
            survival = [survival[i] for i in keep]
            drafted = eng.executor.draft(nxt.build(), keep, False)

    def _budget(self, seq: Sequence, k: int) -> int:
        """Drafts this sequence may take next step (room before max_tokens / max_model_len, blocks)."""
        if seq.mtp_computed < 0 or not seq.in_decode:
            return 0
        if _fixed(seq):
            k = self.spec.num_speculative_tokens
        if k == 0:
            return 0
        k = min(k, _room(seq, self.engine.max_model_len) - 1)
        while k >= 2 and not self.engine.scheduler.reserve(seq, seq.num_tokens + k - 2):
            k -= 1
        return max(k, 0)

    def _draw(self, drafted, seqs: list[Sequence]):
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
        tokens[idx] = sample_tokens(q, [s.generator for s in sub], self.engine.generator)
        probs_all[idx] = q
        q_rows = {i: q[r] for r, i in enumerate(sampled)}
        sure = probs_all.gather(1, tokens.unsqueeze(1)).squeeze(1)
        host = torch.stack([tokens.double(), sure.double()]).tolist()  # one device-to-host copy
        return [int(t) for t in host[0]], [q_rows.get(i) for i in range(len(seqs))], host[1]

    def stats(self) -> dict:
        c = self.counters
        return {"spec_decode_num_drafts": c.num_drafts, "spec_decode_num_draft_tokens": c.num_draft_tokens,
                "spec_decode_num_accepted_tokens": c.num_accepted_tokens,
                "spec_decode_num_accepted_tokens_per_pos": list(c.accepted_per_pos),
                "spec_decode_mean_accepted_length": c.mean_accepted_length}


def _argmax_only(seq: Sequence) -> bool:
    """A fused step can choose this sequence's tokens: the raw logits' argmax, no logprobs to report."""
    return seq.params.logprobs is None and sampler.plain_argmax(seq)


def _room(seq: Sequence, max_model_len: int) -> int:
    """The most tokens `seq` may still emit, as max_tokens and max_model_len allow (`_budget`: its drafts one
    fewer, the step's own token being one of them)."""
    return min(seq.max_tokens - len(seq.output_ids), max_model_len + 1 - seq.num_tokens)


def _fixed(seq: Sequence) -> bool:
    """A sampled request with a seed drafts a fixed k, never truncated: its random draws then do not depend
    on step timings (which the adaptive k does), so the same request gives the same output."""
    return seq.generator is not None and not seq.params.greedy


@dataclass
class _Walk:
    seq: Sequence
    base: int
    drafts: list[int]
    probs: list | None
    sure: list[float]
    accepted: int = 0
    evaluated: int = 0


class _Plan:
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
