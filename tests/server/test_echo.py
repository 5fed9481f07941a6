"""`echo` on /v1/completions: the prompt's tokens and logprobs in front of the completion, checked
against transformers' log-softmax (prompt token i: log_softmax(logits at i - 1)[token i])."""

import json

import httpx
import pytest

from helpers import oracle_bound
from live import LiveServer

PROMPTS = [[11, 42, 7, 99, 5, 63, 20], [3, 30, 17, 88]]


@pytest.fixture(scope="module")
def server(tiny):
    s = LiveServer(str(tiny("default")), max_num_seqs=8, max_num_batched_tokens=64)
    yield s
    s.close()


def post(server, body):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_logprobs_match_transformers(server, tiny):
    """lm-eval's loglikelihood request: token-id prompts, echo, logprobs 1, max_tokens 1."""
    body = post(server, {"prompt": PROMPTS, "echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0})
    tok = server.engine.tokenizer
    for choice, prompt in zip(sorted(body["choices"], key=lambda c: c["index"]), PROMPTS):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == len(prompt) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["tokens"][:len(prompt)] == [tok.decode([t]) for t in prompt]
        assert choice["text"].startswith(tok.decode(prompt))
        offsets = [0]
        for t in lp["tokens"][:-1]:
            offsets.append(offsets[-1] + len(t))
        assert lp["text_offset"] == offsets
        bound, exact = oracle_bound(tiny("default"), prompt)
        ref, tol = exact.log_softmax(-1), 2 * bound
        for i in range(1, len(prompt)):
            assert abs(lp["token_logprobs"][i] - float(ref[i - 1, prompt[i]])) <= tol
            want = {}  # keyed by text: of two tokens with one text, the likelier one
            for v, t in zip(*ref[i - 1].topk(2)):
                want.setdefault(tok.decode([int(t)]), float(v))
            got = lp["top_logprobs"][i]
            assert set(got) == set(want) and all(abs(got[s] - want[s]) <= tol for s in want)
        # the generated token is greedy: its logprob is the top one
        assert lp["token_logprobs"][-1] == max(lp["top_logprobs"][-1].values())
    assert body["usage"]["prompt_tokens"] == sum(map(len, PROMPTS)) and body["usage"]["completion_tokens"] == 2


def test_echo_agrees_with_prompt_logprobs(server):
    prompt = PROMPTS[0]
    body = post(server, {"prompt": prompt, "echo": True, "logprobs": 1, "prompt_logprobs": 3, "max_tokens": 1})
    choice = body["choices"][0]
    plp = choice["prompt_logprobs"]
    for i in range(1, len(prompt)):
        assert plp[i][str(prompt[i])]["logprob"] == choice["logprobs"]["token_logprobs"][i]
        assert len([e for e in plp[i].values() if e["rank"] <= 3]) == 3  # its own top 3, not echo's top 1
        assert len(choice["logprobs"]["top_logprobs"][i]) == 1


def test_echo_max_tokens_zero_returns_the_prompt_alone(server):
    tok = server.engine.tokenizer
    body = post(server, {"prompt": "Once upon a time", "echo": True, "max_tokens": 0, "logprobs": 0})
    choice = body["choices"][0]
    ids = tok.encode("Once upon a time")
    assert choice["text"] == "Once upon a time" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == [tok.decode([t]) for t in ids]
    assert choice["logprobs"]["token_logprobs"][0] is None and len(choice["logprobs"]["token_logprobs"]) == len(ids)
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(ids)
    plain = post(server, {"prompt": PROMPTS[1], "echo": True, "max_tokens": 3, "n": 2, "seed": 1})
    for choice in plain["choices"]:
        assert choice["text"].startswith(tok.decode(PROMPTS[1])) and choice["logprobs"] is None


def test_echo_streamed_equals_not_streamed(server):
    body = {"prompt": PROMPTS[0], "echo": True, "logprobs": 1, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    whole = post(server, body)["choices"][0]
    text, lp = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                text += choice["text"]
                for key in lp:
                    lp[key] += (choice["logprobs"] or {}).get(key, [])
    assert text == whole["text"] and lp == whole["logprobs"]
    zero = {"prompt": "abc", "echo": True, "max_tokens": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=zero, timeout=120) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert len(events) == 2 and '"text":"abc"' in events[0] and '"finish_reason":"length"' in events[0]


def test_echo_errors(server):
    for body, param in (({"prompt": "x", "max_tokens": 0}, "max_tokens"),
                        ({"prompt": "x", "echo": True, "logprobs": 6}, "logprobs")):
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
