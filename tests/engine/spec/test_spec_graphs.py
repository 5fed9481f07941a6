"""Speculative steps through the padded graph path, run eagerly on CPU: verify / commit / draft graph steps,
the draft chain and fused steps (acceptance, commit and drafts on the device) against plain decoding."""

import pytest
import torch
from spec_cases import PROMPTS, SPEC, Model, fused_llm, pools_full

from tpserve import LLM, SamplingParams


PADDED_PROMPTS = PROMPTS + ["1, 2, 3, 4,", "{\"name\": \"a\", \"value\":"]
PADDED_PARAMS = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def padded_run(plain):
    """run(mode): _padded_graph_run with --draft-graph `mode`, each mode run once for the module (its results are
    only read), against plain decoding's tokens computed once."""
    want = [o.outputs[0].token_ids for o in plain.generate(PADDED_PROMPTS, PADDED_PARAMS)]
    runs = {}

    def run(mode: str):
        if mode not in runs:
            runs[mode] = _padded_graph_run(plain, mode, want)
        return runs[mode]
    return run


def _padded_graph_run(plain, mode: str, want: list[list[int]], before=None, **llm_kw):
    """Greedy generations of PADDED_PROMPTS through the fixed-shape graph steps run eagerly on CPU (--draft-graph
    `mode`), `want` plain decoding's tokens: -> (graph kinds used, each step's drafts and their probabilities,
    verify steps that padded sequences of different lengths). before(llm): run before generating."""
    import collections

    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8, speculative_config=SPEC,
              **llm_kw)
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
    if before is not None:
        before(llm)
    got = [o.outputs[0].token_ids for o in llm.generate(PADDED_PROMPTS, PADDED_PARAMS)]
    assert got == want
    # a request with one token left after its prefill has no room for drafts: a plain one-row step
    # (whether the run above had one depends on how confident the model's drafts are)
    last = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:1], last)] == \
        [o.outputs[0].token_ids for o in plain.generate(PROMPTS[:1], last)]
    assert pools_full(llm)
    return used, drafts, mixed


def test_padded_graph_steps_give_identical_tokens(padded_run):
    """Verify, commit and MTP draft steps through the fixed-shape graph path (each sequence padded to
    1+k rows, the batch to a bucket; what CUDA graphs replay), run eagerly on CPU: greedy tokens
    identical to plain decoding, every kind of graph step used, pools full afterwards. The draft chain
    (catch-up and chained depths in one graph step, drafts fed forward on the device) drafts exactly
    what one graph step per depth drafts, with the same probabilities (to rounding)."""
    by_depth, by_depth_drafts, mixed = padded_run("depth")
    for kind in (("main", True), ("commit", True), ("draft", False), ("draft", True), ("main", False)):
        assert by_depth[kind], f"no {kind} graph step ran ({dict(by_depth)})"
    assert not by_depth["chain", False] and not by_depth["chain", True] and not by_depth["spec", True]
    assert mixed, "no verify step padded sequences of different lengths"
    chained, chained_drafts, _ = padded_run("chain")
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


def test_fused_spec_steps_give_identical_tokens_and_drafts(padded_run):
    """--draft-graph fused through the padded graph steps on CPU: greedy tokens identical to plain decoding;
    decode steps where every sequence verifies drafts run the spec graph (acceptance, KDA commit, catch-up over
    the verify rows and the chain, on the device), sequences with fewer than k drafts (truncated) padded to k;
    the same drafts as the chain, step by step, with the same probabilities up to rounding (the catch-up
    multiplies 1+k rows per sequence where the chain's multiplies the accepted ones)."""
    fused, fused_drafts, padded = padded_run("fused")
    assert fused["spec", True] > 10 and padded, (dict(fused), padded)
    commits = fused["commit", True]
    chained, chained_drafts, _ = padded_run("chain")
    assert commits < chained["commit", True]  # a fused step commits inside its spec graph
    assert [[(r, d) for r, d, _ in step] for step in fused_drafts] == \
        [[(r, d) for r, d, _ in step] for step in chained_drafts]
    gap = max(abs(x - y) for s1, s2 in zip(fused_drafts, chained_drafts) for a, b in zip(s1, s2)
              for x, y in zip(a[2], b[2]))
    assert gap < 1e-5, gap


def test_fused_steps_stop_abort_and_preempt_like_plain(plain):
    """Fused steps (acceptance, commit and drafts on the device, the host walking the copied argmaxes): a stop
    token, a stop string, max_tokens and n=2 inside accepted runs give plain decoding's outputs; an abort with
    drafts pending and preemption with few blocks (the fused step reserves blocks for its chain first) free
    every block and slot, and preempted requests keep plain decoding's tokens."""
    llm, fused = fused_llm()
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
    assert pools_full(llm)
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
    assert not eng.has_unfinished() and pools_full(llm)

    from tpserve.model.cache import bytes_per_block, bytes_per_slot
    from tpserve.model.mtp import mtp_config

    cfg = mtp_config(eng.model_config)
    budget = 4 * bytes_per_slot(cfg, 1, torch.float32) + 12 * bytes_per_block(cfg, 16, torch.float32)
    small, fused = fused_llm(kv_cache_memory=budget, max_num_seqs=4)
    sp = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    got = small.generate(PROMPTS, sp)
    assert small.engine.scheduler.num_preemptions > 0 and fused
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain.generate(PROMPTS, sp)]
    assert pools_full(small)


@pytest.mark.parametrize("fused", [True, False])
def test_adaptive_k_is_all_or_nothing_where_steps_are_padded(fused):
    """A fused step verifies and chains num_speculative_tokens rows whatever k is: where the next step can be
    fused, a policy's k between 0 and the largest becomes the largest (more tokens at the same cost); on the
    unpadded path it stays as chosen."""
    spec = {"method": "mtp", "num_speculative_tokens": 3, "truncate_threshold": 0.0}
    if fused:
        llm, steps = fused_llm(spec)
    else:
        llm, steps = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
                         speculative_config=spec), None
    sp_ = llm.engine.speculator
    sp_.policy.choose_k = lambda num_seqs, keys: 1
    sp_.rates.override = lambda batch, k, gain=None: k
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

    llm, fused = fused_llm({"method": "mtp", "num_speculative_tokens": 3})
    sp_ = llm.engine.speculator
    sp_.policy.choose_k = lambda num_seqs, keys: 3  # (drafts on every step: fused steps throughout)
    sp_.rates.override = lambda batch, k, gain=None: k
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
    assert pools_full(llm)
    llm.shutdown()


@pytest.mark.parametrize("mode", ["chain", "fused"])
def test_a_prompt_drafts_through_the_chain(plain, mode):
    """A drafting prompt's rows before its last catch up on their own (no logits); its last row then drafts as
    a decode row, all k depths in one chain replay (not an eager pass and one graph step per depth): the tokens
    stay plain decoding's."""
    llm, _ = fused_llm(max_num_seqs=4) if mode == "fused" else (None, None)
    if llm is None:
        llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=4,
                  speculative_config=SPEC)
        llm.engine.executor.runner.setup_graphs(4, None, enforce_eager=False, pad_on_cpu=True,
                                                num_speculative_tokens=3, draft_graph="chain")
    executor, calls = llm.engine.executor, []
    draft = executor.draft

    def spy(plan, rows, from_main, depths=1):
        calls.append((from_main, plan.num_decode == len(plan.slots), len(plan.logits_indices), depths))
        return draft(plan, rows, from_main, depths)
    executor.draft = spy
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    got = llm.generate(PROMPTS[:2], sp)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain.generate(PROMPTS[:2], sp)]
    assert calls[:2] == [(True, False, 0, 1), (True, True, 2, 3)], calls[:4]
    assert pools_full(llm)
