"""Speculative decoding with the MTP drafter of the built-in demo model (engine/spec/speculator.py).

Greedy output with speculation equals output without it, token for token; logprobs agree within
fp32 reassociation (the verify step multiplies 1+k rows where plain decoding multiplies one, so
GEMM blocking may round differently: the bound below is ~100x the differences seen on CPU, far
below any change of token). Pools are full after finishes, stops and aborts inside accepted runs.
"""

import dataclasses
import time

import pytest
import torch

from tpserve import LLM, SamplingParams
from tpserve.config import EngineConfig
from tpserve.engine.scheduler import Scheduled
from tpserve.kernels import conv
from tpserve.model.batch import CacheTensors, ForwardBatch
from tpserve.model.kda import KdaAttention, commit

# a fixed k (drafts truncated by probability only): the adaptive mode's measured step rates depend on
# the machine's timing, and tests that need drafts pending must not depend on it
SPEC = {"method": "mtp", "num_speculative_tokens": 3, "adaptive": False}
PROMPTS = ["Count from 1 to 30: 1, 2, 3,", "The capital of France is", "def fibonacci(n):",
           "Q: What is 12 + 7?\nA:"]
LOGPROB_TOL = 5e-4


@pytest.fixture(scope="module")
def plain():
    return LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8)


@pytest.fixture(scope="module")
def spec():
    return LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8, speculative_config=SPEC)


def _pools_full(llm):
    e = llm.engine
    return e.block_pool.num_free == e.block_pool.num_blocks and e.slot_pool.num_free == e.slot_pool.num_blocks


def test_greedy_identical_tokens_and_logprobs(plain, spec):
    sp = SamplingParams(temperature=0, max_tokens=40, logprobs=2, ignore_eos=True)
    a, b = plain.generate(PROMPTS, sp), spec.generate(PROMPTS, sp)
    for x, y in zip(a, b):
        assert y.outputs[0].token_ids == x.outputs[0].token_ids
        for lx, ly in zip(x.outputs[0].logprobs, y.outputs[0].logprobs):
            assert lx.keys() == ly.keys()
            assert max(abs(lx[t].logprob - ly[t].logprob) for t in lx) < LOGPROB_TOL
    stats = spec.engine.stats()
    assert stats["spec_decode_num_drafts"] > 0
    assert 0 < stats["spec_decode_num_accepted_tokens"] <= stats["spec_decode_num_draft_tokens"]
    per_pos = stats["spec_decode_num_accepted_tokens_per_pos"]
    assert len(per_pos) == 3 and per_pos[0] >= per_pos[1] >= per_pos[2] and sum(per_pos) == \
        stats["spec_decode_num_accepted_tokens"]
    assert _pools_full(spec)


def test_stops_inside_accepted_runs_and_lengths(plain, spec):
    """A stop token, a stop string and max_tokens hit inside a run of accepted drafts: nothing after
    them is emitted and the outputs equal plain decoding's."""
    base = plain.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    stop_tok = base.token_ids[9]
    cases = [SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_tok]),
             SamplingParams(temperature=0, max_tokens=30, stop=[base.text[12:16]]),
             SamplingParams(temperature=0, max_tokens=7),
             SamplingParams(temperature=0, max_tokens=30, n=2)]
    for sp in cases:
        x, y = plain.generate(PROMPTS[:1], sp)[0], spec.generate(PROMPTS[:1], sp)[0]
        assert [o.token_ids for o in y.outputs] == [o.token_ids for o in x.outputs]
        assert [o.text for o in y.outputs] == [o.text for o in x.outputs]
        assert [o.finish_reason for o in y.outputs] == [o.finish_reason for o in x.outputs]
    assert _pools_full(spec)
    assert spec.engine.speculator.policy.snapshot()["requests_tracked"] == 0  # finished ones forgotten


def test_abort_mid_speculation_frees_everything(spec):
    eng = spec.engine
    sp = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    ids = spec.get_tokenizer().encode(PROMPTS[0])
    for i in range(3):
        eng.add_request(f"abort-{i}", ids, sp)
    for _ in range(6):
        eng.step()
    assert any(s.drafts for s in eng.scheduler.running)
    for i in range(3):
        eng.abort(f"abort-{i}")
    assert not eng.has_unfinished() and _pools_full(spec)


def test_sampling_with_seed_is_reproducible(spec):
    sp = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=30, seed=11, ignore_eos=True)
    a = spec.generate(PROMPTS[:2], sp)
    b = spec.generate(PROMPTS[:2], sp)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert all(len(o.outputs[0].token_ids) == 30 for o in a)


def test_preemption_during_speculation(spec):
    """Few blocks: sequences are preempted with drafts pending and recomputed; greedy tokens stay."""
    from tpserve.model.cache import bytes_per_block, bytes_per_slot
    from tpserve.model.mtp import mtp_config

    cfg = mtp_config(spec.engine.model_config)
    state = 4 * bytes_per_slot(cfg, 1, torch.float32)  # four prefix-cache state checkpoints
    budget = 4 * bytes_per_slot(cfg, 1, torch.float32) + 10 * bytes_per_block(cfg, 16, torch.float32) + state
    small = LLM(device="cpu", kv_cache_memory=budget, block_size=16, speculative_config=SPEC, max_num_seqs=4,
                prefix_state_memory=state)
    assert small.engine.block_pool.num_blocks == 10
    ref = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8)
    sp = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    a = small.generate(PROMPTS, sp)
    assert small.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in ref.generate(PROMPTS, sp)]
    assert _pools_full(small)


def test_metrics_offline(spec):
    names = {m.name: m for m in spec.get_metrics()}
    assert names["tpserve:spec_decode_num_drafts"].kind == "counter"
    assert names["tpserve:spec_decode_num_accepted_tokens_per_pos"].kind == "vector"
    assert len(names["tpserve:spec_decode_num_accepted_tokens_per_pos"].values) == 3


def test_checkpoint_without_mtp_is_a_clear_error(tiny):
    with pytest.raises(ValueError, match="MTP"):
        LLM(str(tiny("default")), device="cpu", skip_tokenizer_init=True, speculative_config=SPEC)


@pytest.mark.parametrize("raw, field", [('{"method": "eagle"}', "method"), ('{"num_speculative_tokens": 0}',
                                        "num_speculative_tokens"), ('{"truncate_threshold": 2}', "truncate_threshold"),
                                       ('{"k": 2}', "unknown key"), ("[1]", "JSON object"), ("{", "not valid JSON")])
def test_bad_speculative_config(raw, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(speculative_config=raw)


# ---------------------------------------------------------------- KDA state
def _kda_layer(seed=0):
    from tpserve.model.config import ModelConfig
    from tpserve.model.layers import ShardContext
    from tpserve.model.tiny import randomize_

    cfg = ModelConfig(hidden_size=32, linear_num_heads=2, linear_head_dim=8, num_hidden_layers=1,
                      layer_types=("linear_attention",), mlp_layer_types=("dense",), indexer_types=("full",))
    layer = KdaAttention(ShardContext.single(torch.float32), cfg, 0, "torch")
    randomize_(layer, seed=seed)
    return cfg, layer


def _cache(cfg, slots):
    c = CacheTensors(block_size=16)
    c.kda_state[0] = torch.randn(slots, cfg.linear_num_heads, 8, 8, generator=torch.Generator().manual_seed(1))
    c.conv_state[0] = torch.randn(slots, 3 * 16, cfg.linear_conv_kernel_dim - 1,
                                  generator=torch.Generator().manual_seed(2))
    return c


def _batch(lens, slots):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    t = cu[-1]
    return ForwardBatch(input_ids=torch.zeros(t, dtype=torch.long), positions=torch.arange(t), cu_seqlens=cu,
                        context_lens=[5] * len(lens), slots=torch.tensor(slots), block_tables=torch.zeros(len(lens), 1,
                        dtype=torch.long), slot_mapping=torch.zeros(t, dtype=torch.long),
                        logits_indices=torch.arange(t), decode_seqs=len(lens))


@pytest.mark.parametrize("accepted", [0, 1, 3])
def test_kda_state_after_rejection_equals_never_drafting(accepted):
    """Verify 1+3 rows of slot 1 next to a plain decode of slot 0, then commit 1+accepted of them: the
    slot's recurrent state and conv window are bit-identical to running the same inputs through the
    layer's one-token decode path, token by token (a run that never drafted)."""
    cfg, layer = _kda_layer()
    h, dh = layer.heads, layer.head_dim
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(3))
    spec_cache, plain_cache = _cache(cfg, 3), _cache(cfg, 3)
    layer(x, _batch([1, 4], [0, 1]), spec_cache)
    assert torch.equal(spec_cache.kda_state[0][1], plain_cache.kda_state[0][1])  # read, not written
    assert torch.equal(spec_cache.conv_state[0][1], plain_cache.conv_state[0][1])
    vi = spec_cache.verify[0]
    raw, g, beta, q_v = vi.raw.clone(), vi.g.clone(), vi.beta.clone(), vi.q.clone()
    commit(spec_cache, [1 + accepted])
    assert not spec_cache.verify
    one = _batch([1], [1])
    for j in range(1 + accepted):
        mixed = layer._conv(raw[j:j + 1], one, plain_cache.conv_state[0])
        q, k, v = (y.reshape(1, h, dh) for y in mixed.split(h * dh, dim=-1))
        assert torch.equal(q, q_v[j:j + 1])  # the verify row's conv output is the decode step's
        layer._torch(q, k, v, g[j:j + 1], beta[j:j + 1], one, plain_cache.kda_state[0])
    for key in ("kda_state", "conv_state"):
        assert torch.equal(getattr(spec_cache, key)[0][1], getattr(plain_cache, key)[0][1])
        assert torch.equal(getattr(spec_cache, key)[0][2], getattr(plain_cache, key)[0][2])  # untouched slot


def test_conv_verify_rows_equal_decode_steps():
    g = torch.Generator().manual_seed(0)
    x, state, w = torch.randn(5, 12, generator=g), torch.randn(12, 3, generator=g), torch.randn(12, 4, generator=g)
    rows, s = [], state[None]
    for j in range(5):
        out, s = conv.causal_conv_step(x[j:j + 1], s, w)
        rows.append(out)
    assert torch.equal(conv.causal_conv_verify(x, state, w), torch.cat(rows))


def test_scheduled_counts_drafts():
    from tpserve.engine.request import Sequence

    seq = Sequence("r", 0, [1, 2, 3], SamplingParams(), 10, frozenset())
    seq.num_computed, seq.drafts = 2, [7, 8]
    s = Scheduled(seq, 3, decode=True)
    assert s.num_drafts == 2 and s.completes and [seq.token_at(p) for p in range(5)] == [1, 2, 3, 7, 8]
    assert dataclasses.replace(s, num_tokens=1).num_drafts == 0


def test_server_metrics_export_spec_counters(spec):
    from tpserve.server.metrics import ServerMetrics

    spec.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=12))
    text = ServerMetrics(spec.engine.stats).render().decode()
    stats = spec.engine.stats()
    assert f"tpserve:spec_decode_num_drafts_total {float(stats['spec_decode_num_drafts'])}" in text
    assert f"tpserve:spec_decode_num_accepted_tokens_total {float(stats['spec_decode_num_accepted_tokens'])}" in text
    assert 'tpserve:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in text


def test_kda_commit_of_several_verify_sequences():
    """Two verify sequences of different lengths next to a decode; commits of different counts (one of
    them 0: a finished sequence) advance exactly their own slots, as one-token decodes would."""
    cfg, layer = _kda_layer(seed=4)
    h, dh = layer.heads, layer.head_dim
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(5))
    spec_cache, plain_cache = _cache(cfg, 4), _cache(cfg, 4)
    layer(x, _batch([1, 4, 3], [0, 2, 1]), spec_cache)
    vi = spec_cache.verify[0]
    raw, g, beta = vi.raw.clone(), vi.g.clone(), vi.beta.clone()
    counts = [3, 0]
    commit(spec_cache, counts)
    for start, slot, n in ((0, 2, counts[0]), (4, 1, counts[1])):
        one = _batch([1], [slot])
        for j in range(start, start + n):
            mixed = layer._conv(raw[j:j + 1], one, plain_cache.conv_state[0])
            q, k, v = (y.reshape(1, h, dh) for y in mixed.split(h * dh, dim=-1))
            layer._torch(q, k, v, g[j:j + 1], beta[j:j + 1], one, plain_cache.kda_state[0])
    for key in ("kda_state", "conv_state"):
        for slot in (1, 2, 3):
            assert torch.equal(getattr(spec_cache, key)[0][slot], getattr(plain_cache, key)[0][slot])


def test_k_zero_for_long_stops_the_drafter(plain):
    """When the policy keeps choosing k = 0 (large batches), the MTP catch-up stops after IDLE_STEPS steps:
    those steps then cost what plain decoding costs; tokens stay plain decoding's."""
    from tpserve.engine.spec.speculator import IDLE_STEPS

    llm = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8, speculative_config=SPEC)
    eng = llm.engine
    eng.speculator.policy.choose_k = lambda num_seqs, keys: 0
    calls = []
    real = eng.executor.draft
    eng.executor.draft = lambda *a: calls.append(1) or real(*a)
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    out = llm.generate(PROMPTS[:2], sp)
    assert len(calls) == IDLE_STEPS  # a catch-up in each of the first IDLE_STEPS steps with k = 0, then none
    assert eng.stats()["spec_decode_num_drafts"] == 0
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in plain.generate(PROMPTS[:2], sp)]


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


def test_rate_window_sums_as_when_every_step_kept_its_capped_time():
    """_RateWindow keeps no capped time per step (all steps in the window are capped at the current cap): its
    sums, cap and rate equal, bit for bit, those of a window that stores each step's capped time and updates it
    at every recompute (what it did before), through outliers, recomputes asked for and the window's turnover."""
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
    llm = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
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
    host waits for the tokens) takes 300 ms longer (a CPU step of the demo model takes a few ms)."""
    llm = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
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
    llm = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
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


def test_mtp_draft_matches_plain_torch_recipe(spec):
    """The engine's MTP forward (cache, paged latent, decode/prefill kernels) against train/model.py's
    plain-torch MTP step (x = eh_proj(cat[enorm(embed(t+1)), hnorm(h)]) -> block -> shared_head.norm ->
    lm_head) on the same checkpoint: depth-1 logits at every prompt position."""
    from tpserve.engine.runner import StepPlan
    from tpserve.train.model import TrainModel, load_checkpoint_

    eng = spec.engine
    runner = eng.executor.runner
    ids = spec.get_tokenizer().encode(PROMPTS[3] + " 19\nQ: What is 3 + 4?\nA:")
    n = len(ids)
    blocks, slot = eng.block_pool.allocate(-(-n // 16)), eng.slot_pool.allocate(1)[0]
    try:
        runner.execute(StepPlan(ids, list(range(n)), [0, n], [0], [slot], [blocks], [n - 1], [slot]))
        drafted = runner.draft(StepPlan(ids[1:], list(range(n - 1)), [0, n - 1], [0], [slot], [blocks],
                                        list(range(n - 1)), []), list(range(n - 1)), True)
        got = drafted.logits
    finally:
        eng.block_pool.free(blocks)
        eng.slot_pool.free([slot])
    ref_model = TrainModel(eng.model_config)
    load_checkpoint_(ref_model, eng.model_dir)
    with torch.no_grad():
        out = ref_model(torch.tensor([ids]))
        _, ref = ref_model.mtp_step(out.hidden[:, :n - 1], torch.tensor([ids[1:]]))
    ref = ref[0].float()
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    # the greedy draws that go to the host: the argmax and its softmax probability
    assert torch.equal(drafted.greedy[0].long(), got.argmax(-1))
    assert torch.allclose(drafted.greedy[1], got.softmax(-1).max(-1).values.double(), rtol=1e-5, atol=1e-7)
    bound = 1e-4 * ref.abs().max().item()  # fp32, two code paths (paged cache, fused forms vs plain torch)
    assert (got - ref).abs().max().item() < bound, ((got - ref).abs().max().item(), bound)


def _padded_graph_run(plain, mode: str):
    """Greedy generations through the fixed-shape graph steps run eagerly on CPU (--draft-graph `mode`):
    -> (graph kinds used, each step's drafts and their probabilities, verify steps that padded sequences of
    different lengths)."""
    import collections

    llm = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8, speculative_config=SPEC)
    runner = llm.engine.executor.runner
    runner.setup_graphs(8, None, enforce_eager=False, pad_on_cpu=True, num_speculative_tokens=3, draft_graph=mode)
    graphs = runner.graphs
    assert graphs.spec_buckets == [1, 2, 4, 8] and graphs.max_q == 4
    assert graphs.chain_depths == (0 if mode == "depth" else 3) and graphs.fused == (mode == "fused")
    used, replay = collections.Counter(), graphs._replay
    mixed = []

    def spy(key):
        used[key[0], key[2] > 1] += 1
        return replay(key)

    run = graphs.run

    def spy_run(plan, key, prev=None):
        lens = {b - a for a, b in zip(plan.cu_seqlens, plan.cu_seqlens[1:])}
        if key[2] > 1 and len(lens) > 1:
            mixed.append(sorted(lens))
        return run(plan, key, prev)

    spec_step = graphs.spec_step

    def spy_spec_step(plan, key, *rest):
        lens = {b - a for a, b in zip(plan.cu_seqlens, plan.cu_seqlens[1:])}
        if len(lens) > 1 or max(lens) < graphs.max_q:
            mixed.append(sorted(lens))
        return spec_step(plan, key, *rest)

    graphs._replay, graphs.run, graphs.spec_step = spy, spy_run, spy_spec_step
    speculator, drafts = llm.engine.speculator, []
    propose = speculator.propose

    def spy_propose(*a, **kw):  # every step's drafts and the drafter's probability of each
        propose(*a, **kw)
        drafts.append([(s.request_id, list(s.drafts), list(s.draft_sure)) for s in llm.engine.scheduler.running])

    speculator.propose = spy_propose
    verify_fused = speculator.verify_fused

    def spy_verify_fused(*a, **kw):
        verify_fused(*a, **kw)
        drafts.append([(s.request_id, list(s.drafts), list(s.draft_sure)) for s in llm.engine.scheduler.running])

    speculator.verify_fused = spy_verify_fused
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = PROMPTS + ["1, 2, 3, 4,", "{\"name\": \"a\", \"value\":"]
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, sp)]
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    assert got == want
    # a request with one token left after its prefill has no room for drafts: a plain one-row step
    # (whether the run above had one depends on how confident the model's drafts are)
    last = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:1], last)] == \
        [o.outputs[0].token_ids for o in plain.generate(PROMPTS[:1], last)]
    assert _pools_full(llm)
    return used, drafts, mixed


def test_padded_graph_steps_give_identical_tokens(plain):
    """Verify, commit and MTP draft steps through the fixed-shape graph path (each sequence padded to
    1+k rows, the batch to a bucket; what CUDA graphs replay), run eagerly on CPU: greedy tokens
    identical to plain decoding, every kind of graph step used, pools full afterwards. The draft chain
    (catch-up and chained depths in one graph step, drafts fed forward on the device) drafts exactly
    what one graph step per depth drafts, with the same probabilities (to rounding)."""
    by_depth, by_depth_drafts, mixed = _padded_graph_run(plain, "depth")
    for kind in (("main", True), ("commit", True), ("draft", False), ("draft", True), ("main", False)):
        assert by_depth[kind], f"no {kind} graph step ran ({dict(by_depth)})"
    assert not by_depth["chain", False] and not by_depth["chain", True] and not by_depth["spec", True]
    assert mixed, "no verify step padded sequences of different lengths"
    chained, chained_drafts, _ = _padded_graph_run(plain, "chain")
    assert chained["chain", True] and not chained["spec", True], dict(chained)
    assert chained["draft", False] < by_depth["draft", False]  # chained depths no longer run one by one
    # the same shapes and forms: the same drafts, step by step, with the same probabilities up to rounding (a
    # padding row's hidden differs between the two, so an expert's fp32 GEMM may take another M: ~1e-7 seen;
    # a draft one position off moves them by ~1e-4)
    assert [[(r, d) for r, d, _ in step] for step in chained_drafts] == \
        [[(r, d) for r, d, _ in step] for step in by_depth_drafts]
    assert sum(len(d) for step in chained_drafts for _, d, _ in step) > 100
    gap = max(abs(x - y) for s1, s2 in zip(chained_drafts, by_depth_drafts) for a, b in zip(s1, s2)
              for x, y in zip(a[2], b[2]))
    assert gap < 1e-5, gap


def test_fused_spec_steps_give_identical_tokens_and_drafts(plain):
    """--draft-graph fused through the padded graph steps on CPU: greedy tokens identical to plain decoding;
    decode steps where every sequence verifies drafts run the spec graph (acceptance, KDA commit, catch-up over
    the verify rows and the chain, on the device), sequences with fewer than k drafts (truncated) padded to k;
    the same drafts as the chain, step by step, with the same probabilities up to rounding (the catch-up
    multiplies 1+k rows per sequence where the chain's multiplies the accepted ones)."""
    fused, fused_drafts, padded = _padded_graph_run(plain, "fused")
    assert fused["spec", True] > 10 and padded, (dict(fused), padded)
    commits = fused["commit", True]
    chained, chained_drafts, _ = _padded_graph_run(plain, "chain")
    assert commits < chained["commit", True]  # a fused step commits inside its spec graph
    assert [[(r, d) for r, d, _ in step] for step in fused_drafts] == \
        [[(r, d) for r, d, _ in step] for step in chained_drafts]
    gap = max(abs(x - y) for s1, s2 in zip(fused_drafts, chained_drafts) for a, b in zip(s1, s2)
              for x, y in zip(a[2], b[2]))
    assert gap < 1e-5, gap


def test_greedy_with_penalties_walks_position_by_position(plain, spec):
    """A repetition penalty makes each verified row's choice depend on the tokens accepted before it
    (the per-position walk, not the one-shot argmax): tokens still equal plain decoding's."""
    sp = SamplingParams(temperature=0, max_tokens=30, repetition_penalty=1.3, ignore_eos=True)
    a, b = plain.generate(PROMPTS, sp), spec.generate(PROMPTS, sp)
    assert [o.outputs[0].token_ids for o in b] == [o.outputs[0].token_ids for o in a]
    assert _pools_full(spec)


@pytest.mark.parametrize("adaptive", [True, False])
def test_only_decode_steps_train_the_cost_model_and_rates(adaptive):
    """Steps that hold prefill chunks are not decode costs: neither the step-cost fit, the draft-cost
    fit nor the measured rates see them (a prefill step emits few tokens in a long time and made plain
    decoding look slow; the drafting pass after it runs the MTP layer over the whole prompt, and one
    such observation made the adaptive mode stop drafting for a whole run on the CPU). A fixed k uses
    none of them: nothing is observed."""
    spec = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
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


def test_adaptive_mode_gives_plain_tokens(plain):
    """The default adaptive mode (k per step from measured rates and step costs, so timing-dependent):
    whatever k it picks, greedy tokens are plain decoding's and every pool is free afterwards."""
    llm = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]
    assert got == [o.outputs[0].token_ids for o in plain.generate(PROMPTS, sp)]
    assert _pools_full(llm)


def test_adaptive_does_not_draft_above_the_verify_graphs(plain):
    """With CUDA graphs for plain decode steps up to any batch but for verify / draft steps only up
    to SPEC_MAX_BATCH, a drafting step above that runs eagerly: the adaptive mode drafts nothing there
    (exploration steps included), and the MTP layer does not run at all (no eager catch-up pass per step:
    the three prompts are prefilled in one step, already above the limit); a batch within the limit
    still drafts; once the batch is found above the limit, the steps until a request is added skip the
    speculator. (The limit is stood in for on the CPU, where nothing is captured.)"""
    llm = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    eng = llm.engine
    assert eng.executor.verify_graph_batch() is None  # CPU: no step replays a graph
    eng.executor.verify_graph_batch = lambda: 2
    mtp_passes, draft = [], eng.executor.draft
    eng.executor.draft = lambda *a, **kw: mtp_passes.append(1) or draft(*a, **kw)
    proposed, propose = [], eng.speculator.propose
    eng.speculator.propose = lambda *a, **kw: proposed.append(1) or propose(*a, **kw)
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:3], sp)]
    assert eng.stats().get("spec_decode_num_drafts", 0) == 0 and not mtp_passes
    # the step that found the batch above the limit asked the speculator; the 23 after it ran as plain steps
    # (Speculator.idle: no request added since), without a verify / propose pass over the sequences
    assert len(proposed) == 1 and eng.speculator.idle_steps >= 23
    assert eng.num_overlapped > 0  # async scheduling runs the idle steps (engine/overlap.py)
    assert got == [o.outputs[0].token_ids for o in plain.generate(PROMPTS[:3], sp)]
    llm.generate(PROMPTS[:1], sp)
    assert eng.stats()["spec_decode_num_drafts"] > 0  # batch 1: exploration steps draft at least
    assert _pools_full(llm)


def test_adaptive_k_zero_for_long_runs_plain_steps_with_async_scheduling(plain):
    """When the adaptive policy chooses k = 0 for more than IDLE_STEPS steps in a row (large batches), the MTP
    stops for the running requests and the steps until a request is added skip the speculator and run as an
    engine without speculation runs them: async scheduling on (an H200 at batch 64 measured the adaptive engine
    0.914x of no speculation while such steps went through the speculator). The policy's choice is stood in
    for (its cost model picks k = 0 at large batches on a GPU)."""
    from tpserve.engine.spec.speculator import IDLE_STEPS

    llm = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    eng = llm.engine
    sp_ = eng.speculator
    sp_.policy.choose_k = lambda batch, running: 0
    sp_.rates.override = lambda batch, k: k
    proposed, propose = [], sp_.propose
    sp_.propose = lambda *a, **kw: proposed.append(1) or propose(*a, **kw)
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:3], sp)]
    assert got == [o.outputs[0].token_ids for o in plain.generate(PROMPTS[:3], sp)]
    assert eng.stats().get("spec_decode_num_drafts", 0) == 0
    # the first IDLE_STEPS + 1 steps (the prefill's included) asked the speculator; the rest ran as plain steps
    assert len(proposed) == IDLE_STEPS + 1 and sp_.idle_since == eng.num_added and not sp_.idle_above_graphs
    assert eng.num_overlapped > 0  # async scheduling ran them (engine/overlap.py)
    del sp_.policy.choose_k, sp_.rates.override
    llm.generate(PROMPTS[:1], sp)  # a request added: the speculator is asked again, and batch 1 drafts
    assert len(proposed) > IDLE_STEPS + 1 and eng.stats()["spec_decode_num_drafts"] > 0
    assert _pools_full(llm)


def _fused_llm(spec=SPEC, **kw):
    """An engine whose steps go through the padded graph path with fused speculative steps, run eagerly."""
    llm = LLM(device="cpu", block_size=16, speculative_config=spec, **{"kv_cache_memory": "16MiB",
                                                                        "max_num_seqs": 8, **kw})
    seqs = llm.engine.ecfg.max_num_seqs
    llm.engine.executor.runner.setup_graphs(seqs, None, enforce_eager=False, pad_on_cpu=True,
                                            num_speculative_tokens=3, draft_graph="fused")
    fused = []
    spec_step = llm.engine.executor.runner.graphs.spec_step
    llm.engine.executor.runner.graphs.spec_step = lambda plan, key, *rest: fused.append(key) or spec_step(plan, key,
                                                                                                           *rest)
    return llm, fused


def test_fused_steps_stop_abort_and_preempt_like_plain(plain):
    """Fused steps (acceptance, commit and drafts on the device, the host walking the copied argmaxes): a stop
    token, a stop string, max_tokens and n=2 inside accepted runs give plain decoding's outputs; an abort with
    drafts pending and preemption with few blocks (the fused step reserves blocks for its chain first) free
    every block and slot, and preempted requests keep plain decoding's tokens."""
    llm, fused = _fused_llm()
    base = plain.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    cases = [SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[base.token_ids[9]]),
             SamplingParams(temperature=0, max_tokens=30, stop=[base.text[12:16]]),
             SamplingParams(temperature=0, max_tokens=7),
             SamplingParams(temperature=0, max_tokens=30, n=2)]
    for sp in cases:
        before = len(fused)
        x, y = plain.generate(PROMPTS[:1], sp)[0], llm.generate(PROMPTS[:1], sp)[0]
        assert [o.token_ids for o in y.outputs] == [o.token_ids for o in x.outputs]
        assert [o.text for o in y.outputs] == [o.text for o in x.outputs]
        assert [o.finish_reason for o in y.outputs] == [o.finish_reason for o in x.outputs]
        assert len(fused) > before, sp  # fused steps ran
    assert _pools_full(llm)
    eng = llm.engine
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    for i in range(3):
        eng.add_request(f"abort-{i}", ids, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    before = len(fused)
    for _ in range(40):
        if len(fused) >= before + 3:
            break
        eng.step()
    assert len(fused) >= before + 3 and any(s.drafts for s in eng.scheduler.running)
    for i in range(3):
        eng.abort(f"abort-{i}")
    assert not eng.has_unfinished() and _pools_full(llm)

    from tpserve.model.cache import bytes_per_block, bytes_per_slot
    from tpserve.model.mtp import mtp_config

    cfg = mtp_config(eng.model_config)
    budget = 4 * bytes_per_slot(cfg, 1, torch.float32) + 12 * bytes_per_block(cfg, 16, torch.float32)
    small, fused = _fused_llm(kv_cache_memory=budget, max_num_seqs=4)
    sp = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    got = small.generate(PROMPTS, sp)
    assert small.engine.scheduler.num_preemptions > 0 and fused
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain.generate(PROMPTS, sp)]
    assert _pools_full(small)


@pytest.mark.parametrize("fused", [True, False])
def test_adaptive_k_is_all_or_nothing_where_steps_are_padded(fused):
    """A fused step verifies and chains num_speculative_tokens rows whatever k is: where the next step can be
    fused, a policy's k between 0 and the largest becomes the largest (more tokens at the same cost); on the
    unpadded path it stays as chosen."""
    spec = {"method": "mtp", "num_speculative_tokens": 3, "truncate_threshold": 0.0}
    if fused:
        llm, steps = _fused_llm(spec)
    else:
        llm, steps = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
                         speculative_config=spec), None
    sp_ = llm.engine.speculator
    sp_.policy.choose_k = lambda num_seqs, keys: 1
    sp_.rates.override = lambda batch, k: k
    chosen, propose = [], sp_._next_k
    sp_._next_k = lambda *a, **kw: chosen.append(propose(*a, **kw)) or chosen[-1]
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    ks = {k for k in chosen if k is not None}
    assert ks == {3} if fused else ks == {1, 3}  # (3: the exploring steps, every 4th)
    assert steps is None or steps
    llm.shutdown()


def test_fused_steps_skip_checks_that_fusable_made():
    """After a fused step `_next_k` skips checks `fusable` made before it: that every sequence decodes, and for
    whether the next step can be fused too, each one's argmax-only tokens (min_tokens can only become met, the
    rest is fixed per request) and the executor's limit (read by `fusable` this step). On every fused step of
    requests with min_tokens, logprobs and mixed batches, the full checks agree."""
    from tpserve.engine.request import Status

    llm, fused = _fused_llm({"method": "mtp", "num_speculative_tokens": 3})
    sp_ = llm.engine.speculator
    sp_.policy.choose_k = lambda num_seqs, keys: 3  # (drafts on every step: fused steps throughout)
    sp_.rates.override = lambda batch, k: k
    checked = []
    next_k = sp_._next_k

    def checking_next_k(scheduled, *a, fused=False):
        if fused:
            batch = len(llm.engine.scheduler.running)
            running = [s.seq for s in scheduled if s.seq.status is Status.RUNNING]
            assert all(s.decode for s in scheduled)
            assert (batch <= sp_.fused_limit) == sp_._padded(running, batch)
            checked.append(batch)
        return next_k(scheduled, *a, fused=fused)
    sp_._next_k = checking_next_k
    cases = [[SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, min_tokens=m) for m in (0, 6, 13)],
             [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)],
             [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)]]
    for params in cases:
        llm.generate(PROMPTS[:len(params)], params)
    assert len(checked) > 10 and max(checked) > 1 and fused
    del sp_.policy.choose_k, sp_.rates.override
    assert _pools_full(llm)
    llm.shutdown()


def test_set_adaptive_switches_a_running_engine(plain):
    """Speculator.set_adaptive (bench/spec_ab.py --one-engine): an engine built adaptive runs as fixed k and back;
    greedy tokens equal plain decoding in both modes; the fixed mode drafts k = num_speculative_tokens on every
    drafting step and observes nothing; what the adaptive mode learned is kept."""
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in plain.generate(PROMPTS[:2], sp)]
    llm = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    try:
        speculator = llm.engine.speculator
        assert speculator.spec.adaptive and speculator.policy.adaptive
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], sp)] == want
        learned = speculator.policy.snapshot()
        speculator.set_adaptive(False)
        assert not speculator.spec.adaptive and not speculator.policy.adaptive
        ks = []
        propose = speculator.propose

        def counted(*a, **kw):
            propose(*a, **kw)
            if llm.engine.scheduler.running:
                ks.append(speculator.last_k)
        speculator.propose = counted
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], sp)] == want
        assert ks and set(ks) == {3}
        after = speculator.policy.snapshot()
        assert after["step_cost"] == learned["step_cost"] and after["draft_cost"] == learned["draft_cost"]
        speculator.set_adaptive(True)
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], sp)] == want
        assert _pools_full(llm)
    finally:
        llm.shutdown()


def test_set_adaptive_with_a_smaller_fixed_k():
    """set_adaptive(False, fixed_k) (bench/spec_sides.py): unseeded sampled requests then draft fixed_k on every
    drafting step; the adaptive mode takes no fixed_k; fixed_k outside 1..num_speculative_tokens is refused."""
    llm = LLM(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    try:
        speculator = llm.engine.speculator
        for bad in (0, 4, 1.5, True):
            with pytest.raises(ValueError, match="fixed_k"):
                speculator.set_adaptive(False, bad)
        with pytest.raises(ValueError, match="fixed_k: only with adaptive off"):
            speculator.set_adaptive(True, 2)
        speculator.set_adaptive(False, 2)
        ks, drafted = [], []
        propose = speculator.propose

        def counted(*a, **kw):
            propose(*a, **kw)
            if llm.engine.scheduler.running:
                ks.append(speculator.last_k)
                drafted.append(max(len(s.drafts) for s in llm.engine.scheduler.running))
        speculator.propose = counted
        out = llm.generate(PROMPTS[:2], SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True))
        assert all(len(o.outputs[0].token_ids) == 16 for o in out)
        assert ks and set(ks) == {2} and max(drafted) == 2
        speculator.set_adaptive(False)
        assert speculator.policy.fixed_k == 3
        assert _pools_full(llm)
    finally:
        llm.shutdown()


def test_fused_steps_file_their_measured_rates_while_the_next_step_runs(plain):
    """Adaptive k with fused steps: a fused step's observation (MeasuredRates.observe) is filed inside the next
    fused step's spec_step, after its launch and before its copy (Speculator.while_waiting: on a GPU the host's
    bookkeeping overlaps the device's work), or by the next step that observes; the last one stays pending until
    while_waiting files it; greedy tokens stay plain decoding's."""
    llm, fused = _fused_llm({"method": "mtp", "num_speculative_tokens": 3})
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


@pytest.mark.parametrize("fused_ms", [3.5, 1.5])
def test_adaptive_ends_a_request_plainly_where_plain_steps_are_shorter(plain, fused_ms):
    """Where the next step would be fused (k is 0 or the largest) and the request may emit at most `left` more
    tokens, adaptive k runs plain steps when `left` of them measure shorter than one fused step, which costs its
    rows and depths however few tokens it may keep: with plain steps of 1 ms, fused steps of 3.5 ms end a request
    plainly from 3 tokens before its end, fused steps of 1.5 ms never. Tokens stay plain decoding's."""
    from tpserve.engine.spec.rates import MeasuredRates

    llm, _ = _fused_llm({"method": "mtp", "num_speculative_tokens": 3})
    spec = llm.engine.speculator
    spec.rates = rates = MeasuredRates()
    for _ in range(8):  # drafting over twice plain's rate either way: a plain probe only every 1024th step
        rates.observe(1, False, 1, 0.001)
        rates.observe(1, True, 8, fused_ms / 1000)
    rates.observe = lambda *a: None  # (this CPU's own step times would move them)
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
