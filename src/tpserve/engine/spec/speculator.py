"""Speculative decoding with the checkpoint's MTP layer: verify drafts, commit, draft again.

A step verifies each decoding sequence's pending drafts (engine/spec/accept.py); the engine then commits the
KDA/conv states of the accepted prefix (model/kda.py `commit`: a replay through the plain decode update, so
the state is what decoding without drafts leaves); then `propose` chooses the next step's k (the policy's
cost model, the measured rates, engine/spec/policy.py and rates.py) and drafts (engine/spec/draft.py).
With `--draft-graph fused` (the default) a greedy step whose sequences all verify drafts (`fusable`) does all
of it on the device: the verify graph, then a graph with the acceptance, the commit, the catch-up and the
chain (ModelRunner.execute_spec); the host walks the copied argmaxes (`verify_fused`: the same emits, stops
and counters) and keeps the drafts.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from tpserve.config import SpeculativeConfig
from tpserve.engine import sampler
from tpserve.engine.overlap import pipelinable
from tpserve.engine.request import Sequence, Status
from tpserve.engine.scheduler import Scheduled, Scheduler
from tpserve.engine.spec import accept
from tpserve.engine.spec.accept import SpecCounters
from tpserve.engine.spec.draft import Drafter, fixed, room
from tpserve.engine.spec.policy import SpecPolicy
from tpserve.engine.spec.rates import Calibration, MeasuredRates, PassCost
from tpserve.engine.warmup import WATCH
from tpserve.model.config import ModelConfig

IDLE_STEPS = 8  # after this many steps in a row with k = 0 the MTP layer stops running


def check_checkpoint(model_dir, cfg: ModelConfig) -> None:
    """A clear error when the checkpoint has no MTP layer to draft with."""
    from tpserve.model.loader import tensor_info

    if cfg.num_nextn_predict_layers < 1:
        raise ValueError(f"speculative_config: method 'mtp' needs the checkpoint's MTP layer, but {model_dir}'s "
                         "config has num_nextn_predict_layers = 0")
    info = tensor_info(model_dir, cfg.num_hidden_layers, mtp=True)
    if "mtp.eh_proj.weight" not in info:
        raise ValueError(f"speculative_config: method 'mtp' needs the MTP layer's weights (layer "
                         f"{cfg.num_hidden_layers}: eh_proj, enorm, hnorm, ...), and {model_dir} has none")


def _wait(t: torch.Tensor) -> float:
    """Seconds the host waits for the work queued before `t` (0 off the GPU, where nothing is queued)."""
    if t.device.type != "cuda":
        return 0.0
    t0 = time.perf_counter()
    torch.cuda.current_stream(t.device).synchronize()
    return time.perf_counter() - t0


def _argmax_only(seq: Sequence) -> bool:
    """A fused step can choose this sequence's tokens: the raw logits' argmax, no logprobs to report."""
    return seq.params.logprobs is None and sampler.plain_argmax(seq)


class Speculator:
    """The engine's step loop asks `idle` (may this step run as plain decoding?), then either `fusable` and
    `verify_fused`, or `verify` and (after the KDA commit) `propose`. `request_added`, `finished` and `forget`
    keep its per-request state; tokens reach the sequences through `append` (the engine's)."""

    def __init__(self, spec: SpeculativeConfig, model_config: ModelConfig, scheduler: Scheduler, executor, *,
                 append: accept.Append, generator: torch.Generator, max_model_len: int, overlap: bool = False):
        self.spec, self.scheduler, self.executor = spec, scheduler, executor
        self.overlap = overlap  # plain decoding without the speculator runs with async scheduling
        self.append, self.generator, self.max_model_len = append, generator, max_model_len
        self.policy = SpecPolicy(spec.num_speculative_tokens, adaptive=spec.adaptive,
                                 truncate_threshold=spec.truncate_threshold,
                                 num_experts=model_config.n_routed_experts,
                                 experts_per_token=model_config.num_experts_per_tok,
                                 num_moe_layers=sum(t == "sparse" for t in model_config.mlp_layer_types))
        self.counters = SpecCounters(accepted_per_pos=[0] * spec.num_speculative_tokens)
        self.rates = MeasuredRates()
        self.calibration = Calibration()
        self.drafter = Drafter(executor, scheduler, self.policy, self.calibration, generator, max_model_len,
                               spec.num_speculative_tokens)
        self.choice = self.policy.begin_step()
        self.num_added = 0  # requests added (`request_added`)
        self.idle_steps = 0  # consecutive steps with k = 0
        self.idle_since: int | None = None  # num_added when the running requests last stopped drafting
        self.idle_above_graphs = False  # ... because the batch was above the verify graphs (else: k = 0 for long)
        self.last_k, self.last_draft_seconds, self.emitted = 0, 0.0, 0
        self.step_drafted = False  # the step just run verified drafts (what MeasuredRates files it under)
        self.fused_limit = 0  # the largest batch of a fused step, as `fusable` last read it
        self.pending_rate: tuple | None = None  # a fused step's MeasuredRates observation, filed by `while_waiting`
        self.mark: float | None = None  # when `_next_k` last ran (None: steps without the speculator since)
        self.wait_seconds = 0.0  # a plain step's wait for its forward (`verify`)
        self.pass_cost = PassCost()  # a prompt's MTP pass, measured (`propose`)
        self.prefill_cost = PassCost()  # a step with prompt rows (the trunk's), measured (`propose`)
        self.kernels_met = WATCH.met  # Triton kernels met so far: a step that compiled one is not measured
        self.aside_mark: tuple[float, int] | None = None  # (when, batch) of the last step `idle` let run aside
        scheduler.mtp_wanted = self._recompute_pays

    def set_adaptive(self, on: bool, fixed_k: int | None = None) -> None:
        """Switch between adaptive k and a fixed k in a running engine (bench/spec_ab.py --one-engine).
        fixed_k (adaptive off): 1..num_speculative_tokens, default num_speculative_tokens; a fused step still
        runs num_speculative_tokens rows, so a smaller fixed k stands in for an engine built with it only on
        steps that are not fused. What the adaptive mode learned is kept; the fixed mode observes nothing."""
        k = self.spec.num_speculative_tokens if fixed_k is None else fixed_k
        if on and fixed_k is not None:
            raise ValueError("fixed_k: only with adaptive off")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.spec.num_speculative_tokens:
            raise ValueError(f"fixed_k: must be an int in 1..num_speculative_tokens "
                             f"({self.spec.num_speculative_tokens}), got {fixed_k!r}")
        self.spec = dataclasses.replace(self.spec, adaptive=bool(on))
        self.policy.adaptive, self.policy.fixed_k = bool(on), k

    def while_waiting(self) -> None:
        """File the observation a fused step left pending (`_observe`). ModelRunner.execute_spec calls this
        between launching the next step and waiting for it, so the bookkeeping overlaps the device's work;
        every other observation files a pending one first, so they stay in order."""
        pending = self.pending_rate
        if pending is not None:
            self.pending_rate = None
            self.rates.observe(*pending)

    # ------------------------------------------------------------ requests
    def request_added(self) -> None:
        """A request was added: the policy decides afresh for the running ones (`idle`)."""
        self.num_added += 1

    def forget(self, seq: Sequence) -> None:
        self.policy.forget(seq)

    def finished(self, seqs: list[Sequence]) -> None:
        """After a step without drafts: the policy keeps nothing of the requests that ended in it."""
        if self.policy.tracking():
            for seq in seqs:
                if seq.is_finished:
                    self.policy.forget(seq)

    def idle(self) -> bool:
        """Whether the coming step may run as plain decoding without the speculator, so with async scheduling
        (engine/overlap.py) as an engine without speculation: drafting stopped for every running request
        (`_stop_drafting`: the batch is above the verify graphs, or k = 0 for IDLE_STEPS steps) and no
        request was added since. Saves verify's and propose's passes over the sequences. Under adaptive k, each
        such step's whole cycle (call to call, one token for each running request while none finishes or joins)
        is measured as plain decoding at its batch: what stepping aside gives, where plain steps taken beside the
        speculator carry its host work and no async scheduling."""
        batch, now, last = len(self.scheduler.running), time.perf_counter(), self.aside_mark
        self.aside_mark = None
        if self.idle_since is None:  # (drafting not stopped)
            return False
        if self.idle_since != self.num_added:  # a request added: the policy decides afresh
            self.idle_since, self.idle_steps = None, 0
            return False
        if self.idle_above_graphs:
            limit = self.executor.verify_graph_batch()
            if limit is None or batch <= limit:
                return False
        if self.spec.adaptive and last is not None and last[1] == batch and not self._compiled():
            self.rates.observe(batch, False, batch, now - last[0])
        if not self.scheduler.waiting:  # (else one may join in this step: a prefill chunk in its cycle)
            self.aside_mark = (now, batch)
        self.idle_steps += 1
        self.mark = None
        self.rates.tick()  # (a probe due then comes with the next request)
        return True

    # -------------------------------------------------------------- verify
    def verify(self, sampled: list[Scheduled], logits: torch.Tensor) -> list[int]:
        """Emit every completing sequence's tokens (one row each, plus one per draft); return the commit
        counts (tokens made real) of the sequences that verified drafts, in step order."""
        seqs = [s.seq for s in sampled]
        self.step_drafted = any(seq.drafts for seq in seqs)
        if not self.step_drafted:  # nothing to verify (k = 0): the plain engine's sampling
            self.wait_seconds = _wait(logits)
            for seq, res in zip(seqs, sampler.sample(logits, seqs, self.generator)):
                self.append(seq, res)
            self.finished(seqs)
            self.emitted += len(seqs)
            return []
        return self._record(accept.walk(seqs, logits, self.append, self.generator))

    def fusable(self, scheduled: list[Scheduled]) -> bool:
        """Whether this step can verify, commit and draft on the device in one go (`verify_fused`): every
        sequence verifies 1 to num_speculative_tokens drafts, greedily with nothing but the argmax in force and no
        logprobs, its MTP cache current, and blocks (reserved here, before the step's plan) for the rows the
        next drafts' chain writes, up to position num_computed + 2k - 1 (else they would land in the shared
        dummy block, where other sequences' rows overwrite them)."""
        limit, positions = self.executor.spec_step_limits()  # (0, 0): none
        self.fused_limit, k = limit, self.spec.num_speculative_tokens
        if not limit or len(scheduled) > limit:
            return False
        for s in scheduled:
            seq = s.seq
            if not (s.decode and 0 < s.num_drafts <= k and seq.draft_probs is None
                    and seq.mtp_computed == seq.num_computed and _argmax_only(seq)
                    and seq.num_computed + 2 * k <= positions):  # the chain's last row: num_computed + 2k - 1
                return False
        return all(self.scheduler.reserve(s.seq, s.seq.num_computed + 2 * k) for s in scheduled)

    def verify_fused(self, scheduled: list[Scheduled], verified, step_seconds: float, step_tokens: int) -> None:
        """After a fused step (ModelRunner.execute_spec; the KDA commit and the MTP catch-up ran on the device):
        emit each sequence's accepted run from the verify rows' argmaxes, then take the next drafts from the
        chain's draws (truncation and the policy's k as in `propose`)."""
        greedy, accepted, draws = verified
        self.step_drafted = True
        self._record(accept.walk_fused(scheduled, greedy, accepted, self.append))
        for s in scheduled:
            s.seq.mtp_computed = s.seq.num_computed  # the catch-up covered every accepted row
        k = self._next_k(scheduled, step_seconds, step_tokens, fused=True)  # (the drafts ran inside the step)
        if k is not None:
            self.drafter.from_chain([s.seq for s in scheduled], k, draws, self.choice.explore)

    def _record(self, runs: list[accept.Run]) -> list[int]:
        """Counters and estimators after the walk; -> the commit counts."""
        self.emitted += sum(r.evaluated for r in runs)
        counts = []
        for r in runs:
            r.seq.drafts, r.seq.draft_probs, r.seq.draft_sure = [], None, []
            if not r.drafts:
                continue
            counts.append(0 if r.seq.is_finished else 1 + r.accepted)
            self.counters.record(len(r.drafts), r.accepted)
            seen = min(len(r.drafts), r.evaluated)
            self.policy.observe_acceptance(r.seq, seen, r.accepted, self.choice.explore)
            if self.choice.explore:
                self.calibration.observe(r.sure[:seen], r.accepted)
        for r in runs:
            if r.seq.is_finished:  # after its last observation: the policy keeps nothing of it
                self.policy.forget(r.seq)
        return counts

    # ------------------------------------------------------------- propose
    def propose(self, scheduled: list[Scheduled], starts: list[int], step_seconds: float, step_tokens: int) -> None:
        """After a step's tokens are emitted and committed: choose k, then draft the next step's tokens."""
        t0 = time.perf_counter()
        prompts = not all(s.decode for s in scheduled)
        if prompts and self.spec.adaptive and not self._compiled():
            self.prefill_cost.observe(step_seconds, step_tokens)
        k = self._next_k(scheduled, step_seconds, step_tokens)
        if k is None:
            return
        t1 = time.perf_counter()
        drafted = self.drafter.draft(scheduled, starts, k, self.choice.explore,
                                     self._prompt_passes if prompts and self.spec.adaptive else None)
        if drafted is None:
            return
        deepest, num_drafting = drafted
        self.last_draft_seconds = time.perf_counter() - t0
        if prompts:  # the catch-up ran over prompt rows too: not what a decode step's drafts cost (the next
            self.last_draft_seconds = None  # step's measured rate would carry it), but a prompt's pass where one
            if self.drafter.prompt_rows and not self._compiled():  # ran (with any decode rows' beside it: over)
                self.pass_cost.observe(time.perf_counter() - t1, self.drafter.rows)
        elif deepest > 0 and self.spec.adaptive:
            self.policy.observe_draft(deepest, max(self.last_draft_seconds, 1e-9), num_drafting)

    def _prompt_passes(self, prompts: list[tuple[Sequence, int]]) -> set[Sequence]:
        """The prompts of this step whose MTP pass over their rows is paid back, by the time drafting is measured to
        save per token at the batch the request will decode in (MeasuredRates.saved_per_token) over the tokens it
        may still emit, against the pass's estimated cost (PassCost): each prompt pays for its own rows, and
        together they pay the step's pass its fixed part (one pass runs for them all). Every pass runs where
        either is not measured and where drafting is due to be measured again; a fixed k's always, and then the
        others pay only their rows. The batch counts the waiting requests too: prompts admitted over several steps
        decode together, not at the batch running when each was admitted. Drafting's tokens a step are the
        acceptance estimates' for that batch, new requests at the global rates (not the requests last asked about:
        one that drafted badly says little of the next prompt)."""
        if not prompts:
            return set()
        saved, parts = self._saved_per_token(self._coming_batch()), self.pass_cost.parts()
        if saved is None or parts is None:
            run = {seq for seq, _ in prompts}
        else:
            fixed_part, per_row = parts
            run = {seq for seq, _ in prompts if fixed(seq) or seq.mtp_recompute}
            net = {seq: room(seq, self.max_model_len) * saved - per_row * rows for seq, rows in prompts
                   if seq not in run}
            paying = {seq for seq, n in net.items() if n > 0}
            if run or sum(net[seq] for seq in paying) > fixed_part:
                run |= paying
        self.pass_cost.ran += len(run)
        self.pass_cost.skipped += len(prompts) - len(run)
        return run

    def _recompute_pays(self, seq: Sequence, start: int, hit: int) -> bool:
        """Whether a waiting request whose prefix hit of `hit` positions has MTP rows only before `start` (see
        engine/prefix_cache.py) computes the rest again from `start`, so that it drafts: with a fixed k, or where
        drafting is measured to save more over the tokens it may emit than the recomputed rows (the trunk's time a
        row, from prompt steps) and its MTP pass (`PassCost`) cost, or either is not measured yet; not above the
        verify graphs, where nothing drafts. Otherwise it takes the whole hit and decodes plainly. Its pass then
        runs whatever the pay-back rule says (`_prompt_passes`)."""
        if fixed(seq) or not self.spec.adaptive:
            return True
        batch = max(self._coming_batch(), 1)  # (seq is waiting)
        limit = self.executor.verify_graph_batch()
        if limit is not None and batch > limit:
            return False
        parts, trunk = self.pass_cost.parts(), self.prefill_cost.parts()
        saved = self._saved_per_token(batch)
        if saved is None or parts is None or trunk is None:
            return True
        cost = parts[0] + parts[1] * (seq.num_tokens - start) + trunk[1] * (hit - start)
        return room(seq, self.max_model_len) * saved > cost

    def _coming_batch(self) -> int:
        """The batch a request admitted now decodes in: the running and waiting requests (prompts admitted over
        several steps decode together), at most max_num_seqs."""
        sched = self.scheduler
        return min(len(sched.running) + len(sched.waiting), sched.max_num_seqs)

    def _saved_per_token(self, batch: int) -> float | None:
        """Seconds drafting is measured to save per token at `batch` (MeasuredRates.saved_per_token), the running
        requests at their acceptance estimates and new ones at the global rates."""
        gain = self.policy.expected_emitted(batch, self.scheduler.running, self.spec.num_speculative_tokens)
        return self.rates.saved_per_token(batch, gain)

    def _compiled(self) -> bool:
        """Whether a Triton kernel was compiled (or loaded) since the last call: what ran meanwhile is not
        measured (its time is mostly the build)."""
        met = WATCH.met
        changed, self.kernels_met = met != self.kernels_met, met
        return changed

    def _next_k(self, scheduled: list[Scheduled], step_seconds: float, step_tokens: int,
                fused: bool = False) -> int | None:
        """Observe the step just run (its time and tokens), then choose the next step's k; None: the MTP layer
        stops for the running sequences (they draft no more)."""
        now = time.perf_counter()
        cycle, self.mark = (now - self.mark if self.mark is not None else None), now
        adaptive, batch = self.spec.adaptive, len(self.scheduler.running)
        # (after a fused step of the whole batch the batch is within the verify graphs)
        limit = self.executor.verify_graph_batch() if adaptive and not (fused and batch <= self.fused_limit) else None
        above_graphs = limit is not None and batch > limit
        if above_graphs and not any(fixed(s.seq) for s in scheduled):
            self._stop_above_graphs(scheduled)
            return None
        self.idle_since = None
        running = [s.seq for s in scheduled if s.seq.status is Status.RUNNING]
        # steps with prefill chunks say nothing of decode costs or rates; a fixed k uses neither
        if adaptive and (fused or all(s.decode for s in scheduled)) and not self._compiled():
            self._observe(batch, scheduled, step_seconds, step_tokens, fused, cycle)
        self.emitted, self.last_draft_seconds, self.step_drafted, self.wait_seconds = 0, 0.0, False, 0.0
        self.choice = self.policy.begin_step()
        # (above the graphs only requests with a fixed k draft: `Drafter.budget`)
        k = self.last_k = 0 if above_graphs else self._choose_k(batch, running, fused)
        self.idle_steps = self.idle_steps + 1 if k == 0 else 0
        none_can = running and not any(seq.mtp_computed >= 0 for seq in running)  # (e.g. no prompt pass paid)
        stop = self.idle_steps > IDLE_STEPS or (k == 0 and self.rates.plain_leads(batch)) or none_can
        if stop and not any(fixed(seq) for seq in running):
            # speculation has not paid for a while (large batches), or this batch size measures plain decoding
            # faster and drafting is not due for a probe, or no running request can draft: the MTP catch-up
            # stops too (a prompt's MTP pass is skipped); requests that arrive later draft when k > 0 again
            for seq in running:
                seq.mtp_computed = -1
            self._stop_drafting(above_graphs=False)
            return None
        return k

    def _observe(self, batch: int, scheduled: list[Scheduled], step_seconds: float, step_tokens: int, fused: bool,
                 cycle: float | None) -> None:
        """A decode step's time into the cost model (not a fused step's: it holds the drafting too, which the
        model fits apart) and its rate into MeasuredRates (a fused step's filed while the next step runs).
        The rate is over the step's whole cycle (`cycle`: from the last step's `_next_k` to this one's), so the
        host's work between steps counts, which grows with the tokens a step emits. A plain step's cycle leaves
        out the MTP catch-up before it (decoding plainly for long stops the MTP layer: IDLE_STEPS), and where
        plain decoding would run with async scheduling (on, and every sequence pipelinable) its host work overlaps
        the forward: the cycle is then taken as the longer of the host's work and the wait for the forward
        (`verify`)."""
        if not fused:
            self.policy.observe_step(step_tokens, max(step_seconds, 1e-9))
        if self.last_draft_seconds is None or cycle is None:  # the drafts came with a prompt's MTP catch-up, or
            return  # the step before ran without the speculator
        self.while_waiting()  # a pending observation first
        if self.step_drafted:
            seconds = cycle
        else:
            host = max(cycle - self.last_draft_seconds - self.wait_seconds, 0.0)
            overlapped = self.overlap and all(pipelinable(s.seq) for s in scheduled)
            seconds = max(host, self.wait_seconds) if overlapped else host + self.wait_seconds
        seen = (batch, self.step_drafted, self.emitted, seconds)
        if fused:
            self.pending_rate = seen
        else:
            self.rates.observe(*seen)

    def _choose_k(self, batch: int, running: list[Sequence], fused: bool) -> int:
        """The next step's k. Where that step can be fused its verify and chain cost max_k rows and depths
        whatever k is, so k is 0 or max_k, and where both modes were measured the measurements decide."""
        max_k, adaptive = self.spec.num_speculative_tokens, self.spec.adaptive
        # (after a fused step `fusable` read the limit and passed every sequence, and they still pass)
        padded = adaptive and (batch <= self.fused_limit if fused else self._padded(running, batch))
        # the measurements give each mode's time a step; the acceptance estimates, what these requests would emit
        decided = (self.rates.measured_k(batch, max_k, self.policy.expected_emitted(batch, running, max_k))
                   if padded else None)
        if decided is not None:
            k, within = decided
            # `within` plain steps take less time than one fused step, which costs its max_k rows however few
            # tokens the batch may still keep (taken at its best, every draft accepted: this errs toward drafting)
            return 0 if k and within >= 2 and 2 <= self._left(running) <= within else k
        k = self.policy.choose_k(batch, running)
        if adaptive and k == 0 and self.rates.drafting_leads(batch):  # (the cost model's 0 measured wrong here)
            k = self.policy.choose_k(batch, running, least=1)
        if adaptive:
            drafts = max_k if padded else k  # (a padded step drafts max_k whatever k is)
            k = self.rates.override(batch, k, self.policy.expected_emitted(batch, running, drafts) if k else None)
        return max_k if padded and 0 < k < max_k else k

    def _left(self, running: list[Sequence]) -> int:
        """The most tokens a running request may still emit (`room`)."""
        left = 0
        for seq in running:  # (a loop: a generator's max costs more at the batch of 1 this matters for)
            n = room(seq, self.max_model_len)
            if n > left:
                left = n
        return left

    def _padded(self, running: list[Sequence], batch: int) -> bool:
        """Whether the next step can be fused (`fusable`): then fewer drafts than num_speculative_tokens save
        nothing and emit fewer tokens."""
        return batch <= self.executor.spec_step_limits()[0] and all(map(_argmax_only, running))

    def _stop_above_graphs(self, scheduled: list[Scheduled]) -> None:
        """The batch is above the verify graphs: plain steps replay a graph there and drafting ones could not, so
        nothing drafts and the MTP catch-up stops (an eager MTP pass per step costs too much). The running
        requests draft no more (their MTP cache would have a gap); later ones do once the batch is small."""
        self.emitted, self.last_draft_seconds, self.last_k, self.step_drafted = 0, 0.0, 0, False
        self.idle_steps += 1
        for s in scheduled:
            s.seq.mtp_computed = -1
        self._stop_drafting(above_graphs=True)

    def _stop_drafting(self, above_graphs: bool) -> None:
        """The running requests draft no more: unless one has a fixed k, the next steps may skip the speculator
        until a request is added (`idle`)."""
        if not any(fixed(seq) for seq in self.scheduler.running):
            self.idle_since, self.idle_above_graphs = self.num_added, above_graphs

    def stats(self) -> dict:
        return self.counters.stats()
