"""server/memory.py: the periodic malloc_trim switch (env, thread, app lifespan) and that a trim
gives a fragmented heap's free pages back to the OS."""

import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from tpserve.server.memory import (DEFAULT_TRIM_INTERVAL_S, ENV_TRIM_INTERVAL, MallocTrimmer, glibc, heap_mib,
                                   trim_interval_from_env)

needs_glibc = pytest.mark.skipif(glibc() is None, reason="glibc only")


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def test_interval_from_env(monkeypatch):
    monkeypatch.delenv(ENV_TRIM_INTERVAL, raising=False)
    assert trim_interval_from_env() == DEFAULT_TRIM_INTERVAL_S == 0.0  # off unless asked for
    monkeypatch.setenv(ENV_TRIM_INTERVAL, "60")
    assert trim_interval_from_env() == 60.0
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(ENV_TRIM_INTERVAL, bad)
        with pytest.raises(ValueError, match=ENV_TRIM_INTERVAL):
            trim_interval_from_env()


def test_trimmer_calls_periodically_and_stops():
    calls = []
    trimmer = MallocTrimmer(0.02, trim=lambda: calls.append(time.monotonic())).start()
    time.sleep(0.2)
    trimmer.stop()
    seen = len(calls)
    assert seen >= 3 and trimmer.calls == seen and not trimmer.active
    time.sleep(0.06)
    assert len(calls) == seen
    off = MallocTrimmer(0, trim=lambda: calls.append(0)).start()
    assert not off.active and len(calls) == seen
    with pytest.raises(ValueError, match="interval"):
        MallocTrimmer(-1)


@needs_glibc
def test_trim_gives_free_heap_pages_back():
    """Free every other 64 KiB block of 160 MiB (the heap top stays in use, so malloc cannot shrink
    it by itself): RSS stays up until malloc_trim(0) hands the free pages back."""
    blocks = [bytes(64 << 10) for _ in range(2560)]
    del blocks[::2]
    before, heap = rss_mib(), heap_mib()
    assert heap["free"] > 60
    MallocTrimmer(1).trim_now()
    assert before - rss_mib() > 40
    del blocks


def fake_state(interval: float):
    from tpserve.server.state import ServerState

    stats = {"running": 0, "waiting": 0, "blocks_free": 1, "blocks_total": 1, "slots_free": 1, "slots_total": 1,
             "preemptions": 0}
    engine = SimpleNamespace(stats=lambda: stats, dead_reason=None, tokenizer=None,
                             engine=SimpleNamespace(model_config=SimpleNamespace(vocab_size=16), model_dir="m"))
    return ServerState(engine, ["m"], malloc_trim_interval=interval)


@pytest.mark.parametrize("interval,active", [(30.0, True), (0.0, False)])
def test_app_runs_the_trimmer_while_it_serves(interval, active):
    from tpserve.server.api import build_app

    state = fake_state(interval)
    with TestClient(build_app(state)) as client:
        assert client.get("/health").status_code == 200
        assert state.trimmer.active is (active and glibc() is not None)
    assert not state.trimmer.active


def test_state_reads_the_environment(monkeypatch):
    from tpserve.server.state import ServerState

    monkeypatch.setenv(ENV_TRIM_INTERVAL, "5")
    assert ServerState(None, ["m"]).malloc_trim_interval == 5.0
