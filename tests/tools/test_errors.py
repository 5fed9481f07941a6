"""Every operator tool turns a wrong URL, a refused connection and a rejected API key into one
line on stderr and exit code 2 (no traceback)."""

import pytest

from tpserve.cli import main

COMMANDS = [["smoke"], ["bench", "serve", "--concurrency", "1", "--max-tokens", "2"],
            ["bench", "prefill-block", "--long-tokens", "8"], ["quality", "count"], ["quality", "nll"],
            ["quality", "humaneval", "--limit", "1"], ["agent-tools", "--tasks", "read"]]


def _one_line(capsys, *needles):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


@pytest.fixture(scope="module")
def locked(tiny):
    from live import LiveServer

    s = LiveServer(str(tiny("default")), api_key="sesame")
    yield s
    s.close()


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_errors_are_one_line(cmd, locked, capsys):
    from tpserve.engine.tp.launch import free_port

    assert main([*cmd, "--url", f"http://127.0.0.1:{free_port()}"]) == 2
    _one_line(capsys, "connection refused")
    assert main([*cmd, "--url", "127.0.0.1:8000"]) == 2
    _one_line(capsys, "is not a URL")
    assert main([*cmd, "--url", locked.url, "--api-key", "wrong"]) == 2
    _one_line(capsys, "rejected the API key")
