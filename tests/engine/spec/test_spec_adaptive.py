"""Adaptive k in the engine: where it drafts nothing (k = 0 for long, above the verify graphs) the steps run
as plain decoding; switching a running engine between adaptive and fixed k."""

import pytest
from spec_cases import PROMPTS, SPEC, Model, pools_full

from tpserve import LLM, SamplingParams


def test_k_zero_for_long_stops_the_drafter(plain):
    """When the policy keeps choosing k = 0 (large batches), the MTP catch-up stops after IDLE_STEPS steps:
    those steps then cost what plain decoding costs; tokens stay plain decoding's."""
    from tpserve.engine.spec.speculator import IDLE_STEPS

    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8, speculative_config=SPEC)
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


def test_adaptive_mode_gives_plain_tokens(plain):
    """The default adaptive mode (k per step from measured rates and step costs, so timing-dependent):
    whatever k it picks, greedy tokens are plain decoding's and every pool is free afterwards."""
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)]
    assert got == [o.outputs[0].token_ids for o in plain.generate(PROMPTS, sp)]
    assert pools_full(llm)


def test_adaptive_does_not_draft_above_the_verify_graphs(plain):
    """With CUDA graphs for plain decode steps up to any batch but for verify / draft steps only up
    to SPEC_MAX_BATCH, a drafting step above that runs eagerly: the adaptive mode drafts nothing there
    (exploration steps included), and the MTP layer does not run at all (no eager catch-up pass per step:
    the three prompts are prefilled in one step, already above the limit); a batch within the limit
    still drafts; once the batch is found above the limit, the steps until a request is added skip the
    speculator. (The limit is stood in for on the CPU, where nothing is captured.)"""
    # (no prefix caching: its chunk ends at state checkpoints would split the prefill over two steps)
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 3}, enable_prefix_caching=False)
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
    assert pools_full(llm)


def test_adaptive_k_zero_for_long_runs_plain_steps_with_async_scheduling(plain):
    """When the adaptive policy chooses k = 0 for more than IDLE_STEPS steps in a row (large batches), the MTP
    stops for the running requests and the steps until a request is added skip the speculator and run as an
    engine without speculation runs them: async scheduling on. The policy's choice is stood in for (its cost
    model picks k = 0 at large batches on a GPU)."""
    from tpserve.engine.spec.speculator import IDLE_STEPS

    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    eng = llm.engine
    sp_ = eng.speculator
    sp_.policy.choose_k = lambda batch, running: 0
    sp_.rates.override = lambda batch, k, gain=None: k
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
    assert pools_full(llm)


def test_set_adaptive_switches_a_running_engine(plain):
    """Speculator.set_adaptive (bench/spec_ab.py --one-engine): an engine built adaptive runs as fixed k and back;
    greedy tokens equal plain decoding in both modes; the fixed mode drafts k = num_speculative_tokens on every
    drafting step and observes nothing; what the adaptive mode learned is kept."""
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in plain.generate(PROMPTS[:2], sp)]
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
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
        assert pools_full(llm)
    finally:
        llm.shutdown()


def test_set_adaptive_with_a_smaller_fixed_k():
    """set_adaptive(False, fixed_k) (bench/spec_sides.py): unseeded sampled requests then draft fixed_k on every
    drafting step; the adaptive mode takes no fixed_k; fixed_k outside 1..num_speculative_tokens is refused."""
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
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
        assert pools_full(llm)
    finally:
        llm.shutdown()
