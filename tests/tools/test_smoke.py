"""tpserve smoke: every check passes against a server that answers well (the tiny server with the
checks' prompts scripted), and each injected fault fails the check that should catch it."""

import json

import pytest

from tpserve.cli import main


def _smoke(url, tmp_path, *extra):
    out = tmp_path / "smoke.json"
    rc = main(["smoke", "--url", url, "--max-tokens", "8", "--json", str(out), *extra])
    return rc, {r["check"]: r for r in json.loads(out.read_text())["checks"]}


def test_all_pass_on_scripted_server(scripted, tmp_path, capsys):
    rc, rows = _smoke(scripted.url, tmp_path)
    assert rc == 0, rows
    assert len(rows) == 9 and all(r["ok"] for r in rows.values())
    assert "PASS  tool-call" in capsys.readouterr().out


def test_random_model_fails_the_answer_checks(live, tmp_path):
    rc, rows = _smoke(live.url, tmp_path)
    assert rc == 1
    assert not rows["factual"]["ok"] and not rows["tool-call"]["ok"]
    # the protocol checks do not depend on the model's answers
    for name in ("models", "max-tokens-5", "over-context-400", "stream-agrees", "reasoning-off"):
        assert rows[name]["ok"], rows[name]


def test_wrong_expect_fails(scripted, tmp_path):
    rc, rows = _smoke(scripted.url, tmp_path, "--expect", "Berlin")
    assert rc == 1 and not rows["factual"]["ok"] and "Berlin" in rows["factual"]["reason"]


@pytest.mark.parametrize("fault, failing", [
    ("max_tokens", {"max-tokens-5"}),
    ("broken_sse", {"stream-agrees"}),
    ("http500", {"factual", "max-tokens-5", "over-context-400", "stream-agrees"}),
])
def test_faults_are_caught(faulty, tmp_path, fault, failing):
    rc, rows = _smoke(faulty(fault).url, tmp_path, "--only", ",".join(sorted(failing | {"models"})))
    assert rc == 1
    assert failing <= {name for name, r in rows.items() if not r["ok"]}
    assert rows["models"]["ok"]
    for name in failing:
        assert rows[name]["reason"]


def test_unreachable_and_bad_urls_are_one_line(capsys):
    from tpserve.engine.tp.launch import free_port

    assert main(["smoke", "--url", f"http://127.0.0.1:{free_port()}"]) == 2
    err = capsys.readouterr().err
    assert "connection refused" in err and "Traceback" not in err and err.count("\n") == 1
    assert main(["smoke", "--url", "localhost-no-scheme"]) == 2
    assert "is not a URL" in capsys.readouterr().err


def test_api_key_problem_is_one_line(tiny, capsys):
    from live import LiveServer

    s = LiveServer(str(tiny("default")), api_key="sesame")
    try:
        assert main(["smoke", "--url", s.url, "--api-key", "wrong"]) == 2
        err = capsys.readouterr().err
        assert "rejected the API key" in err and err.count("\n") == 1
    finally:
        s.close()
