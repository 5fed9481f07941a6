"""MeasuredRates (decode rates with and without drafts) and what the speculator feeds it and the cost model:
which steps are observed, when, and how the measurements override k."""

import time

import pytest
import torch
from spec_cases import PROMPTS, SPEC, Model, fused_llm

from tpserve import LLM, SamplingParams


def test_measured_rates_turn_drafting_off_where_it_loses():
    from tpserve.engine.spec.rates import MeasuredRates

    r = MeasuredRates()

    def steps(n, batch, k, spec=None, plain=None):  # each step's mode measured as it runs (None: not measured)
        ks = []
        for _ in range(n):
            ks.append(r.override(batch, k))
            step = spec if ks[-1] else plain
            if step is not None:
                r.observe(batch, ks[-1] > 0, *step)
        return ks

    assert steps(8, 1, 3) == [3] * 7 + [0]  # plain not measured: a plain step every 8th
    for _ in range(4):
        r.observe(1, False, 1, 0.01)   # plain: 100 tok/s
    assert steps(16, 1, 3) == [3] * 16  # drafting not measured yet: the policy's k
    for _ in range(4):
        r.observe(1, True, 9, 0.1)     # drafting: 90 tok/s
    ks = steps(130, 1, 3, spec=(9, 0.1))
    assert ks.count(3) == 2 and ks[63] == 3 and ks[127] == 3  # drafting re-measured every 64th step
    for _ in range(8):
        r.observe(1, True, 5, 0.1)     # 50 tok/s in most of the window: plain leads by more than 25%
    ks = steps(300, 1, 3)              # (nothing measured: a probe found no sequence able to draft)
    assert ks.count(3) == 300 - 255 and ks[255] == 3  # every 256th step, and a probe due stays due
    for _ in range(MeasuredRates.WINDOW):
        r.observe(1, True, 50, 0.1)
    ks = steps(2200, 1, 3, plain=(1, 0.01))  # drafting now 5x faster: plain every 1024th step (> 1.5x lead)
    zeros = [i for i, k in enumerate(ks) if k == 0]
    assert len(zeros) == 2 and zeros[1] - zeros[0] == 1024
    for _ in range(4):
        r.observe(64, False, 64, 0.1)
        r.observe(64, True, 70, 0.1)  # faster with drafts at batch 64 by 9%: k stays, plain every 64th step
    ks = steps(128, 40, 2, spec=(70, 0.1), plain=(64, 0.1))
    assert ks.count(0) == 2 and ks.count(2) == 126
    assert MeasuredRates.bucket(1) == 1 and MeasuredRates.bucket(5) == 8 and MeasuredRates.bucket(64) == 64


def test_measured_rates_shrug_off_a_slow_first_drafting_step():
    """One drafting step 200 times slower than the rest (a compile, a GC pause) among the first measured
    does not make plain decoding look faster: each step's time is capped at 3x the window's median."""
    from tpserve.engine.spec.rates import MeasuredRates

    r = MeasuredRates()
    r.observe(1, True, 1, 0.2)  # the outlier first
    for i in range(5):
        r.observe(1, False, 1, 0.001)
        r.observe(1, True, 2 + i % 2, 0.0012)
    assert r.rates[(1, True)] > r.rates[(1, False)]
    assert all(r.override(1, 3) == 3 for _ in range(63))


def test_drafting_rate_is_the_expected_tokens_over_the_measured_step_time():
    """The drafting steps measured emitted one token each (a prompt the drafter guessed badly): by the window's
    own tokens plain decoding leads. Given the tokens the running requests are expected to emit a drafting step
    (`gain`), drafting's rate is that over its measured time a step: a request expected to draft well drafts, one
    expected to draft badly does not."""
    from tpserve.engine.spec.rates import MeasuredRates

    r = MeasuredRates()
    for _ in range(MeasuredRates.MIN_OBS):
        r.observe(1, False, 1, 0.001)  # plain: 1,000 tok/s
        r.observe(1, True, 1, 0.002)   # drafting: 2 ms a step, one token each: 500 tok/s
    assert r.plain_leads(1) and r.measured_k(1, 7) == (0, 1)
    assert r.measured_k(1, 7, gain=6.0) == (7, 1) and not r.plain_leads(1)  # 3,000 tok/s expected
    assert r.snapshot()["batch<=1 spec"] == {"tok_s": 500.0, "steps": 4, "ms_per_step": 2.0, "expected_tok_s": 3000.0,
                                             "at_batch": 1}
    assert r.measured_k(1, 7, gain=1.5) == (0, 1) and r.plain_leads(1)  # 750 tok/s expected
    assert r.override(1, 3, gain=6.0) == 3 and not r.plain_leads(1)
    assert r.measured_k(0, 7, gain=0.0) == (7, 1)  # (nothing running: the last gain stays)
    for _ in range(MeasuredRates.MIN_OBS):  # bucket 16, measured at batch 16: plain 16 tokens, drafting 20, 10 ms
        r.observe(16, False, 16, 0.01)
        r.observe(16, True, 20, 0.01)
    assert r.measured_k(16, 7)[0] == 7
    # 10 requests left, expected to emit 11 a drafting step: 1,100 tok/s against plain's 10 a step, 1,000 tok/s
    # (by the tokens the batch of 16 emitted, 2,000 against 1,600: the batch asked about is the one compared)
    assert r.measured_k(10, 7, gain=11.0)[0] == 7 and not r.plain_leads(10)
    assert r.measured_k(10, 7, gain=9.0)[0] == 0 and r.plain_leads(10)


def test_rate_window_sums_as_when_every_step_kept_its_capped_time():
    """_RateWindow keeps no capped time per step (all steps in the window are capped at the current cap): its
    sums, cap and rate equal, bit for bit, those of a window that stores each step's capped time and updates it
    at every recompute, through outliers, recomputes asked for and the window's turnover."""
    import random
    from collections import deque

    from tpserve.engine.spec.rates import _RateWindow

    class Stored:  # each step's [tokens, seconds, capped seconds]
        def __init__(self):
            self.steps, self.tokens, self.seconds, self.cap, self.added = deque(maxlen=16), 0.0, 0.0, 0.0, 0

        def add(self, tokens, seconds, recap):
            self.added += 1
            if recap or self.added % 8 == 0:
                self.steps.append([tokens, seconds, seconds])
                self.cap = 3.0 * sorted(w[1] for w in self.steps)[len(self.steps) // 2]
                for w in self.steps:
                    w[2] = min(w[1], self.cap)
                self.tokens, self.seconds = sum(w[0] for w in self.steps), sum(w[2] for w in self.steps)
                return True
            if len(self.steps) == 16:
                self.tokens -= self.steps[0][0]
                self.seconds -= self.steps[0][2]
            capped = min(seconds, self.cap)
            self.steps.append([tokens, seconds, capped])
            self.tokens += tokens
            self.seconds += capped
            return False

    assert _RateWindow.WINDOW == 16 and _RateWindow.OUTLIER == 3.0
    rng = random.Random(3)
    for _ in range(20):
        got, want = _RateWindow(), Stored()
        for i in range(500):
            tokens, seconds = rng.randint(1, 8), rng.expovariate(1e3) * (100 if rng.random() < 0.05 else 1)
            recap = i < 4 or rng.random() < 0.02
            assert got.add(tokens, seconds, recap) == want.add(tokens, seconds, recap)
            assert (got.tokens, got.seconds, got.cap, len(got)) == (want.tokens, want.seconds, want.cap,
                                                                   len(want.steps))


def test_speculation_measured_slower_still_probes_a_later_request():
    """Plain decoding measured faster: the MTP layer stops for the running request after IDLE_STEPS
    plain steps, and the drafting probe, once due, waits for a request that can draft (the next one)
    instead of falling on a step where nothing drafts and being lost."""
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    spec = llm.engine.speculator
    rates = spec.rates
    rates.SPEC_PROBE = rates.CLEAR_PROBE = rates.WIDE_PROBE = 24
    for _ in range(rates.MIN_OBS):
        rates.observe(1, False, 1, 1e-6)  # plain decoding "measured" a million tokens per second
        rates.observe(1, True, 1, 1.0)
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    drafts = []
    for prompt in PROMPTS[:3]:
        before = spec.counters.num_drafts
        llm.generate([prompt], sp)
        drafts.append(spec.counters.num_drafts - before)
    assert drafts[0] == 0 and sum(drafts[1:]) > 0  # the probe came due during the first request (30 steps)
    assert len(rates.window[(1, True)]) > rates.MIN_OBS  # and its drafting step was measured
    llm.shutdown()


def test_step_time_runs_until_the_tokens_are_on_the_host():
    """A step's measured time (what MeasuredRates and the cost model see) ends when its sampled tokens are on
    the host, not when `execute` returns: on a GPU that only launched the work. Stand-in: verify (where the
    host waits for the tokens) takes 300 ms longer (a CPU step of the tiny model takes a few ms)."""
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2, "adaptive": False})
    spec = llm.engine.speculator
    verify, propose, seen = spec.verify, spec.propose, []

    def slow_verify(*a, **kw):
        time.sleep(0.3)
        return verify(*a, **kw)

    def recording_propose(scheduled, starts, seconds, tokens):
        seen.append(seconds)
        return propose(scheduled, starts, seconds, tokens)
    spec.verify, spec.propose = slow_verify, recording_propose
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert seen and min(seen) >= 0.3
    llm.shutdown()


def test_measured_rates_leave_out_the_step_after_a_prompt_catch_up():
    """The drafts verified by the first decode step after a prefill chunk were made together with the
    MTP layer's catch-up over the prompt: that step's measured rate would charge a whole prompt's MTP
    forward to one decode step (a low outlier that can switch the adaptive mode to plain steps), so
    MeasuredRates does not see it; every other decode step it does."""
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    spec = llm.engine.speculator
    kinds, observed = [], []
    propose, observe = spec.propose, spec.rates.observe

    def recording_propose(scheduled, *a, **kw):
        kinds.append(all(s.decode for s in scheduled))
        return propose(scheduled, *a, **kw)

    def recording_observe(*a, **kw):
        observed.append(len(kinds) - 1)  # the index of the propose call that observes
        return observe(*a, **kw)
    spec.propose, spec.rates.observe = recording_propose, recording_observe
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    decode_steps = [i for i, decode in enumerate(kinds) if decode]
    after_prefill = [i for i in decode_steps if i > 0 and not kinds[i - 1]]
    assert after_prefill and observed
    assert observed == [i for i in decode_steps if i not in after_prefill]
    llm.shutdown()


def test_plain_steps_measure_without_the_mtp_catch_up():
    """A plain step's measured rate leaves out the MTP catch-up that ran after the step before it (decoding
    plainly for long stops the MTP layer, so plain decoding's steady state has none); a drafting step's rate
    keeps the drafting pass that made its drafts."""
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    spec = llm.engine.speculator
    observed, calls = [], [0]
    draft, observe = spec.drafter.draft, spec.rates.observe

    def slow_draft(*a, **kw):
        time.sleep(0.3)
        return draft(*a, **kw)

    def alternate_k(batch, running, fused):
        calls[0] += 1
        return 2 * (calls[0] % 2)

    def recording_observe(batch, drafted, emitted, seconds):
        observed.append((drafted, seconds))
        return observe(batch, drafted, emitted, seconds)
    spec.drafter.draft, spec._choose_k, spec.rates.observe = slow_draft, alternate_k, recording_observe
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    plain = [s for drafted, s in observed if not drafted]
    drafting = [s for drafted, s in observed if drafted]
    assert plain and drafting
    assert max(plain) < 0.3 <= min(drafting)
    llm.shutdown()


@pytest.mark.parametrize("overlap,penalty", [(True, 1.0), (False, 1.0), (True, 1.1)])
def test_rates_count_the_host_work_between_steps(monkeypatch, overlap, penalty):
    """A step's measured rate runs over its whole cycle: the host's work between steps (here the outputs, made
    slow) counts for drafting and plain steps alike. Where plain decoding would run with async scheduling, a
    plain step's host work overlaps its wait for the forward (here made slow too): it counts the longer of the
    two; without async scheduling, or for a request async scheduling cannot pipeline (a repetition penalty
    reads the last token on the host), both."""
    from tpserve.engine.spec import speculator

    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              async_scheduling=overlap, speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    eng, spec = llm.engine, llm.engine.speculator
    assert spec.overlap is overlap
    observed, calls = [], [0]
    outputs, observe = eng._outputs, spec.rates.observe

    def alternate_k(batch, running, fused):
        calls[0] += 1
        return 2 * (calls[0] % 2)

    def slow_outputs(*a, **kw):
        time.sleep(0.1)
        return outputs(*a, **kw)

    def slow_wait(t):
        time.sleep(0.25)
        return 0.25
    monkeypatch.setattr(speculator, "_wait", slow_wait)
    eng._outputs, spec._choose_k = slow_outputs, alternate_k
    spec.rates.observe = lambda batch, drafted, emitted, seconds: observed.append((drafted, seconds))
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                              repetition_penalty=penalty))
    plain = [s for drafted, s in observed if not drafted]
    drafting = [s for drafted, s in observed if drafted]
    assert plain and drafting
    assert min(drafting) >= 0.1
    if overlap and penalty == 1.0:
        assert 0.25 <= min(plain) and max(plain) < 0.34
    else:
        assert min(plain) >= 0.35
    llm.shutdown()


def test_a_batch_measured_faster_plain_skips_the_prompts_mtp_pass():
    """Where both modes are measured at this batch size and drafting is the slower (no probe due), a new request's
    MTP pass over its prompt and the catch-up steps are skipped: the MTP layer stops at once, the output is plain
    decoding's."""
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    spec = llm.engine.speculator
    for _ in range(4):  # plain 1,000 tok/s against drafting 200
        spec.rates.observe(1, False, 1, 0.001)
        spec.rates.observe(1, True, 2, 0.01)
    assert spec.rates.plain_leads(1) and not spec.rates.plain_leads(2)
    drafts, draft = [], spec.drafter.draft
    spec.drafter.draft = lambda *a, **kw: drafts.append(1) or draft(*a, **kw)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = llm.generate([PROMPTS[0]], sp)[0].outputs[0].token_ids
    assert drafts == []
    plain = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8)
    assert out == plain.generate([PROMPTS[0]], sp)[0].outputs[0].token_ids
    llm.shutdown()
    plain.shutdown()


@pytest.mark.parametrize("adaptive", [True, False])
def test_only_decode_steps_train_the_cost_model_and_rates(adaptive):
    """Steps that hold prefill chunks are not decode costs: neither the step-cost fit, the draft-cost
    fit nor the measured rates see them (a prefill step emits few tokens in a long time, and the drafting
    pass after it runs the MTP layer over the whole prompt: either would skew the choice of k). A fixed k
    uses none of them: nothing is observed."""
    spec = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
               speculative_config={**SPEC, "adaptive": adaptive, "truncate_threshold": 0.0})
    eng, sp_ = spec.engine, spec.engine.speculator
    last = {"prefill": None}
    seen = []
    plan = eng._plan
    originals = {"rates": sp_.rates.observe, "cost": sp_.policy.observe_step, "draft": sp_.policy.observe_draft}

    def spy_plan(scheduled):
        p = plan(scheduled)
        last["prefill"] = p.num_decode < len(p.slots)
        return p

    def spy(kind):
        def call(*a, **kw):
            seen.append((kind, last["prefill"]))
            return originals[kind](*a, **kw)
        return call

    eng._plan = spy_plan
    sp_.rates.observe, sp_.policy.observe_step, sp_.policy.observe_draft = spy("rates"), spy("cost"), spy("draft")
    try:
        spec.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    finally:
        del eng._plan, sp_.rates.observe, sp_.policy.observe_step, sp_.policy.observe_draft
    assert {kind for kind, _ in seen} == ({"rates", "cost", "draft"} if adaptive else set())
    assert not any(prefill for _, prefill in seen)
    spec.shutdown()


def test_fused_steps_file_their_measured_rates_while_the_next_step_runs(plain):
    """Adaptive k with fused steps: a fused step's observation (MeasuredRates.observe) is filed inside the next
    fused step's spec_step, after its launch and before its copy (Speculator.while_waiting: on a GPU the host's
    bookkeeping overlaps the device's work), or by the next step that observes; the last one stays pending until
    while_waiting files it; greedy tokens stay plain decoding's."""
    llm, fused = fused_llm({"method": "mtp", "num_speculative_tokens": 3})
    graphs, spec = llm.engine.executor.runner.graphs, llm.engine.speculator
    inside, seen = [False], []
    spec_step, observe = graphs.spec_step, spec.rates.observe

    def spy_step(*a, **kw):
        inside[0] = True
        try:
            return spec_step(*a, **kw)
        finally:
            inside[0] = False
    graphs.spec_step = spy_step
    spec.rates.observe = lambda *a: seen.append((inside[0], a)) or observe(*a)
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for prompt in PROMPTS[:2]:
        got = llm.generate([prompt], sp)[0].outputs[0].token_ids
        assert got == plain.generate([prompt], sp)[0].outputs[0].token_ids
    filed_inside = sum(i for i, _ in seen)
    # (not after a step that was not fused: a request's first decode step, a plain probe, a prefill chunk)
    assert len(fused) >= 4 and filed_inside >= len(fused) // 2, (len(fused), seen)
    assert all(a[1] for i, a in seen if i)  # (fused steps verified drafts)
    pending = spec.pending_rate
    spec.while_waiting()  # the last fused step's observation, filed by the next step to come
    assert spec.pending_rate is None and (pending is None or seen[-1] == (False, pending))
    llm.shutdown()


def _plant_rates(spec, batch: int, plain_s: float, spec_tokens: int, spec_s: float, gain: float) -> None:
    """Measured rates fixed for the test: 8 plain steps of `batch` tokens in plain_s and 8 drafting ones of
    spec_tokens in spec_s (this CPU's own step times would move them); drafting expected to emit `gain` tokens a
    sequence (as the planted drafting steps emit)."""
    from tpserve.engine.spec.rates import MeasuredRates

    spec.rates = rates = MeasuredRates()
    for _ in range(8):
        rates.observe(batch, False, batch, plain_s)
        rates.observe(batch, True, spec_tokens, spec_s)
    rates.observe = lambda *a: None
    spec.policy.expected_emitted = lambda n, running, k: gain * n


@pytest.mark.parametrize("fused_ms", [3.5, 1.5])
def test_adaptive_ends_a_request_plainly_where_plain_steps_are_shorter(plain, fused_ms):
    """Where the next step would be fused (k is 0 or the largest) and the request may emit at most `left` more
    tokens, adaptive k runs plain steps when `left` of them measure shorter than one fused step, which costs its
    rows and depths however few tokens it may keep: with plain steps of 1 ms, fused steps of 3.5 ms end a request
    plainly from 3 tokens before its end, fused steps of 1.5 ms never. Tokens stay plain decoding's."""
    llm, _ = fused_llm({"method": "mtp", "num_speculative_tokens": 3})
    spec = llm.engine.speculator
    # drafting over twice plain's rate either way: a plain probe only every 1024th step
    _plant_rates(spec, 1, 0.001, 8, fused_ms / 1000, 8.0)
    spec._prompt_passes = lambda prompts: {seq for seq, _ in prompts}  # (the planted steps are not this CPU's)
    seen, next_k = [], spec._next_k

    def spy(*a, **kw):
        k = next_k(*a, **kw)
        running = llm.engine.scheduler.running
        if running:
            seq = running[0]
            seen.append((seq.max_tokens - len(seq.output_ids), k))
        return k
    spec._next_k = spy
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for prompt in PROMPTS[:3]:
        got, want = (m.generate([prompt], sp)[0].outputs[0].token_ids for m in (llm, plain))
        assert got == want
    ends = [k for left, k in seen if 2 <= left <= 3]
    assert ends and all(k == (0 if fused_ms > 3 else 3) for k in ends), seen
    assert all(k == 3 for left, k in seen if left >= 4), seen
    llm.shutdown()


def test_saved_per_token_compares_the_modes_until_drafting_is_stale():
    """Seconds drafting saves per emitted token at a batch's bucket (the prompt pass's pay-back): 1/plain - 1/spec
    at the gain asked about (or one given, which is not kept); None before both modes are measured, and once
    drafting has not been measured for its probe interval (it must run to be measured again)."""
    from tpserve.engine.spec.rates import MeasuredRates

    r = MeasuredRates()
    for _ in range(MeasuredRates.MIN_OBS):
        r.observe(16, False, 16, 0.001)  # plain: 16,000 tok/s
        assert r.saved_per_token(16) is None
        r.observe(16, True, 40, 0.002)  # drafting: 20,000 tok/s
    assert r.saved_per_token(16) == pytest.approx(1 / 16_000 - 1 / 20_000)
    assert r.saved_per_token(16, gain=60.0) == pytest.approx(1 / 16_000 - 1 / 30_000)  # (asked: nothing kept)
    assert r.saved_per_token(16) == pytest.approx(1 / 16_000 - 1 / 20_000)
    assert r.measured_k(16, 7, gain=24.0) == (0, 1)  # 12,000 tok/s expected: drafting costs
    assert r.saved_per_token(12) == pytest.approx(1 / 16_000 - 1 / 12_000) and r.saved_per_token(4) is None
    for _ in range(MeasuredRates.CLEAR_PROBE - 2):  # (a 1.33x lead: drafting re-measured every CLEAR_PROBE steps)
        r.tick()
    assert r.saved_per_token(16) is not None
    r.tick()
    assert r.saved_per_token(16) is None


def test_a_prompt_pass_costs_a_fixed_part_and_a_part_a_row():
    """A pass's estimate: the least pass time plus the least time a row beyond it, over the passes at least twice as
    long as the least one's; one slow pass (a kernel's first load) moves neither. Before a long pass is measured a
    row costs nothing beyond the fixed part (a long prompt's pass runs and is measured, not skipped for good)."""
    from tpserve.engine.spec.rates import PassCost

    cost = PassCost()
    assert cost.estimate(10) is None
    cost.observe(0.013, 10)  # 13 ms for 10 rows
    assert cost.estimate(400) == pytest.approx(0.013)  # (short passes only: their time a row is mostly launches)
    cost.observe(0.0141, 300)  # 14.1 ms for 300 rows: 1.1 ms over the fixed part, 3.7 us a row
    cost.observe(0.500, 100)  # a slow first pass
    assert cost.estimate(10) == pytest.approx(0.013 + 0.0011 / 30)
    assert cost.estimate(3000) == pytest.approx(0.013 + 0.011)
    for _ in range(PassCost.WINDOW):
        cost.observe(0.020, 100)
    assert cost.estimate(10) == pytest.approx(0.020) and cost.estimate(1000) == pytest.approx(0.020)
    cost.observe(0.030, 1000)
    assert cost.estimate(2000) == pytest.approx(0.040)
    snap = cost.snapshot()
    assert snap["measured"] == PassCost.WINDOW and snap["pass_ms"] == 20.0 and snap["rows_most"] == 1000


def test_measured_rates_draft_where_the_cost_model_would_not(plain):
    """Off the fused steps the policy's cost model picks k; where it gives 0 but both modes are measured with
    drafting ahead (planted: plain 1 ms a token, drafting 8 tokens in 3.5 ms), the step drafts its best k of at
    least 1. Tokens stay plain decoding's."""
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    spec = llm.engine.speculator
    _plant_rates(spec, 1, 0.001, 8, 0.0035, 8.0)
    spec.policy.choose_k = lambda batch, running, least=0: 2 if least else 0  # (a cost model that has k = 0)
    spec._prompt_passes = lambda prompts: {seq for seq, _ in prompts}
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    got, want = (m.generate([PROMPTS[0]], sp)[0].outputs[0].token_ids for m in (llm, plain))
    assert got == want
    assert spec.counters.num_drafts > 0
    llm.shutdown()


def test_a_steps_prompts_pay_their_rows_each_and_the_pass_together():
    """A step's prompts share one MTP pass: each must pay for its own rows, and together they pay the pass's fixed
    part. Planted: drafting saves 1 ms a token, a pass costs 10 ms + 20 us a row. One prompt of 20 rows and 8
    tokens to emit saves 8 ms: alone it does not pay the 10.4 ms; two together do (16 ms against 10.8); a prompt of
    500 rows (10 ms of rows for 8 ms saved) never pays its rows; a seeded sampled request (fixed k) runs its pass
    always, and then a 20-row prompt beside it pays only its rows."""
    from tpserve.engine.request import Sequence

    llm, _ = fused_llm({"method": "mtp", "num_speculative_tokens": 3})
    spec = llm.engine.speculator
    spec.rates.saved_per_token = lambda batch, gain=None: 1e-3
    spec.pass_cost.observe(0.010, 1)
    spec.pass_cost.observe(0.030, 1001)

    def seq(rid, seed=None):
        params = SamplingParams(temperature=0 if seed is None else 1.0, seed=seed, max_tokens=8)
        out = Sequence(rid, 0, [1, 2, 3], params, 8, frozenset())
        if seed is not None:
            out.generator = torch.Generator().manual_seed(seed)
        return out

    a, b, c, d = seq("a"), seq("b"), seq("c"), seq("d", seed=1)
    assert spec._prompt_passes([(a, 20)]) == set()
    assert spec._prompt_passes([(a, 20), (b, 20)]) == {a, b}
    assert spec._prompt_passes([(a, 20), (b, 20), (c, 500)]) == {a, b}
    assert spec._prompt_passes([(d, 20), (a, 20)]) == {d, a}
    assert spec._prompt_passes([(d, 20), (c, 500)]) == {d}
    assert (spec.pass_cost.ran, spec.pass_cost.skipped) == (7, 3)
    spec.rates.saved_per_token = lambda batch, gain=None: None  # (not measured: every pass runs)
    assert spec._prompt_passes([(c, 500)]) == {c}
    llm.shutdown()


@pytest.mark.parametrize("row_ms,drafts", [(1000.0, False), (1e-6, True)])
def test_a_prompt_pass_runs_only_where_drafting_pays_for_it(plain, row_ms, drafts):
    """Adaptive k runs a prompt's MTP pass where the time drafting is measured to save per token, over the tokens
    the request may still emit, pays for the pass's rows: planted rates (plain 1 ms a token, drafting 8 tokens in
    3.5 ms) save 0.56 ms a token, so a pass of 1 s does not pay (the request decodes plainly and the speculator
    steps aside) and one of 1 ns does. Tokens stay plain decoding's either way."""
    llm, _ = fused_llm({"method": "mtp", "num_speculative_tokens": 3})
    spec = llm.engine.speculator
    _plant_rates(spec, 1, 0.001, 8, 0.0035, 8.0)
    spec.pass_cost.observe(row_ms / 1000, 1)
    spec.pass_cost.observe = lambda seconds, rows: None  # each decision sees the planted cost of a row's pass
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    before = spec.counters.num_drafts
    got, want = (m.generate([PROMPTS[0]], sp)[0].outputs[0].token_ids for m in (llm, plain))
    assert got == want
    assert (spec.counters.num_drafts > before) == drafts
    assert (spec.idle_since is not None) == (not drafts)  # no request able to draft: steps run without it
    llm.shutdown()


def test_prompts_admitted_over_several_steps_are_priced_at_the_batch_they_decode_in(plain):
    """A prompt's pass is priced at the batch it will decode in (running and waiting requests), not at the batch
    running when it was admitted: four prompts admitted one a step (a budget of 4 tokens) meet planted rates at
    batch 4 with plain decoding 5x faster, and no pass runs; priced at batches 1 and 2 (nothing measured there)
    the first prompts' would. Tokens stay plain decoding's."""
    llm, _ = fused_llm({"method": "mtp", "num_speculative_tokens": 3}, max_num_batched_tokens=4)
    spec = llm.engine.speculator
    _plant_rates(spec, 4, 0.001, 8, 0.01, 2.0)
    spec.pass_cost.observe(1e-6, 1)
    spec.pass_cost.observe = lambda seconds, rows: None
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]
    assert got == [o.outputs[0].token_ids for o in plain.generate(PROMPTS, sp)]
    assert spec.pass_cost.ran == 0 and spec.pass_cost.skipped >= 1  # (then none can draft: the speculator steps aside)
    llm.shutdown()


def test_a_hit_without_mtp_rows_is_computed_again_where_drafting_pays_for_it():
    """A waiting request whose prefix hit lacks MTP rows past `start` computes them again (trunk and MTP pass) where
    drafting's saving over the tokens it may emit pays for them. Planted: drafting saves 1 ms a token, an MTP pass
    costs 10 ms + 20 us a row, the trunk 100 us a row. 40 tokens to emit save 40 ms: recomputing 48 rows of a
    64-token prompt costs 10 + 1.3 + 4.8 ms and pays, 320 of a 336-token one 10 + 6.7 + 32 ms and does not. A
    seeded sampled request (fixed k) always recomputes, nothing does above the verify graphs (nothing drafts
    there), and where the trunk's cost is not measured yet the request recomputes (and so measures it). A request
    that recomputes runs its pass whatever the pay-back rule says."""
    from tpserve.engine.request import Sequence

    llm, _ = fused_llm({"method": "mtp", "num_speculative_tokens": 3})
    spec = llm.engine.speculator
    assert llm.engine.scheduler.mtp_wanted == spec._recompute_pays
    spec.rates.saved_per_token = lambda batch, gain=None: 1e-3
    spec.pass_cost.observe(0.010, 1)
    spec.pass_cost.observe(0.030, 1001)

    def seq(rid, n, seed=None):
        params = SamplingParams(temperature=0 if seed is None else 1.0, seed=seed, max_tokens=40)
        out = Sequence(rid, 0, list(range(1, n + 1)), params, 40, frozenset())
        if seed is not None:
            out.generator = torch.Generator().manual_seed(seed)
        return out

    short, long = seq("a", 64), seq("b", 336)
    assert spec._recompute_pays(short, 0, 48)  # (trunk not measured)
    spec.prefill_cost.observe(0.0, 1)
    spec.prefill_cost.observe(0.1, 1001)
    assert spec._recompute_pays(short, 0, 48) and not spec._recompute_pays(long, 16, 336)
    assert spec._recompute_pays(seq("c", 336, seed=1), 16, 336)
    limit = spec.executor.verify_graph_batch
    spec.executor.verify_graph_batch = lambda: 0
    assert not spec._recompute_pays(short, 0, 48)
    spec.executor.verify_graph_batch = limit
    long.mtp_recompute = True
    assert spec._prompt_passes([(long, 320)]) == {long}
    llm.shutdown()


def test_steps_and_passes_that_compile_a_kernel_are_not_measured(monkeypatch):
    """A Triton kernel compiled (or loaded) during a step or a prompt's MTP pass makes its time mostly the build:
    the pass costs and rates leave it out. Planted: every MTP pass meets a new kernel; prompt steps (the trunk's
    cost a row) are measured, the passes are not."""
    from tpserve.engine.warmup import WATCH

    llm, _ = fused_llm({"method": "mtp", "num_speculative_tokens": 3})
    spec = llm.engine.speculator
    draft = spec.drafter.draft

    def compiling(*a, **kw):
        monkeypatch.setattr(WATCH, "met", WATCH.met + 1)
        return draft(*a, **kw)

    spec.drafter.draft = compiling
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate(PROMPTS[:2], sp)
    assert spec.pass_cost.ran >= 1 and not spec.pass_cost.seen and spec.prefill_cost.seen
    spec.drafter.draft = draft
    llm.generate([PROMPTS[2]], sp)
    assert spec.pass_cost.seen
    llm.shutdown()


def test_steps_run_aside_measure_plain_decoding_at_their_batch():
    """Once the speculator steps aside, each plain step's whole cycle is filed as plain decoding at its batch (what
    stepping aside gives); the drafting window is untouched. Planted: plain decoding 1 ms a token against drafting
    5 ms, so a new request skips its pass and every step after its prefill runs aside: this CPU's plain steps (far
    over 1 ms) join the plain window."""
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    spec = llm.engine.speculator
    for _ in range(4):
        spec.rates.observe(1, False, 1, 0.001)
        spec.rates.observe(1, True, 2, 0.01)
    plain, drafting = spec.rates.window[(1, False)], spec.rates.window[(1, True)]
    before = list(drafting.step_seconds)
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    aside = [s for s in plain.step_seconds if s > 0.002]
    assert len(aside) >= 8 and list(drafting.step_seconds) == before
    llm.shutdown()
