"""Hostile input: the hand-written corpus and schemathesis against a live server. Never a 5xx;
every error OpenAI-shaped; every response valid against /openapi.json."""

import time

import httpx
import pytest

from live import LiveServer
from tpserve.tools.bench.fuzz import run_schemathesis
from tpserve.tools.bench.hostile_corpus import cases, run_corpus

MAX_REQUEST_BYTES = 1 << 20  # small, so the oversized cases stay cheap


@pytest.fixture(scope="module")
def server(tiny):
    s = LiveServer(str(tiny("default")), max_num_seqs=8, max_model_len=64,
                   state_options={"max_request_bytes": MAX_REQUEST_BYTES})
    yield s
    s.close()


def pools_full(server, seconds=2.0):
    deadline = time.time() + seconds
    while not server.pools_full() and time.time() < deadline:
        time.sleep(0.05)
    return server.pools_full()


def test_corpus_gets_the_expected_status(server):
    sent, wrong = run_corpus(server.url, max_request_bytes=MAX_REQUEST_BYTES)
    assert sent == len(list(cases(MAX_REQUEST_BYTES))) > 250
    assert [(c.name, status, body) for c, status, body in wrong] == []
    assert pools_full(server)


def test_openapi_declares_every_body(server):
    spec = httpx.get(server.url + "/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize", "/detokenize"):
        op = spec["paths"][path]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.split("/")[-1] in spec["components"]["schemas"]
        assert {"200", "400", "401", "413"} <= set(op["responses"])
    chat = spec["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["additionalProperties"] is False and "response_format" in chat["properties"]
    assert spec["paths"]["/v1/models/{model_id}"]["get"]["responses"]["404"]


def test_schemathesis_no_5xx_and_schema_valid(server):
    report = run_schemathesis(server.url, examples_per_operation=10, cap_tokens=4)
    assert report.failures == []
    assert report.cases >= 40 and not any(code >= 500 for code in report.statuses)
    assert report.accepted >= 0.5, report.summary()  # most generated cases pass validation
    assert pools_full(server)


def test_bench_fuzz_command(server, tmp_path, capsys):
    from tpserve.cli import build_parser

    out = tmp_path / "fuzz.json"
    args = build_parser().parse_args(["bench", "fuzz", "--url", server.url, "--cases", "16", "--cap-tokens", "2",
                                      "--skip-corpus", "--json", str(out)])
    assert args.func(args) == 0
    import json

    result = json.loads(out.read_text())["schemathesis"]["positive"]
    assert result["cases"] >= 8 and result["failures"] == []
    assert "schemathesis (positive)" in capsys.readouterr().out


def test_streamed_responses_are_valid_sse_against_the_schema(server):
    """Streams (chat, completions and responses) pass schemathesis' SSE schema check (a random
    stream=true case is rare in a short run, so this one is forced)."""
    import schemathesis
    from schemathesis.checks import not_a_server_error, response_schema_conformance

    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    bodies = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                       "stream": True},
              "/v1/completions": {"prompt": "hi", "max_tokens": 3, "stream": True},
              "/v1/responses": {"input": "hi", "max_output_tokens": 3, "stream": True}}
    for path, body in bodies.items():
        op = schema[path]["POST"]
        case = op.Case(body=body, media_type="application/json")
        response = case.call(base_url=server.url, timeout=60)
        last = "event: response.incomplete" if path == "/v1/responses" else "data: [DONE]"
        assert response.status_code == 200 and last in response.text.rstrip().rsplit("\n\n", 1)[-1]
        case.validate_response(response, checks=(not_a_server_error, response_schema_conformance))
