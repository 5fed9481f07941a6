"""tpserve bench prefill-block: two tiny servers compared (chunk 64 vs one chunk); a failing server
is one clear line."""

import json

from tpserve.cli import main


def test_compare_two_servers(live, scripted, tmp_path, capsys):
    out = tmp_path / "pb.json"
    rc = main(["bench", "prefill-block", "--url", live.url, "--url2", scripted.url, "--long-tokens", "128",
               "--streams", "2", "--short", "2", "--stream-tokens", "400", "--json", str(out)])
    res = json.loads(out.read_text())["results"]
    assert rc == 0 and [r["url"] for r in res] == [live.url, scripted.url]
    for r in res:
        assert r["errors"] == [] and r["long_tokens"] == 128 and r["long_ttft_s"] > 0
        assert r["max_gap_during_ms"] > 0 and r["gap_before_ms"] > 0 and r["short_requests"] >= 1
        assert len(r["short_ttft_ms"]) == r["short_requests"]
    assert "largest gap during ms" in capsys.readouterr().out


def test_failing_server(faulty, capsys):
    assert main(["bench", "prefill-block", "--url", faulty("http500").url, "--long-tokens", "16"]) == 2
    err = capsys.readouterr().err
    assert "did not start" in err and "HTTP 500" in err and err.count("\n") == 1
