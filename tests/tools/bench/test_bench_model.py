"""`tpserve bench model` end to end on CPU with make-tiny widths (the GPU command, small)."""

import json

from tpserve.cli import main


def test_bench_model_tiny_cpu(tmp_path, capsys):
    out, png = tmp_path / "model.json", tmp_path / "decode.png"
    # 3 x 128 prompt tokens over 48-token steps: the batch's prefill takes 8 steps, none of them timed as decode
    code = main(["bench", "model", "--device", "cpu", "--size", "tiny", "--dtype", "float32", "--layers", "KM",
                 "--prefill", "32", "48", "--repeats", "1", "--decode-steps", "2", "--batch", "1", "3",
                 "--max-num-batched-tokens", "16", "--profile", "2", "--profile-prefill", "24", "--compare-eager", "--plot", str(png),
                 "--json", str(out)])
    assert code == 0
    res = json.loads(out.read_text())
    assert res["tp"] == 1 and res["layers"] == "KM" and set(res["runs"]) == {"eager", "graphs"}
    for run in res["runs"].values():
        assert set(run["prefill"]) == {"32", "48"} and set(run["decode"]) == {"1", "3"}
        assert all(r["ms"] > 0 and 0 < r["mfu"] < 1 for r in run["prefill"].values())
        assert run["decode"]["3"]["steps"] == 2 and run["decode"]["1"]["steps"] == 2
        # the floor grows with the batch (more experts touched, more KDA state moved)
        assert 0 < run["decode"]["1"]["floor_ms"] < run["decode"]["3"]["floor_ms"]
        assert run["graphs"] is None  # no CUDA graphs on CPU
        prof = run["profile"]
        assert prof["batch"] == 1 and prof["steps"] == 2 and prof["top"], prof
        assert run["profile_prefill"]["tokens"] == 24  # (no device kernels on CPU: its table is empty here)
    text = capsys.readouterr().out
    table = [line for line in text.splitlines() if line.startswith("| decode step")]
    assert len(table) == 4 and "nan" not in "".join(table)
    assert "| graphs / eager |" in text
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_bench_model_speculative_reports_accepted_length(tmp_path, capsys):
    """With --speculative-config the random checkpoint gets a random MTP layer (dummy weights: no
    checkpoint check); decode rows carry the mean accepted length and tokens per step."""
    out = tmp_path / "model.json"
    spec = '{"method": "mtp", "num_speculative_tokens": 2, "adaptive": false, "truncate_threshold": 0}'
    code = main(["bench", "model", "--device", "cpu", "--size", "tiny", "--dtype", "float32", "--layers", "KM",
                 "--prefill", "16", "--repeats", "1", "--decode-steps", "4", "--batch", "2",
                 "--speculative-config", spec, "--json", str(out)])
    assert code == 0
    r = json.loads(out.read_text())["runs"]["default"]["decode"]["2"]
    assert r["mean_accepted_length"] is not None and 1.0 <= r["mean_accepted_length"] <= 3.0
    assert 2.0 <= r["tokens_per_step"] <= 6.0 and r["steps"] * r["tokens_per_step"] == 8
    assert "mean accepted length" in capsys.readouterr().out
