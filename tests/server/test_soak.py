"""A few seconds of `tpserve bench soak`: no errors, pools full afterwards."""

import json


def test_short_soak(tiny, tmp_path, monkeypatch):
    from tpserve.cli import build_parser

    monkeypatch.setenv("TPSERVE_MALLOC_TRIM_INTERVAL", "30")
    out = tmp_path / "soak.json"
    args = build_parser().parse_args(["bench", "soak", str(tiny("default")), "--device", "cpu",
                                      "--kv-cache-memory", "8MiB", "--duration", "3", "--concurrency", "8",
                                      "--disconnect-fraction", "0.3", "--max-tokens", "6", "--json", str(out)])
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert result["errors"] == 0 and result["pools_full_after"] is True
    assert result["completed"] > 0 and result["disconnects"] > 0
    assert result["rss_start_mib"] > 0 and result["rss_end_mib"] > 0
    assert result["rss_slope_mib_per_min"] is None  # 3 s: nothing after the warm-up minute
    assert result["malloc_trim_interval_s"] == 30.0 and result["malloc_trims"] == 0  # from the env; none due yet
    heap = json.loads(out.read_text())["timeline"][-1][3]
    assert heap is None or heap > 0  # glibc's heap in use (MiB), None elsewhere


def test_slope_per_min():
    from tpserve.tools.bench.soak import slope_per_min

    timeline = [(t, 100 + 0.5 * t / 60, 0, None, None) for t in range(0, 300, 5)]
    assert abs(slope_per_min(timeline, 1) - 0.5) < 1e-9
    assert slope_per_min(timeline, 3) is None and slope_per_min(timeline[:13], 1) is None
