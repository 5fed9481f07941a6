"""LLMEngine: requests in, tokens out, one scheduler step at a time (synchronous core)."""

from __future__ import annotations

import gc
import json
import logging
import time
from pathlib import Path

import torch

from tpserve.config import EngineConfig
from tpserve.engine import logits_process, overlap, prompt_logprobs, sampler, warmup
from tpserve.engine.spec import speculator as speculate
from tpserve.engine.detokenize import Detokenizer
from tpserve.engine.executor import EngineDeadError, LocalExecutor
from tpserve.engine.outputs import CompletionOutput, RequestOutput
from tpserve.engine.request import Sequence, Status
from tpserve.engine.runner import StepPlan
from tpserve.engine.scheduler import Scheduled, Scheduler
from tpserve.engine.cache import BlockPool, SlotPool
from tpserve.engine.prefix_cache import check_cache_salt, make_prefix_cache
from tpserve.engine.setup import load_model_config, resolve_runtime
from tpserve.engine.tokenizer import load_tokenizer
from tpserve.sampling_params import SamplingParams

log = logging.getLogger("tpserve.engine")


class LLMEngine:
    def __init__(self, ecfg: EngineConfig):
        t0 = time.perf_counter()
        rt = resolve_runtime(ecfg)
        self.ecfg, self.model_dir, self.device, self.dtype = ecfg, rt.model_dir, rt.device, rt.dtype
        self.model_config = load_model_config(ecfg, self.model_dir)
        self.tokenizer = None
        if not ecfg.skip_tokenizer_init:
            self.tokenizer = load_tokenizer(self.model_dir, ecfg.tokenizer_cache_words, ecfg.tokenize_in_pieces)
        self.eos_ids = frozenset(self._eos_ids())
        spec = ecfg.speculative
        if spec is not None and ecfg.load_format != "dummy":  # dummy: the MTP layer is random like the rest
            speculate.check_checkpoint(self.model_dir, self.model_config)
        if ecfg.tensor_parallel_size == 1:
            self.executor = LocalExecutor(ecfg, str(self.model_dir), self.model_config, self.device, self.dtype,
                                          rt.kernels)
        else:  # TP > 1: worker processes (engine/tp/executor.py, which builds on engine/executor.py)
            from tpserve.engine.tp.executor import TPExecutor

            self.executor = TPExecutor(ecfg, str(self.model_dir), self.model_config, self.device, self.dtype,
                                       rt.kernels)
        shape = self.executor.cache_shape
        self.max_model_len = self._max_model_len(shape.num_blocks * shape.block_size)
        self.block_pool, self.slot_pool = BlockPool(shape.num_blocks), SlotPool(shape.num_slots)
        self.prefix_cache = make_prefix_cache(ecfg, self.model_config, shape, self.dtype, self.block_pool)
        self.scheduler = Scheduler(self.block_pool, self.slot_pool, block_size=shape.block_size,
                                   max_num_seqs=ecfg.max_num_seqs, max_num_batched_tokens=ecfg.max_num_batched_tokens,
                                   prefix=self.prefix_cache)
        self.generator = torch.Generator(self.device).manual_seed(ecfg.seed)
        self.requests: dict[str, tuple[list[Sequence], str | None]] = {}
        self.dead: str | None = None
        self.step_count = 0
        self.num_added = 0  # requests added so far
        self.speculator = self.new_speculator() if spec is not None else None
        if self.prefix_cache is not None and spec is not None:
            self.prefix_cache.state_current_at_finish = False
        # async scheduling (engine/overlap.py): a decode step launched, its tokens not yet on the host
        self.overlap = ecfg.async_scheduling  # (with speculation: idle steps)
        self.inflight: overlap.Inflight | None = None
        self.num_overlapped = 0  # steps launched before the previous step's tokens were read
        log.info("engine ready: %s on %s (%s), TP=%d, %d cache blocks of %d tokens, %d slots, max_model_len %d",
                 self.model_dir, self.device, self.dtype, ecfg.tensor_parallel_size, shape.num_blocks,
                 shape.block_size, shape.num_slots, self.max_model_len)
        self.boot = warmup.start(self, t0)  # every kernel shape compiled before the server answers /health

    # ------------------------------------------------------------------ setup
    def new_speculator(self) -> speculate.Speculator:
        """A Speculator on this engine's scheduler and executor (nothing measured yet)."""
        return speculate.Speculator(self.ecfg.speculative, self.model_config, self.scheduler, self.executor,
                                    append=self._append, generator=self.generator, max_model_len=self.max_model_len,
                                    overlap=self.ecfg.async_scheduling)

    def reset_prefix_cache(self) -> bool:
        """vLLM's reset_prefix_cache: forget every cached block and state checkpoint (those held by running
        requests stay theirs, no longer shared). -> whether prefix caching is on."""
        if self.prefix_cache is None:
            return False
        self.prefix_cache.reset()
        return True

    def _eos_ids(self) -> list[int]:
        ids = set(self.model_config.eos_token_id)
        gen = Path(self.model_dir) / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if not ids and self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return sorted(ids)

    def _max_model_len(self, cache_tokens: int) -> int:
        limit = min(self.model_config.max_position_embeddings, cache_tokens)
        want = self.ecfg.max_model_len
        if want is None:
            return limit
        if want > self.model_config.max_position_embeddings:
            raise ValueError(f"max_model_len ({want}) exceeds the model's max_position_embeddings "
                             f"({self.model_config.max_position_embeddings})")
        if want > cache_tokens:
            raise ValueError(f"max_model_len ({want}) does not fit in the KV cache ({cache_tokens} tokens); "
                             "raise --kv-cache-memory / --gpu-memory-utilization or lower --max-model-len")
        return want

    # --------------------------------------------------------------- requests
    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Check a request without touching engine state; returns its resolved max_tokens."""
        if self.dead:
            raise EngineDeadError(self.dead)
        if not prompt_token_ids:
            raise ValueError("prompt: the prompt is empty (at least one token is needed)")
        vocab = self.model_config.vocab_size
        ids = prompt_token_ids  # (the quick test first: its loops run in C)
        if set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) >= vocab:
            bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
        else:
            bad = []
        if bad:
            raise ValueError(f"prompt_token_ids: {bad[:3]} out of range for vocab_size {vocab}")
        oov = [t for t in (params.logit_bias or {}) if not 0 <= t < vocab]
        if oov:
            raise ValueError(f"logit_bias: token ids {oov[:3]} are out of range for vocab_size {vocab}")
        n = len(prompt_token_ids)
        if n >= self.max_model_len:
            raise ValueError(f"prompt is {n} tokens, max_model_len is {self.max_model_len}: no room to generate")
        room = self.max_model_len - n
        if params.max_tokens is not None and params.max_tokens > room:
            raise ValueError(f"prompt ({n} tokens) plus max_tokens ({params.max_tokens}) exceeds max_model_len "
                             f"({self.max_model_len})")
        if params.stop_list and self.tokenizer is None:
            raise ValueError("stop: stop strings need a tokenizer (the engine runs with skip_tokenizer_init)")
        return params.max_tokens or room

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt: str | None = None, final_only: bool = False, cache_salt: str | None = None) -> None:
        """final_only (vLLM's RequestOutputKind.FINAL_ONLY, which its LLM.generate uses): step() returns
        this request's output once, finished; its text is decoded once at the end unless stop strings
        need it token by token. cache_salt (vLLM's): requests share cached prefixes only with the same salt."""
        max_tokens = self.validate_request(prompt_token_ids, params)
        check_cache_salt(cache_salt)
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        seqs = []
        for i in range(params.n):
            child = params.child(i) if params.n > 1 else params
            seq = Sequence(request_id, i, list(prompt_token_ids), child, max_tokens, self.eos_ids)
            if child.seed is not None:
                seq.generator = torch.Generator(self.device).manual_seed(child.seed)
            if child.logprobs is not None:
                seq.logprobs = []
            seq.detok = Detokenizer(self.tokenizer, child) if self.tokenizer is not None else None
            seq.final_only = final_only
            seq.cache_salt = cache_salt
            seqs.append(seq)
        self.requests[request_id] = (seqs, prompt)
        self.num_added += 1
        if self.speculator is not None:
            self.speculator.request_added()
        for seq in seqs:
            self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        entry = self.requests.pop(request_id, None)
        if entry is None:
            return False
        for seq in entry[0]:
            overlap.drop_pending(seq)  # (an in-flight token of an aborted request is dropped when it lands)
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
            if self.speculator is not None:
                self.speculator.forget(seq)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # ------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        if self.dead:
            raise EngineDeadError(self.dead)
        spec = self.speculator
        if self.inflight is not None and not (overlap.ready(self.inflight, self.scheduler, self.max_model_len)
                                              and (spec is None or spec.idle())):
            return self._fatal("", self._drain)
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        if self.inflight is not None:
            return self._fatal("", self._overlapped_step, scheduled)
        # decodes first (they take the decode kernels), verifies of drafts next, prefill chunks last
        scheduled.sort(key=lambda s: (not s.decode, s.num_tokens != 1))
        # (adaptive k above the verify graphs: a plain step, Speculator.idle)
        speculating = spec is not None and not spec.idle()
        if speculating and spec.fusable(scheduled):  # (reserves blocks: before the plan)
            return self._fused_step(scheduled, self._plan(scheduled))
        plan = self._plan(scheduled)
        t0 = time.perf_counter()
        logits = self._fatal("", self.executor.execute, plan)
        logits = prompt_logprobs.take(logits, scheduled, self.tokenizer)  # prompt_logprobs: split off its rows
        sampled = [s for s in scheduled if s.completes]
        starts = [s.seq.num_computed for s in scheduled] if speculating else []
        self._advance(scheduled)
        if speculating:
            self._fatal(" while speculating", self._speculate, sampled, logits, scheduled, starts, t0,
                        len(plan.input_ids))
        elif self.overlap and self._may_defer(scheduled, plan):  # (not while speculating)
            self._fatal("", self._defer, [s.seq for s in scheduled], logits)
            return []
        elif sampled:
            self.sample_and_append([s.seq for s in sampled], logits)
            if spec is not None:
                spec.finished([s.seq for s in sampled])
        return self._outputs(s.seq.request_id for s in sampled)

    # ------------------------------------------------------- async scheduling
    @staticmethod
    def _may_defer(scheduled: list[Scheduled], plan: StepPlan) -> bool:
        """A decode step of one token per sequence, each sampled without host reads (engine/overlap.py)."""
        return (len(plan.logits_indices) == len(scheduled) == len(plan.input_ids)
                and all(s.decode and s.completes and overlap.pipelinable(s.seq) for s in scheduled))

    def _defer(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        self.inflight = overlap.launch(logits, seqs, self.generator)
        for seq in seqs:
            seq.output_ids.append(overlap.PENDING)

    def _overlapped_step(self, scheduled: list[Scheduled]) -> list[RequestOutput]:
        """Launch this decode step on the in-flight step's device tokens, then land those (`overlap.ready`
        said this step decodes exactly the in-flight sequences still running)."""
        old = self.inflight
        if len(scheduled) != len(self.scheduler.running) or not all(s.decode and s.num_tokens == 1 for s in scheduled):
            raise RuntimeError("async scheduling: the step after an in-flight one is not the same decode batch")
        plan = self._plan(scheduled)
        plan.prev_rows = [old.rows[s.seq] for s in scheduled]
        logits = self.executor.execute(plan, old.tokens)
        seqs = [s.seq for s in scheduled]
        new = overlap.launch(logits, seqs, self.generator)
        self._advance(scheduled)
        self.num_overlapped += 1
        outputs = self._outputs(self._land(old))  # (built before the new placeholders go in)
        for seq in seqs:
            if not seq.is_finished:
                seq.output_ids.append(overlap.PENDING)
        self.inflight = new
        return outputs

    def _land(self, inflight: overlap.Inflight) -> list[str]:
        """The in-flight step's tokens into their sequences (those still running) -> their request ids."""
        ids = []
        for seq, res in zip(inflight.seqs, inflight.land()):
            if seq.is_finished:  # aborted, or ended by the token before
                continue
            overlap.drop_pending(seq)
            self._append(seq, res)
            ids.append(seq.request_id)
        if self.speculator is not None:
            self.speculator.finished(inflight.seqs)
        return ids

    def _drain(self) -> list[RequestOutput]:
        inflight, self.inflight = self.inflight, None
        return self._outputs(self._land(inflight))

    def _fused_step(self, scheduled: list[Scheduled], plan: StepPlan) -> list[RequestOutput]:
        """A speculative step whose acceptance, KDA commit and next drafts run on the device after the verify
        (Speculator.fusable, ModelRunner.execute_spec): the host emits the accepted runs and keeps the drafts."""
        t0 = time.perf_counter()
        verified = self._fatal("", self.executor.execute_spec, plan, self.speculator.while_waiting)
        self._advance(scheduled)
        self._fatal(" while speculating", self.speculator.verify_fused, scheduled, verified, time.perf_counter() - t0,
                    len(plan.input_ids))
        return self._outputs(s.seq.request_id for s in scheduled)

    def _speculate(self, sampled: list[Scheduled], logits: torch.Tensor, scheduled: list[Scheduled], starts: list[int],
                   t0: float, tokens: int) -> None:
        """After a step with speculation on: verify (emit) its drafts, commit the KDA states, draft again. The
        step's time runs from t0 (before its launch) to its tokens on the host: on a GPU `execute` only launches
        the work."""
        counts = self.speculator.verify(sampled, logits)
        if counts:
            self.executor.commit(counts)
        self.speculator.propose(scheduled, starts, time.perf_counter() - t0, tokens)

    def _fatal(self, what: str, fn, *args):
        """fn(*args); an exception there leaves the engine dead (its caches may be half written)."""
        try:
            return fn(*args)
        except Exception as exc:
            self.dead = f"engine step failed{what}: {type(exc).__name__}: {exc}"
            raise EngineDeadError(self.dead) from exc

    def _advance(self, scheduled: list[Scheduled]) -> None:
        """After the forward: the step's tokens are in the cache (drafts count once accepted)."""
        self.step_count += 1
        for s in scheduled:
            s.seq.num_computed += s.num_tokens - s.num_drafts

    def _outputs(self, request_ids) -> list[RequestOutput]:
        return [self._output(rid) for rid in set(request_ids) if rid in self.requests and self._reportable(rid)]

    def sample_and_append(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """One token per sequence from its logits row (a step without drafts to verify)."""
        for seq, res in zip(seqs, sampler.sample(logits, seqs, self.generator)):
            self._append(seq, res)

    def _reportable(self, request_id: str) -> bool:
        seqs = self.requests[request_id][0]
        return not seqs[0].final_only or all(s.is_finished for s in seqs)

    def _plan(self, scheduled: list[Scheduled]) -> StepPlan:
        ids, pos, cu, ctx, slots, tables, logits_idx, saves = [], [], [0], [], [], [], [], []
        for i, s in enumerate(scheduled):
            seq, start = s.seq, s.seq.num_computed
            saves.extend((i, rows, ckpt) for rows, ckpt in s.saves)
            for p in range(start, start + s.num_tokens):
                ids.append(seq.token_at(p))
                pos.append(p)
            cu.append(cu[-1] + s.num_tokens)
            ctx.append(start)
            slots.append(seq.slot)
            tables.append(list(seq.blocks))
            logits_idx.extend(prompt_logprobs.rows(seq, start, s.num_tokens, cu[-2]))  # prompt_logprobs rows
            if s.completes:  # the last row, and the rows before it that verify drafts
                logits_idx.extend(range(cu[-1] - 1 - s.num_drafts, cu[-1]))
        sp = (self.ecfg.sequence_parallel and self.ecfg.tensor_parallel_size > 1
              and cu[-1] >= self.ecfg.sp_min_tokens)
        num_decode = sum(1 for s in scheduled if s.decode)
        return StepPlan(ids, pos, cu, ctx, slots, tables, logits_idx, self.scheduler.take_fresh_slots(), sp,
                        num_decode, state_copies=self.scheduler.take_copies(), state_saves=saves)

    def _append(self, seq: Sequence, res: sampler.SampleResult) -> None:
        seq.output_ids.append(res.token)
        logits_process.advance(seq, res.token)
        if seq.logprobs is not None:
            seq.logprobs.append(res.top)
            seq.cumulative_logprob += res.logprob
        p, tok = seq.params, res.token
        reason, stop_reason = None, None
        may_stop = len(seq.output_ids) > p.min_tokens or logits_process.grammar_finished(seq)
        if tok in (p.stop_token_ids or ()) and may_stop:
            reason, stop_reason = "stop", tok
        elif tok in seq.eos_ids and not p.ignore_eos and may_stop:
            reason = "stop"
        if seq.detok is not None and (reason is not None or not seq.final_only or p.stop_list):
            hit = seq.detok.update(seq.output_ids, final=reason is not None)
            if hit is not None and reason is None and len(seq.output_ids) >= p.min_tokens:
                reason, stop_reason = "stop", hit
            seq.text = seq.detok.text
        if reason is None and (len(seq.output_ids) >= seq.max_tokens or seq.num_tokens >= self.max_model_len):
            reason = "length"
        if reason is not None:
            seq.stop_reason = stop_reason
            self.scheduler.finish(seq, reason)
            if seq.detok is not None:
                seq.detok.update(seq.output_ids, final=True)
                seq.text = seq.detok.text

    def _output(self, request_id: str) -> RequestOutput:
        seqs, prompt = self.requests[request_id]
        outs = [CompletionOutput(s.index, s.text, list(s.output_ids),
                                 s.cumulative_logprob if s.logprobs is not None else None,
                                 list(s.logprobs) if s.logprobs is not None else None,
                                 s.finish_reason, s.stop_reason) for s in seqs]
        finished = all(s.is_finished for s in seqs)
        out = RequestOutput(request_id, prompt, seqs[0].prompt_ids, outs, finished,
                            num_cached_tokens=seqs[0].num_cached_tokens)
        out.prompt_logprobs = seqs[0].prompt_logprobs  # prompt_logprobs (None unless asked for)
        if finished:
            del self.requests[request_id]
        return out

    def stats(self) -> dict:
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "blocks_total": self.block_pool.num_blocks, "blocks_free": self.block_pool.num_free,
                "slots_total": self.slot_pool.num_blocks, "slots_free": self.slot_pool.num_free,
                "preemptions": self.scheduler.num_preemptions,
                **(self.prefix_cache.stats() if self.prefix_cache is not None else {}),
                **(self.speculator.stats() if self.speculator is not None else {}), **self.boot.stats()}

    def shutdown(self) -> None:
        self.executor.shutdown()
        if self.boot.frozen:  # (warmup.freeze_heap: what this engine held may be collected again)
            gc.unfreeze()


__all__ = ["LLMEngine", "EngineDeadError", "Status"]
