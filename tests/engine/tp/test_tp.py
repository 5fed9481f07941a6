"""Tensor parallelism on CPU (gloo): TP=2, TP=3 and TP=2 with sequence parallelism give the
same greedy tokens as TP=1 / transformers, logits within a bound derived from fp32 rounding
(helpers.assert_logits_match_oracle); dead workers surface as errors."""

import os
import signal
import threading
import time

import pytest
import torch

from helpers import assert_logits_match_oracle, prefill_logits, random_prompts, reference_greedy, wait_healthy
from tpserve import LLM, SamplingParams
from tpserve.engine.executor import EngineDeadError

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _tp(path, tp, **kw):
    kw.setdefault("sequence_parallel", False)
    return LLM(str(path), device="cpu", kv_cache_memory="8MiB", block_size=16, tensor_parallel_size=tp,
               max_num_batched_tokens=64, **kw)


@pytest.mark.parametrize("name,tp,sp", [("default", 3, False), ("default", 2, True), ("shared", 2, True),
                                        ("variant", 2, True)])
def test_tp_matches_transformers(tiny, name, tp, sp):
    path = tiny(name)
    prompts = random_prompts((9, 70, 33), seed=11)
    # sp_min_tokens=16: prefill steps run sequence parallel, decode steps plain TP
    llm = _tp(path, tp, sequence_parallel=sp, sp_min_tokens=16)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)
        for p, o in zip(prompts, outs):
            assert o.outputs[0].token_ids == reference_greedy(path, p, 8)
        assert_logits_match_oracle(prefill_logits(llm, prompts[1]), path, prompts[1])
    finally:
        llm.shutdown()
    assert all(not p.is_alive() for p in llm.engine.executor.procs)


SPEC_PROMPTS = ["Count from 1 to 30: 1, 2, 3,", "The capital of France is", "{\"name\": \"a\", \"value\":"]
SPEC_PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _mtp_engine_args(tiny) -> dict:
    return dict(model=str(tiny("mtp")), device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=4)


@pytest.fixture(scope="module")
def tp1_plain_tokens(tiny):
    """Plain decoding's tokens of SPEC_PROMPTS at TP=1 on the MTP checkpoint."""
    plain = LLM(**_mtp_engine_args(tiny))
    try:
        return [o.outputs[0].token_ids for o in plain.generate(SPEC_PROMPTS, SPEC_PARAMS)]
    finally:
        plain.shutdown()


@pytest.mark.parametrize("fused,share", [(True, False), (False, True)])
def test_speculative_decoding_at_tp2_gives_tp1_plain_tokens(tiny, tp1_plain_tokens, fused, share):
    """MTP drafting at TP=2 on a checkpoint in the published MTP layout (draft steps and KDA commits sent to
    the worker like the plans; the MTP layer's linears split like the main layers', its all-reduces fused
    with the add and norm or not; with MTP index sharing or not): greedy tokens equal plain decoding at TP=1,
    drafts were verified and accepted, pools full after."""
    llm = LLM(tensor_parallel_size=2, speculative_config={"method": "mtp", "num_speculative_tokens": 3,
                                                           "adaptive": False}, fused_collectives=fused,
              hf_overrides={"index_share_for_mtp_iteration": share}, **_mtp_engine_args(tiny))
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(SPEC_PROMPTS, SPEC_PARAMS)] == tp1_plain_tokens
        stats = llm.engine.stats()
        assert stats["spec_decode_num_draft_tokens"] > 0 and stats["spec_decode_num_accepted_tokens"] > 0
        e = llm.engine
        assert e.block_pool.num_free == e.block_pool.num_blocks and e.slot_pool.num_free == e.slot_pool.num_blocks
    finally:
        llm.shutdown()
    assert all(not p.is_alive() for p in llm.engine.executor.procs)


def _staggered(engine, requests) -> list:
    """Add (prompt ids, params) one per step, step to the end -> each request's (token ids, logprobs)."""
    done = {}
    for i, (p, k) in enumerate(requests):
        engine.add_request(str(i), p, k)
        engine.step()  # each request joins a running batch
    while engine.has_unfinished():
        done.update({out.request_id: out for out in engine.step() if out.finished})
    return [(done[str(i)].outputs[0].token_ids, done[str(i)].outputs[0].logprobs) for i in range(len(requests))]


def test_async_scheduling_at_tp2_gives_the_synchronous_outputs(tiny):
    """Async scheduling at TP=2: the worker gets each overlapped step's in-flight tokens from rank 0 over the
    device group (plan_wire STEP_PREV). Requests ended by length: tokens and logprobs bit-identical to the
    synchronous TP=2 engine's (the same batches run either way) and tokens equal TP=1's; with a request that a
    stop id ends early (async scheduling runs its dropped step, so later batches differ in shape): tokens equal."""
    path = tiny("default")
    prompts = random_prompts((9, 30, 17), seed=5)
    by_length = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=1),
                 SamplingParams(temperature=0.8, seed=7, max_tokens=12, ignore_eos=True, logprobs=0)]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ref = _tp(path, 1, async_scheduling=False)
    try:
        want = ref.generate([{"prompt_token_ids": p} for p in prompts], by_length + [greedy])
    finally:
        ref.shutdown()
    stop_id = want[2].outputs[0].token_ids[4]  # ends the third request early, while the others run on
    with_stop = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                 SamplingParams(temperature=0, max_tokens=14, ignore_eos=True),
                 SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id])]
    runs = {}
    for on in (False, True):
        llm = _tp(path, 2, async_scheduling=on)
        try:
            engine = llm.engine
            runs[on] = (_staggered(engine, list(zip(prompts, by_length))),
                        _staggered(engine, list(zip(prompts, with_stop))))
            assert (engine.num_overlapped > 0) if on else (engine.num_overlapped == 0)
            assert engine.block_pool.num_free == engine.block_pool.num_blocks
        finally:
            llm.shutdown()
        assert all(not p.is_alive() for p in llm.engine.executor.procs)
    assert runs[True][0] == runs[False][0]  # bit for bit, logprobs included
    assert [t for t, _ in runs[True][0]] == [o.outputs[0].token_ids for o in want[:2]]
    assert [t for t, _ in runs[True][1]] == [t for t, _ in runs[False][1]]
    assert runs[True][1][2][0] == want[2].outputs[0].token_ids[:5]


def test_fused_collectives_switch_changes_no_token(tiny):
    """--fused-collectives on (all-reduce + mHC expand as one Communicator call in every non-SP
    step: here all of them) and off (the two ops): bitwise the same logits, the same tokens."""
    path = tiny("default")
    prompts = random_prompts((9, 40), seed=5)
    tokens, logits = {}, {}
    for on in (True, False):
        llm = _tp(path, 2, fused_collectives=on)
        try:
            assert llm.engine.ecfg.fused_collectives is on
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)
            tokens[on] = [o.outputs[0].token_ids for o in outs]
            logits[on] = prefill_logits(llm, prompts[1])
        finally:
            llm.shutdown()
    assert tokens[True] == tokens[False]
    assert torch.equal(logits[True], logits[False])


# TP=2 with sequence parallelism (prefills of >= 16 tokens: workspace or process-group
# all-gather / reduce-scatter; decode steps: all-reduce) under each collective path; "off" (gloo
# for everything) is the reference. "chunked": a workspace of one 4 KiB header and four 256-byte
# slots (64 fp32, one token of the tiny model's hidden size), so nearly every model collective,
# decode all-reduces included, takes several pipelined rounds; the variable reaches the spawned
# worker through its environment.
COLLECTIVE_PATHS = {"off": ({"custom_allreduce": False}, {}),
                    "mesh": ({}, {}),
                    "ring": ({"allreduce_topology": "ring"}, {}),
                    "chunked": ({}, {"TPSERVE_ALLREDUCE_WORKSPACE_BYTES": str(4096 + 4 * 256)})}
@pytest.fixture(scope="module")
def collective_path_run():
    """run(path, name): tokens, SP prefill logits and rank 0's collective picks with one path (one
    engine per path for the whole module)."""
    runs: dict[str, dict] = {}

    def run(path, name: str) -> dict:
        if name not in runs:
            kw, env = COLLECTIVE_PATHS[name]
            prompts = random_prompts((9, 40), seed=7)
            with pytest.MonkeyPatch.context() as mp:
                for key, value in env.items():
                    mp.setenv(key, value)
                llm = _tp(path, 2, sequence_parallel=True, sp_min_tokens=16, **kw)
            try:
                comm = llm.engine.executor.state.comm
                ws = comm._ws
                decode, rows = torch.empty(2, 64), torch.empty(20, 64)
                rounds = ws._round if ws is not None else 0
                outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)
                runs[name] = {
                    "tokens": [o.outputs[0].token_ids for o in outs],
                    "logits": prefill_logits(llm, prompts[1]),
                    "picks": (comm.backend_for("all_reduce", decode), comm.backend_for("all_gather", rows),
                              comm.backend_for("reduce_scatter", rows)),
                    "slot_bytes": None if ws is None else ws.slot_bytes,
                    "rounds": (ws._round - rounds) if ws is not None else 0}
            finally:
                llm.shutdown()
        return runs[name]
    return run


@pytest.mark.parametrize("name,picks", [("mesh", ("oneshot", "oneshot", "oneshot")),
                                        ("ring", ("ring", "torch", "torch")),
                                        ("chunked", ("chunked", "chunked", "chunked"))])
def test_collective_path_switch_changes_no_token(tiny, collective_path_run, name, picks):
    """Greedy tokens at TP=2 with sequence parallelism are the same with each workspace path as
    with the process group's collectives (--no-custom-allreduce), and so are the logits, bit for
    bit: at two ranks every element is one sum of two addends, whose rounding no order changes."""
    path = tiny("default")
    off, run = collective_path_run(path, "off"), collective_path_run(path, name)
    assert off["picks"] == ("torch", "torch", "torch") and off["slot_bytes"] is None
    assert run["picks"] == picks  # the path under test really served the model's collectives
    assert run["rounds"] > 0
    if name == "chunked":
        assert run["slot_bytes"] == 256
        assert run["rounds"] > 100  # many multi-round calls
    assert run["tokens"] == off["tokens"]
    assert torch.equal(run["logits"], off["logits"])


def test_indivisible_sizes_are_refused(tiny):
    with pytest.raises(ValueError, match="divisible by tensor_parallel_size=4"):
        _tp(tiny("default"), 4)


def test_killed_worker_surfaces_as_error_not_hang(tiny):
    llm = _tp(tiny("default"), 2)
    worker = llm.engine.executor.procs[0]
    errors = []

    def run():
        try:
            llm.generate([{"prompt_token_ids": [5] * 20}], SamplingParams(max_tokens=2000, ignore_eos=True))
        except EngineDeadError as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(1.0)
    os.kill(worker.pid, signal.SIGKILL)
    t.join(timeout=60)
    assert not t.is_alive(), "generate hung after a worker died"
    assert errors and "rank1" in str(errors[0])
    with pytest.raises(EngineDeadError):
        llm.generate([{"prompt_token_ids": [5]}])
    llm.shutdown()
    assert all(not p.is_alive() for p in llm.engine.executor.procs)


def test_server_with_tp2(tiny):
    import openai

    from tpserve.config import EngineConfig
    from tpserve.server.local import LocalServer

    cfg = EngineConfig.from_env(model=str(tiny("default")), device="cpu", kv_cache_memory="8MiB",
                                tensor_parallel_size=2)
    server = LocalServer(cfg)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert r.usage.completion_tokens == 5
        s = list(client.completions.create(model="tiny", prompt="abc", max_tokens=4, stream=True))
        assert s[-1].choices[0].finish_reason == "length"
    finally:
        server.close()


def test_serve_under_torchrun(tiny):
    """`torchrun --nproc-per-node 2 -m tpserve.cli serve --tp 2`: rank 0 serves, rank 1 follows."""
    import subprocess
    import sys

    import httpx

    from tpserve.engine.tp.launch import free_port

    port, master = free_port(), free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(master),
           "-m", "tpserve.cli", "serve", str(tiny("default")), "--device", "cpu", "--tp", "2", "--port", str(port),
           "--kv-cache-memory", "8MiB", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 90)
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
