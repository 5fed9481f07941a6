"""Warm-up before ready (engine/warmup.py, engine/warmup_plan.py): the steps planned per phase cover each shape class,
every phase runs, the pools are full again, later outputs are unchanged (greedy, seeded and unseeded sampled, with
speculation too), --no-warmup skips it, the log names each phase and the boot time, the kernel watch counts what
compiles after it, and a server answers /health 503 until the warm-up ends."""

import dataclasses
import logging
import re
import subprocess
import sys
import time
import types

import httpx
import pytest

from helpers import random_prompts
from tpserve import LLM, SamplingParams
from tpserve.config import EngineConfig
from tpserve.engine import warmup
from tpserve.engine.setup import triton_cache_env
from tpserve.engine.warmup_plan import ROW_SWEEP, Limits, plan, token_sizes

# real-width GLM-5.3-Flash on one GPU: index_topk 2048 over pools of 16, 131,072 positions, decode graphs
REAL = Limits(budget=2048, max_seqs=64, max_len=131072, moe_max=2048, sp_min=None, kpool=16, keep=128,
              sparse_from=8192, spec_k=0, graph_buckets=(1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64), full=True)


def _tokens(steps):
    return [sum(n for _, n, _ in s) for s in steps]


def test_plan_covers_every_class():
    steps = plan(REAL)
    sizes = token_sizes(REAL)
    assert set(range(1, 17)) <= set(sizes) and max(sizes) == 2048 and _tokens(steps["prefill"]) == sizes
    for p in (32, 64, 128, 256, 512, 1024, 2048):  # each power-of-two class: a multiple of 16 and another count
        cls = [t for t in sizes if p // 2 < t <= p]
        assert any(t % 16 == 0 for t in cls) and any(t % 16 for t in cls), p
    assert set(sizes) >= {2047, 2048}  # the budget, and the MoE's triton limit at it
    sparse = steps["sparse"]
    chunks = [s[-1] for s in sparse]
    assert [n for _, n, _ in chunks] == [t for t in range(1, ROW_SWEEP + 1) for _ in (0, 1)] + [2048]
    assert all(c + n >= 8192 for c, n, _ in chunks)  # each past the sparse threshold
    assert [len(s) for s in sparse[:2]] == [1, 2] and sparse[1][0][2]  # alone, then after a decode row
    mixed = steps["mixed"]
    assert [sum(n for _, n, d in s if d) for s in mixed] == list(range(1, 65))  # every decode row count
    assert all(s[-1][2] is False and all(d for _, _, d in s[:-1]) for s in mixed)  # decodes first, then a chunk
    pools = [(s[0][0] + 1) // 16 for s in steps["contexts"]]
    assert pools[:129] == list(range(129)) and {256, 257, 4096, 4097, 8192} <= set(pools)
    assert [len(s) for s in steps["decode"]] == list(REAL.graph_buckets)
    eager = plan(dataclasses.replace(REAL, graph_buckets=None))
    assert [len(s) for s in eager["decode"]] == list(range(1, 65))
    for name, phase in steps.items():
        for s in phase:
            assert sum(n for _, n, _ in s) <= REAL.budget and all(c + n <= REAL.max_len for c, n, _ in s), name
    assert len(steps["batch"]) == 3 and {len(s) for s in steps["batch"]} == {2, 16, 64}


def test_plan_with_speculation_and_limits():
    spec = plan(dataclasses.replace(REAL, spec_k=3, sparse_from=None, sp_min=1024, moe_max=512))
    rows = [sum(n for _, n, d in s if d) for s in spec["mixed"]]
    assert rows == list(range(1, 257))  # 64 sequences x (1 + 3) rows, verify rows past 64
    assert all(1 <= n <= 4 for s in spec["mixed"] for _, n, d in s if d)
    assert spec["sparse"] == [] and {512, 513, 1023, 1024} <= set(token_sizes(
        dataclasses.replace(REAL, sp_min=1024, moe_max=512)))
    cpu = plan(dataclasses.replace(REAL, full=False))
    assert all(len(s) == 1 for s in cpu.values())  # one step a phase


@pytest.fixture(scope="module")
def path(tiny):
    return str(tiny("default"))


def _llm(path, **kw):
    return LLM(path, device="cpu", kv_cache_memory="4MiB", block_size=16, max_num_seqs=8, **kw)


def test_every_phase_runs_and_pools_are_full(path, caplog):
    with caplog.at_level(logging.INFO, logger="tpserve.warmup"):
        llm = _llm(path, warmup=True)
    e = llm.engine
    planned = plan(warmup.limits(e))
    assert {k: v for k, v in e.boot.steps.items() if k in planned} == {k: len(v) for k, v in planned.items()}
    assert e.boot.steps["sampler"] >= 2 and e.boot.warmup > 0
    calls = []
    execute = e.executor.execute
    e.executor.execute = lambda plan, prev=None: calls.append(plan) or execute(plan, prev)
    counts = warmup.run(e)  # again, counting the steps that reach the executor
    assert len(calls) == sum(counts.values()) and sum(len(v) for v in planned.values()) > 5
    # a state checkpoint kept inside a prefill chunk (the prefix cache's saves build their kernels here too)
    first = e.prefix_cache.ckpts.first
    assert any(p.state_saves and p.state_saves[0][2] == first for p in calls)
    assert e.block_pool.num_free == e.block_pool.num_blocks and e.slot_pool.num_free == e.slot_pool.num_blocks
    assert not e.requests and not e.has_unfinished() and e.inflight is None
    text = [r.getMessage() for r in caplog.records]
    for name in (*planned, "sampler"):
        assert any(re.match(rf"warm-up {name}: \d+ steps.*, [\d.]+ s$", t) for t in text), name
    assert any(re.match(r"ready in [\d.]+ s \(load [\d.]+ s, warm-up [\d.]+ s\)", t) for t in text)
    stats = e.stats()
    assert stats["boot_seconds"] == pytest.approx(stats["boot_load_seconds"] + stats["boot_warmup_seconds"])
    assert e.grammar_compiler is not None  # built once, for the server's structured output
    llm.shutdown()


def test_the_boots_objects_leave_the_garbage_collectors_walks(path, caplog):
    """After the warm-up the boot's objects are frozen (no full collection walks them during the first requests),
    the log says how many; shutdown unfreezes them, so an engine built and dropped in one process is collected."""
    import gc

    with caplog.at_level(logging.INFO, logger="tpserve.warmup"):
        llm = _llm(path, warmup=True)
    frozen = llm.engine.boot.frozen
    assert frozen > 0 and gc.get_freeze_count() > 0  # (some freed since by their counts)
    assert any(r.getMessage() == f"warm-up: {frozen} objects of the boot frozen out of the garbage collector's walks"
               for r in caplog.records)
    llm.shutdown()
    assert gc.get_freeze_count() == 0
    plain = _llm(path, warmup=False)
    assert plain.engine.boot.frozen == 0 and gc.get_freeze_count() == 0
    plain.shutdown()


def test_outputs_unchanged(path):
    prompts = [{"prompt_token_ids": p} for p in random_prompts([5, 40], seed=11)]
    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
              SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=8, ignore_eos=True),
              SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)]  # the engine's generator
    outs = {}
    for on in (False, True):
        llm = _llm(path, warmup=on, seed=3)
        outs[on] = [[o.outputs[0].token_ids for o in llm.generate(prompts, p)] for p in params]
        llm.shutdown()
    assert outs[True] == outs[False]


def test_outputs_unchanged_with_speculation(tiny):
    spec = {"method": "mtp", "num_speculative_tokens": 3, "adaptive": False}  # (the same k in both runs)
    prompts = ["Count: 1 2 3", "List three colours:"]
    params = [SamplingParams(temperature=0, max_tokens=8), SamplingParams(temperature=0.8, seed=1, max_tokens=8)]
    outs, stats = {}, {}
    for on in (False, True):
        llm = LLM(str(tiny("mtp")), device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=4,
                  speculative_config=spec, warmup=on)
        stats[on] = llm.engine.stats()["spec_decode_num_drafts"]
        outs[on] = [[o.outputs[0].token_ids for o in llm.generate(prompts, p)] for p in params]
        llm.shutdown()
    assert llm.engine.boot.steps["speculative"] > 0
    assert stats == {False: 0, True: 0}  # the speculator starts afresh after the warm-up
    assert outs[True] == outs[False]


def test_no_warmup_skips_it(path, caplog):
    with caplog.at_level(logging.INFO, logger="tpserve.warmup"):
        llm = _llm(path, warmup=False)
    assert llm.engine.boot.steps == {} and llm.engine.boot.warmup == 0
    text = [r.getMessage() for r in caplog.records]
    assert not any(t.startswith("warm-up ") for t in text)
    assert any(re.match(r"ready in [\d.]+ s \(load [\d.]+ s, warm-up off\)", t) for t in text)
    assert EngineConfig.from_env({"TPSERVE_WARMUP": "0"}).warmup is False and EngineConfig().warmup is None
    from tpserve.cli import build_parser

    args = build_parser().parse_args(["serve", "--no-warmup"])
    assert args.warmup is False


def test_triton_cache_env_keeps_what_the_user_set(tmp_path, monkeypatch):
    monkeypatch.setenv("TPSERVE_CACHE_DIR", str(tmp_path))
    env = {"TRITON_CACHE_DIR": "/mine"}
    assert triton_cache_env(env) == {"TRITON_CACHE_AUTOTUNING": "1"}
    assert env == {"TRITON_CACHE_DIR": "/mine", "TRITON_CACHE_AUTOTUNING": "1"}
    env = {}
    triton_cache_env(env)
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "triton") and triton_cache_env(env) == {}


def test_kernel_watch_counts_and_logs_after_ready(monkeypatch, caplog):
    """The watch chains Triton's JIT cache hook (here a stand-in module: no Triton on this machine's venv)."""
    seen = []
    knobs = types.SimpleNamespace(runtime=types.SimpleNamespace(jit_cache_hook=lambda **kw: seen.append(kw)))
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(knobs=knobs))
    watch = warmup.KernelWatch()
    assert watch.install() and watch.install()  # once
    hook = knobs.runtime.jit_cache_hook
    hook(repr="_kernel_a[...](BLOCK: constexpr[64])")
    assert watch.met == 1 and watch.after is None and len(seen) == 1  # the hook before still runs
    watch.ready_at = watch.met
    with caplog.at_level(logging.INFO, logger="tpserve.warmup"):
        assert hook(repr="_kernel_b[...](BLOCK: constexpr[128])") is None  # never skips a compile
    assert watch.after == 1 and "_kernel_b" in caplog.text


def test_describe_names_what_made_a_build():
    """Triton 3.6's hook arguments: the signature by name, constexprs by path, 16-byte alignment attributes."""
    kw = {"fn": types.SimpleNamespace(name="_top_pools_kernel"), "key": "[...]", "repr": "_top_pools_kernel[...](x: ()",
          "compile": {"signature": {"scores_ptr": "*fp32", "pos_ptr": "*i64", "P": "i32", "K": "constexpr"},
                      "constants": {(3,): 128}, "configs": [{(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}]}}
    assert warmup.describe(kw) == "_top_pools_kernel(scores_ptr=*fp32/D, pos_ptr=*i64, P=i32/D, K=128)"
    del kw["compile"]
    assert warmup.describe(kw) == "_top_pools_kernel [...]"


SLOW_WARMUP = """
import pathlib, sys, time
from tpserve.engine import warmup
flag = pathlib.Path(sys.argv[1])
real = warmup.run
def slow(engine):
    (flag / "started").touch()
    deadline = time.time() + 120
    while not (flag / "go").exists() and time.time() < deadline:
        time.sleep(0.05)
    return real(engine)
warmup.run = slow
from tpserve.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_health_is_503_until_the_warmup_ends(path, tmp_path):
    """`tpserve serve` with a warm-up held until the test lets it go: 503 while it runs, 200 after."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WARMUP, str(tmp_path), "serve", path, "--device", "cpu",
                             "--warmup", "--port", str(port), "--kv-cache-memory", "4MiB", "--block-size", "16"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/health"
    try:
        deadline = time.time() + 120
        while not (tmp_path / "started").exists():
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.05)
        assert httpx.get(url, timeout=10).status_code == 503  # loaded, warming up
        (tmp_path / "go").touch()
        while True:
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(url, timeout=10).status_code == 200:
                    break
            except httpx.TransportError:  # between the loading responder and uvicorn
                pass
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    text = (tmp_path / "serve.log").read_text()
    assert "warm-up prefill: 1 steps" in text and re.search(r"ready in [\d.]+ s \(load [\d.]+ s, warm-up", text)
