"""A few seconds of `tpserve bench soak`: no errors, pools full afterwards (the real run is in BENCHMARKS.md)."""

import json


def test_short_soak(tiny, tmp_path):
    from tpserve.cli import build_parser

    out = tmp_path / "soak.json"
    args = build_parser().parse_args(["bench", "soak", str(tiny("default")), "--device", "cpu",
                                      "--kv-cache-memory", "8MiB", "--duration", "3", "--concurrency", "8",
                                      "--disconnect-fraction", "0.3", "--max-tokens", "6", "--json", str(out)])
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert result["errors"] == 0 and result["pools_full_after"] is True
    assert result["completed"] > 0 and result["disconnects"] > 0
    assert result["rss_start_mib"] > 0 and result["rss_end_mib"] > 0
