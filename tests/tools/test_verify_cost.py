"""bench/verify_cost.py on the CPU (the same padded steps, eagerly) with the demo model's weights: every piece of a
speculative step timed, the fused step (verify graph of 1+k rows, then the spec graph) among them, and the
break-even the cheaper form of the step gives."""

from __future__ import annotations

import json

from helpers import load_bench

from tpserve.engine.setup import builtin_demo_model


def test_verify_cost_times_the_fused_step_of_a_checkpoint(tmp_path, capsys):
    mod = load_bench("verify_cost")
    out = tmp_path / "cost.json"
    mod.main(["--device", "cpu", "--model", str(builtin_demo_model()), "--batch", "1", "--k", "3", "--iters", "1",
              "--json", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    pieces = ["verify q=2", "verify q=4", "KDA commit q=4", "MTP draft q=1", "MTP chain q=4", "spec (after verify) q=4"]
    assert row["decode_ms"] > 0 and all(row[p] > 0 for p in pieces)
    fused = row["fused: verify + spec ms"]
    assert fused == row["verify q=4"] + row["spec (after verify) q=4"]
    assert row["break_even_tokens_per_step"] == min(fused, row["verify + commit + 3 drafts ms"]) / row["decode_ms"]
    assert "| 1 | fused: verify + spec (k=3) |" in capsys.readouterr().out
