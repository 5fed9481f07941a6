"""`tpserve bench model` end to end on CPU with make-tiny widths (the GPU command, small)."""

import json

from tpserve.cli import main


def test_bench_model_tiny_cpu(tmp_path, capsys):
    out = tmp_path / "model.json"
    # 3 x 128 prompt tokens over 48-token steps: the batch's prefill takes 8 steps, none of them timed as decode
    code = main(["bench", "model", "--device", "cpu", "--size", "tiny", "--dtype", "float32", "--layers", "KM",
                 "--prefill", "32", "48", "--repeats", "1", "--decode-steps", "2", "--batch", "1", "3",
                 "--max-num-batched-tokens", "16", "--profile", "2", "--json", str(out)])
    assert code == 0
    res = json.loads(out.read_text())
    assert set(res["prefill"]) == {"32", "48"} and set(res["decode"]) == {"1", "3"}
    assert all(r["ms"] > 0 for r in res["prefill"].values())
    assert res["decode"]["3"]["steps"] == 2 and res["decode"]["1"]["steps"] == 2
    assert res["tp"] == 1 and res["layers"] == "KM"
    prof = res["profile"]
    assert prof["batch"] == 1 and prof["steps"] == 2 and prof["top"], prof
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| decode")]
    assert len(table) == 2
    assert "floor" in table[0] and "floor" not in table[1] and "nan" not in "".join(table)
