"""Async scheduling (engine/overlap.py): a decode step launched before the previous step's tokens reach the
host gives the outputs of the synchronous engine."""

import pytest

from helpers import random_prompts
from tpserve import LLM, SamplingParams
from tpserve.engine.overlap import PENDING


def _llm(path, on: bool, **kw):
    return LLM(str(path), device="cpu", kv_cache_memory="8MiB", block_size=16, async_scheduling=on, **kw)


def _final(out):
    return [(c.token_ids, c.logprobs, c.cumulative_logprob, c.finish_reason, c.stop_reason, c.text)
            for c in out.outputs]


def _drive(llm, requests, stagger: bool, abort: dict | None = None):
    """Add (prompt, params) requests (one per step when stagger), step to the end; every streamed output checked
    for placeholders and for growing by prefix -> {request id: final output}. abort: {request id: step number}."""
    engine, done, seen = llm.engine, {}, {}
    todo = list(enumerate(requests))
    step = 0
    while todo or engine.has_unfinished():
        for _ in range(1 if stagger else len(todo)):
            if todo:
                i, (prompt, params) = todo.pop(0)
                engine.add_request(str(i), prompt, params)
        for rid, at in (abort or {}).items():
            if at == step:
                assert engine.abort(rid)
        for out in engine.step():
            for c in out.outputs:
                assert PENDING not in c.token_ids
                before = seen.get((out.request_id, c.index), [])
                assert c.token_ids[:len(before)] == before
                seen[out.request_id, c.index] = list(c.token_ids)
            if out.finished:
                done[out.request_id] = out
        step += 1
    e = engine
    assert e.inflight is None or all(s.is_finished for s in e.inflight.seqs)
    assert e.block_pool.num_free == e.block_pool.num_blocks and e.slot_pool.num_free == e.slot_pool.num_blocks
    return done


def test_outputs_identical_bit_for_bit(tiny):
    """Requests that end by length only: the same steps in the same batches either way, so tokens, logprobs,
    texts and the engine generator's draws (unseeded sampling) are equal bit for bit."""
    path = tiny()
    prompts = random_prompts((14, 40, 5, 27, 33, 9), seed=31)
    kinds = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2),
             SamplingParams(temperature=0.9, seed=5, max_tokens=9, ignore_eos=True, logprobs=0),
             SamplingParams(temperature=1.0, top_p=0.8, top_k=30, max_tokens=15, ignore_eos=True),
             SamplingParams(temperature=0.7, min_p=0.05, n=2, seed=3, max_tokens=7, ignore_eos=True),
             SamplingParams(temperature=0, min_tokens=4, max_tokens=8, logit_bias={7: 3.0}, ignore_eos=True),
             SamplingParams(temperature=1.2, max_tokens=11, ignore_eos=True, logprobs=3)]
    runs = {}
    for on in (False, True):
        llm = _llm(path, on, max_num_seqs=8)
        runs[on] = {rid: _final(o) for rid, o in _drive(llm, list(zip(prompts, kinds)), stagger=False).items()}
        assert (llm.engine.num_overlapped > 0) == on
    assert runs[True] == runs[False]


def test_stops_and_staggered_arrivals(tiny):
    """Sequences that a landed token ends (a stop id, a stop string) were launched once more: that token is
    dropped. Requests arriving while a step is in flight drain it first."""
    path = tiny()
    prompts = random_prompts((20, 6, 35, 11, 28), seed=8)
    base = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm = _llm(path, False)
    free = {rid: o.outputs[0] for rid, o in _drive(llm, [(p, base) for p in prompts], stagger=False).items()}
    stop_id = free["0"].token_ids[5]
    stop_text = free["2"].text[len(free["2"].text) // 2:][:3]
    params = [SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[stop_id], ignore_eos=True),
              base,
              SamplingParams(temperature=0, max_tokens=16, stop=[stop_text], ignore_eos=True),
              SamplingParams(temperature=0.8, seed=11, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=16)]
    runs = {}
    for on in (False, True):
        llm = _llm(path, on, max_num_batched_tokens=24)
        got = _drive(llm, list(zip(prompts, params)), stagger=True)
        runs[on] = {rid: [(c.token_ids, c.finish_reason, c.stop_reason, c.text) for c in o.outputs]
                    for rid, o in got.items()}
        assert (llm.engine.num_overlapped > 0) == on
    assert runs[True] == runs[False]
    assert runs[True]["0"][0][1] == "stop" and runs[True]["2"][0][1] == "stop"


def test_abort_while_in_flight(tiny):
    path = tiny()
    prompts = random_prompts((12, 30, 7), seed=4)
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    want = {rid: _final(o) for rid, o in _drive(_llm(path, False), [(p, params) for p in prompts], False).items()}
    llm = _llm(path, True)
    got = _drive(llm, [(p, params) for p in prompts], stagger=False, abort={"1": 6})
    assert set(got) == {"0", "2"} and all(_final(got[r]) == want[r] for r in got)
    assert llm.engine.num_overlapped > 0


def test_penalties_run_synchronously(tiny):
    """A penalty reads the sequence's earlier tokens on the host: such steps are never left in flight."""
    path = tiny()
    prompts = random_prompts((10, 22), seed=6)
    params = SamplingParams(temperature=0, max_tokens=10, repetition_penalty=1.3, ignore_eos=True)
    runs = {}
    for on in (False, True):
        llm = _llm(path, on)
        runs[on] = {r: _final(o) for r, o in _drive(llm, [(p, params) for p in prompts], False).items()}
        assert llm.engine.num_overlapped == 0
    assert runs[True] == runs[False]


@pytest.mark.parametrize("name", ["default", "variant"])
def test_padded_graph_steps_take_the_in_flight_tokens(tiny, name):
    """The CUDA-graph step run eagerly on CPU (persistent buffers, padded buckets): its input ids gathered from
    the in-flight tokens on the device give the synchronous engine's tokens."""
    path = tiny(name)
    prompts = random_prompts((12, 40, 3, 27, 61), seed=9)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    runs = {}
    for on in (False, True):
        llm = _llm(path, on, max_num_seqs=6)
        runner = llm.engine.executor.runner
        runner.setup_graphs(6, None, enforce_eager=False, pad_on_cpu=True)
        run, used = runner.graphs.run, []

        def spy(plan, key, prev=None, run=run, used=used):
            used.append(prev is not None)
            return run(plan, key, prev)

        runner.graphs.run = spy
        runs[on] = {r: _final(o) for r, o in _drive(llm, [(p, params) for p in prompts], False).items()}
        assert any(used) == on
    assert runs[True] == runs[False]


def test_execute_checks_prev_rows(tiny):
    from tpserve.engine.runner import StepPlan

    runner = _llm(tiny(), True).engine.executor.runner
    plan = StepPlan([PENDING], [0], [0, 1], [0], [0], [[0]], [0], [], prev_rows=[0])
    with pytest.raises(ValueError, match="prev_rows"):
        runner.execute(plan)
