"""Prefix hit rates behind the router, on the CPU with the built-in demo model: the same multi-turn trace
(`tpserve bench serve --dataset multiturn`'s code, called in process) against one replica alone and a `-dp 2`
fleet routing cache_aware (one boot of two engines serves both). cache_aware keeps >= 90% of the single
replica's hit rate while both replicas serve conversations. Its router sends a request that begins with text
sent before (over 30% of it) to that replica and anything else (a new conversation) to the least loaded one, so
the conversations run at once to spread; each turn here repeats at least half of its text. (A round_robin front
router over the same replicas is tested in test_fleet.py; its hit rate depends on the order the turns arrive in,
so `bench/replicas_gpu.sh` measures it rather than a test.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_fleet import AUTH, Fleet

from tpserve.engine.setup import builtin_demo_model
from tpserve.tools.bench.multiturn import bench_multiturn

MODEL = "demo"
# 3 conversations x 4 turns at once, 16 words a message, 4 answer tokens: each turn adds a third to half of
# the history, so a turn on the wrong replica loses much of its hit
TRACE = SimpleNamespace(num_requests=3, turns=4, prompt_len=16, turn_len=16, prompt_seed=0, max_tokens=4)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    demo = builtin_demo_model()
    if demo is None:
        pytest.skip("the built-in demo model is not in this checkout")
    # 16-token blocks: a hit counts whole blocks, so short turns need small ones
    f = Fleet(demo, tmp_path_factory.mktemp("fleet-prefix") / "serve.log", "-dp", "2", "--served-model-name",
              MODEL, "--router-policy", "cache_aware", "--block-size", "16", "--kv-cache-memory", "64MiB",
              "--no-snapshot")
    try:
        yield f.wait_up()
    finally:
        f.stop()


def trace(url: str) -> dict:
    level = bench_multiturn(url, TRACE, AUTH, MODEL, concurrency=TRACE.num_requests)
    assert level["errors"] == [] and level["cold_valid"], (level["errors"][:3], level["cold_violations"][:3])
    assert level["outputs_identical"] == level["outputs_compared"] == 12
    return level


def test_cache_aware_keeps_the_single_replica_hit_rate(fleet):
    urls = [r["url"] for r in fleet.status()["replicas"]]
    single = trace(urls[0])

    before = fleet.counts()
    aware = trace(fleet.url)
    served = {k: v - before[k] for k, v in fleet.counts().items()}

    rates = {"single": single["hit_rate"], "cache_aware": aware["hit_rate"]}
    print("prefix hit rates:", {k: round(v, 3) for k, v in rates.items()})
    assert rates["single"] >= 0.8, single["turns"]  # the trace itself reuses its history
    assert rates["cache_aware"] >= 0.9 * rates["single"], (aware["turns"], single["turns"])
    assert min(served.values()) > 0, served  # the conversations spread, not all on one replica
