"""tpserve agent-tools: a scripted agent passes all five tasks (streamed and not); an agent with
wrong edits fails write/edit; the random tiny model fails; transcripts are saved."""

import json

import pytest

from fake_agent import agent_server
from tpserve.cli import main
from tpserve.tools.agent_tools import Workspace


@pytest.fixture(scope="module")
def agents():
    good, wrong = agent_server(), agent_server(wrong=True)
    yield good, wrong
    good.close()
    wrong.close()


def _run(url, tmp_path, *extra):
    out = tmp_path / "agent.json"
    rc = main(["agent-tools", "--url", url, "--json", str(out), "--transcripts", str(tmp_path / "t"), *extra])
    return rc, json.loads(out.read_text())["results"]


def test_scripted_agent_passes_all(agents, tmp_path):
    rc, rows = _run(agents[0].url, tmp_path)
    assert rc == 0 and len(rows) == 10 and all(r["ok"] for r in rows), rows
    assert {r["stream"] for r in rows} == {True, False}
    edit = json.loads((tmp_path / "t" / "edit-stream.json").read_text())
    assert [m["role"] for m in edit["transcript"]] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                                        "assistant"]
    assert edit["tool_calls"] == ["read_file", "edit_file"]


def test_wrong_agent_fails_write_and_edit(agents, tmp_path):
    rc, rows = _run(agents[1].url, tmp_path, "--mode", "nostream")
    assert rc == 1
    assert {r["task"]: r["ok"] for r in rows} == {"list": True, "read": True, "search": True, "write": False,
                                                  "edit": False}
    assert "hello there" in next(r for r in rows if r["task"] == "write")["reason"]


def test_random_model_fails(live, tmp_path):
    rc, rows = _run(live.url, tmp_path, "--tasks", "read", "--max-turns", "2", "--max-tokens", "8")
    assert rc == 1 and len(rows) == 2 and not any(r["ok"] for r in rows)


def test_workspace_confines_paths(tmp_path):
    ws = Workspace(tmp_path)
    with pytest.raises(ValueError, match="outside the workspace"):
        ws.call("read_file", {"path": "../../etc/passwd"})
    assert json.loads(ws.call("search", {"pattern": "pelican"})) == ["notes/birds.txt"]
