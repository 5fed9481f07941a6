"""prompt_logprobs on /v1/completions: vLLM's shape, top-k plus the prompt token, 400 when streamed."""

import httpx


def test_prompt_logprobs_shape(live):
    ids = [11, 42, 7, 99, 5]
    r = httpx.post(live.url + "/v1/completions", json={"prompt": ids, "max_tokens": 1, "prompt_logprobs": 2},
                   timeout=60)
    assert r.status_code == 200, r.text
    plp = r.json()["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    for pos in range(1, len(ids)):
        entry = plp[pos]
        assert str(ids[pos]) in entry and 2 <= len(entry) <= 3
        ranks = sorted(v["rank"] for v in entry.values())
        assert ranks[:2] == [1, 2]
        assert all(v["logprob"] <= 0 and isinstance(v["decoded_token"], str) for v in entry.values())
    plain = httpx.post(live.url + "/v1/completions", json={"prompt": ids, "max_tokens": 1}, timeout=60).json()
    assert "prompt_logprobs" not in plain["choices"][0]


def test_prompt_logprobs_streamed_is_400(live):
    r = httpx.post(live.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 1, "prompt_logprobs": 0,
                                                        "stream": True}, timeout=60)
    assert r.status_code == 400 and "prompt_logprobs" in r.json()["error"]["message"]
    r = httpx.post(live.url + "/v1/completions", json={"prompt": [1, 2], "prompt_logprobs": 21}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
