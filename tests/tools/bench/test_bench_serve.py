"""tpserve bench serve against the live tiny server (sweep, datasets, Poisson, cold prefill, PNG) and
against fault-injecting proxies (each fault makes the run fail); the GPU guard with a fake NVML."""

import json

import pytest

from live import LiveServer
from tpserve.cli import main
from tpserve.tools.bench.datasets import load_prompts, salt
from tpserve.tools.bench.gpu_guard import GpuGuard


def _bench(url, tmp_path, *extra):
    out = tmp_path / "bench.json"
    rc = main(["bench", "serve", "--url", url, "--max-tokens", "4", "--json", str(out), *extra])
    return rc, json.loads(out.read_text())


def test_sweep_cold_prefill_plot(live, tmp_path, capsys):
    png = tmp_path / "bench.png"
    rc, res = _bench(live.url, tmp_path, "--concurrency", "1,3", "--num-requests", "3", "--dataset", "structured",
                     "--cold-prefill", "--plot", str(png))
    assert rc == 0, res["errors"]
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 3]
    for lv in res["levels"]:
        assert lv["completed"] == 3 and lv["errors"] == []
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            p = lv[key]
            assert 0 < p["p50"] <= p["p90"] <= p["p99"]
        assert lv["e2e_ms"]["p50"] >= lv["ttft_ms"]["p50"]
    assert res["cold_valid"] and res["gpu_guard"]["throttled"] is False
    assert png.stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "cold prefill: VALID" in out and "GPU guard: no GPU" in out


def test_passes_compare_the_first_with_the_last(live, tmp_path, capsys, monkeypatch):
    import time

    slept, sleep = [], time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: slept.append(s) or sleep(min(s, 0.01)))
    rc, res = _bench(live.url, tmp_path, "--concurrency", "2", "--num-requests", "3", "--passes", "2",
                     "--pause", "30")
    assert rc == 0, res["errors"]
    assert slept.count(30.0) == 1  # before the second pass only
    one, two = res["passes"]
    assert one["levels"] == res["levels"] and two["levels"][0]["completed"] == 3
    (row,) = res["first_pass"]
    assert row["concurrency"] == 2
    assert row["tok_per_s_ratio"] == one["levels"][0]["output_tok_per_s"] / two["levels"][0]["output_tok_per_s"]
    assert row["ttft_p99_ratio"] == one["levels"][0]["ttft_ms"]["p99"] / two["levels"][0]["ttft_ms"]["p99"]
    for one_pass in (one, two):  # each request in the order sent: [sent, TTFT, E2E] ms
        timeline = one_pass["levels"][0]["timeline_ms"]
        assert len(timeline) == 3 and timeline == sorted(timeline) and timeline[0][0] == 0
        assert all(0 < ttft <= e2e for _, ttft, e2e in timeline)
    boot = res["boot"]  # the server's /metrics
    assert boot["boot_seconds"] == pytest.approx(boot["boot_load_seconds"] + boot["boot_warmup_seconds"])
    out = capsys.readouterr().out
    assert "pass 1 (the first after boot)" in out and "first pass / pass 2 at concurrency 2" in out
    assert "server ready in" in out


def test_jsonl_poisson(live, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "Hello there"}\n\n{"text": "Tell me a story"}\n')
    rc, res = _bench(live.url, tmp_path, "--dataset", "jsonl", "--dataset-path", str(data), "--concurrency", "2",
                     "--num-requests", "3", "--request-rate", "20")
    assert rc == 0 and res["levels"][0]["request_rate"] == 20.0 and res["levels"][0]["completed"] == 3


@pytest.mark.parametrize("fault, message", [("max_tokens", "returned 5 tokens, asked for 4"),
                                            ("http500", "HTTP 500"), ("broken_sse", "broken SSE stream")])
def test_faults_fail_the_run(faulty, tmp_path, fault, message):
    rc, res = _bench(faulty(fault).url, tmp_path, "--concurrency", "2")
    assert rc == 1
    assert len(res["errors"]) == 2 and all(message in e for e in res["errors"]), res["errors"]


@pytest.mark.parametrize("fault, message", [("cached", "cached_tokens=3"), ("no_cached", "cached_tokens missing")])
def test_cold_prefill_catches_cache_hits(faulty, tmp_path, fault, message):
    rc, res = _bench(faulty(fault).url, tmp_path, "--concurrency", "2", "--cold-prefill")
    assert rc == 1 and res["cold_valid"] is False and message in res["levels"][0]["cold_violations"][0]
    rc, res = _bench(faulty(fault).url, tmp_path, "--concurrency", "2")  # not asked: not checked
    assert rc == 0


def test_datasets_and_salt(tmp_path):
    assert len(load_prompts("random", 3, prompt_len=5)) == 3 and len(load_prompts("random", 1, prompt_len=5)[0]) == 5
    code = load_prompts("code", 5)
    assert all(isinstance(p, str) and p for p in code)
    salted = salt(code) + salt([[5, 6, 7], [5, 6, 7]])
    heads = [p[:30] if isinstance(p, str) else tuple(p[:8]) for p in salted]
    assert len(set(heads)) == len(heads)  # every prompt starts differently
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_prompts("jsonl", 2, path=str(bad))


class FakeNvml:
    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def __init__(self, reasons):
        self.reasons = reasons

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1500 + h

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetTemperature(self, h, kind):
        return 60 + h

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.reasons if h == 1 else 0x1  # 0x1: idle, not a throttle


def test_gpu_guard_flags_throttling():
    with GpuGuard(interval_s=0.01, nvml=FakeNvml(0x40 | 0x4)) as g:
        pass
    s = g.summary()
    assert s["throttled"] and s["throttle_reasons"] == ["hw_thermal", "sw_power_cap"]
    assert s["temperature_c_max"] == 61 and s["sm_clock_mhz_min"] == 1500 and "THROTTLED" in g.line()
    with GpuGuard(interval_s=0.01, nvml=FakeNvml(0)) as g:
        pass
    assert not g.summary()["throttled"] and "not throttled" in g.line()


def test_mean_accepted_length_from_a_speculating_server(tiny, tmp_path, capsys):
    """A tiny checkpoint with an MTP layer (tests/helpers.py "mtp") served with MTP speculation: bench serve
    reads the spec_decode counters from /metrics and reports the mean accepted length per level."""
    s = LiveServer(str(tiny("mtp")), kv_cache_memory="16MiB", max_num_seqs=8,
                   speculative_config='{"method": "mtp", "num_speculative_tokens": 3, "adaptive": false}')
    try:
        rc, res = _bench(s.url, tmp_path, "--concurrency", "2", "--num-requests", "2", "--max-tokens", "24",
                         "--dataset", "structured")
    finally:
        s.close()
    assert rc == 0, res["errors"]
    assert 1.0 < res["levels"][0]["mean_accepted_length"] <= 4.0
    assert "mean accepted length" in capsys.readouterr().out


def test_multiturn_reuses_history_and_the_cold_replay_proves_none(live, tmp_path, capsys):
    """Conversations resending their history: later turns are served from the prefix cache; the replay of the
    same prompts, one cache_salt per request, gets cached_tokens == 0 and the same (greedy) answers."""
    png = tmp_path / "multiturn.png"
    rc, res = _bench(live.url, tmp_path, "--dataset", "multiturn", "--concurrency", "2", "--num-requests", "3",
                     "--turns", "3", "--prompt-len", "120", "--turn-len", "20", "--max-tokens", "8",
                     "--plot", str(png))
    assert rc == 0, res["errors"]
    lv = res["levels"][0]
    assert [row["turn"] for row in lv["turns"]] == [1, 2, 3] and all(row["requests"] == 3 for row in lv["turns"])
    assert lv["turns"][0]["cached_tokens"] == 0 and lv["turns"][0]["hit_rate"] is None
    assert all(row["cached_tokens"] > 0 for row in lv["turns"][1:]) and 0.3 < lv["hit_rate"] <= 1.0
    assert lv["cold_valid"] and lv["cold_pass"]["cached_tokens_total"] == 0
    assert lv["outputs_identical"] == lv["outputs_compared"] == 9
    assert png.stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "multi-turn at concurrency 2: hit rate" in out and "no-cache pass: VALID" in out
