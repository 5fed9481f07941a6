"""`tpserve bench model` end to end on CPU with make-tiny widths (the GPU command, small), and the floors'
figures taken from the card the run is on."""

import json

import pytest
import torch

from tpserve.cli import main
from tpserve.tools.bench import model as bench_model


def test_bench_model_tiny_cpu(tmp_path, capsys):
    out, png = tmp_path / "model.json", tmp_path / "decode.png"
    # 3 x 128 prompt tokens over 48-token steps: the batch's prefill takes 8 steps, none of them timed as decode
    code = main(["bench", "model", "--device", "cpu", "--size", "tiny", "--dtype", "float32", "--layers", "KM",
                 "--prefill", "32", "48", "--repeats", "1", "--decode-steps", "2", "--batch", "1", "3",
                 "--max-num-batched-tokens", "16", "--profile", "2", "--profile-prefill", "24", "--compare-eager", "--plot", str(png),
                 "--hbm-tbps", "3.35", "--peak-tflops", "989", "--json", str(out)])
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
        assert run["peaks"] == {"card": "cpu", "hbm_bytes_per_s": 3.35e12, "bf16_flops": 989e12}
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


def test_bench_model_on_cpu_has_no_floor_unless_given(tmp_path, capsys):
    out = tmp_path / "model.json"
    code = main(["bench", "model", "--device", "cpu", "--size", "tiny", "--dtype", "float32", "--layers", "K",
                 "--prefill", "16", "--repeats", "1", "--decode-steps", "2", "--batch", "1", "--json", str(out)])
    assert code == 0
    run = json.loads(out.read_text())["runs"]["default"]
    assert run["decode"]["1"]["floor_ms"] is None and run["decode"]["1"]["of_floor"] is None
    assert run["prefill"]["16"]["mfu"] is None
    text = capsys.readouterr().out
    assert "floors for cpu: no TB/s, no bf16 TFLOP/s" in text and "| no floor | - |" in text


@pytest.mark.parametrize("name,bw,peak", [("NVIDIA H100 80GB HBM3", 3.35e12, 989e12),
                                          ("NVIDIA H100 PCIe", 2.0e12, 756e12),
                                          ("NVIDIA H200", 4.8e12, 989e12),
                                          ("NVIDIA A100-SXM4-80GB", None, None)])
def test_floors_use_the_card_the_run_is_on(monkeypatch, name, bw, peak):
    """The floor divides by the present card's bandwidth and peak (an H100's decode floor is 4.8 / 3.35 x an
    H200's for the same bytes); an unknown card has none unless the flags give them."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peaks = bench_model.device_peaks(torch.device("cuda"))
    assert peaks == {"card": name, "hbm_bytes_per_s": bw, "bf16_flops": peak}
    res = {"decode": {1: {"ms_per_step": 2.0}}, "prefill": {64: {"ms": 1.0}}}
    monkeypatch.setattr(bench_model, "decode_floor_bytes", lambda model, cfg, b: 6.7e9)
    monkeypatch.setattr(bench_model, "prefill_flops", lambda model, cfg, n: 1e12)
    bench_model.add_floors(res, None, None, peaks)
    assert res["decode"][1]["floor_ms"] == (bw and pytest.approx(1000 * 6.7e9 / bw))
    assert res["prefill"][64]["mfu"] == (peak and pytest.approx(1e15 / peak))
    given = bench_model.device_peaks(torch.device("cuda"), hbm_tbps=2.0, peak_tflops=500)
    assert given["hbm_bytes_per_s"] == 2.0e12 and given["bf16_flops"] == 500e12
    monkeypatch.setenv("TPSERVE_BENCH_HBM_TBPS", "1.5")
    monkeypatch.setenv("TPSERVE_BENCH_PEAK_TFLOPS", "300")
    assert bench_model.device_peaks(torch.device("cuda"))["hbm_bytes_per_s"] == 1.5e12
    assert bench_model.device_peaks(torch.device("cuda"))["bf16_flops"] == 300e12
