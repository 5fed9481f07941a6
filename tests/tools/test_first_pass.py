"""bench/first_pass.py on make-tiny widths, on the CPU: the config with a tokenizer written, `bench serve --passes 2`
run in a process per mode (the warm-up on, and --no-warmup), each mode's boot seconds, both passes' tok/s and TTFT p99
and their ratios, and each pass's longest TTFTs with when they were sent."""

from __future__ import annotations

from helpers import load_bench


def test_first_pass_runs_each_mode(tmp_path, capsys):
    mod = load_bench("first_pass")
    res = mod.main(["--size", "tiny", "--device", "cpu", "--modes", "restart,no-warmup", "--concurrency", "2",
                    "--num-requests", "2", "--max-tokens", "3", "--prompt-len", "8", "--dir", str(tmp_path)])
    on, off = res["modes"]
    assert on["mode"] == "restart" and off["mode"] == "no-warmup"
    assert on["boot"]["boot_warmup_seconds"] > 0 and off["boot"]["boot_warmup_seconds"] == 0
    for row in (on, off):
        assert row["errors"] == [] and row["process_ready_s"] >= row["boot"]["boot_seconds"]
        (p1, p2) = row["passes"]
        assert min(p1["tok_per_s"], p2["tok_per_s"], p1["ttft_p99_ms"], p2["ttft_p99_ms"]) > 0
        assert row["tok_per_s_ratio"] == p1["tok_per_s"] / p2["tok_per_s"]
        assert p1["kernels_met"] is None  # no Triton on a CPU
        for p in (p1, p2):  # the 2 requests, longest TTFT first, with when each was sent
            assert len(p["slowest"]) == 2 and p["slowest"][0][1] >= p["slowest"][1][1] > 0
    out = capsys.readouterr().out
    assert "| restart |" in out and "| no-warmup |" in out and "restart pass 1: longest TTFTs (sent ms, TTFT ms): (" in out
