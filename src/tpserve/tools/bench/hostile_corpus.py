"""A hand-written corpus of hostile requests and the status each must get (no 500, ever).

Each case is (name, method, path, raw body bytes or None, expected statuses). `run_corpus` sends
them all to a live server and returns the cases whose status was not an expected one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

CHAT, COMP, TOK, DETOK = "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"
RESP = "/v1/responses"
USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    body: bytes | None
    expect: tuple[int, ...]


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


def _raw(text: str) -> bytes:
    return text.encode()


def cases(max_request_bytes: int = 8 << 20) -> Iterator[Case]:
    bad = (400,)
    # lone / reversed UTF-16 surrogates (json.dumps escapes them as \ud800: valid JSON, invalid Unicode)
    for where, path, body in [
        ("chat content", CHAT, {"messages": [{"role": "user", "content": "a\ud800b"}], "max_tokens": 1}),
        ("chat reversed pair", CHAT, {"messages": [{"role": "user", "content": "\udc00\ud800"}], "max_tokens": 1}),
        ("completions prompt", COMP, {"prompt": "\ud800", "max_tokens": 1}),
        ("completions prompt list", COMP, {"prompt": ["ok", "\udfff"], "max_tokens": 1}),
        ("tokenize prompt", TOK, {"prompt": "\ud800"}),
        ("responses input", RESP, {"input": "a\ud800b", "max_output_tokens": 1}),
        ("responses function_call arguments", RESP, {"input": [{"type": "function_call", "call_id": "c", "name": "f",
                                                    "arguments": json.dumps({"k": "\ud800"})}]}),
        ("tokenize messages", TOK, {"messages": [{"role": "user", "content": "\ud800"}]}),
        ("stop string", COMP, {"prompt": "x", "stop": ["\ud800"], "max_tokens": 1}),
        ("tool name", CHAT, {"messages": USER, "tools": [{"type": "function", "function": {"name": "f\ud800"}}]}),
        ("json key", CHAT, {"messages": USER, "chat_template_kwargs": {"\ud800": 1}}),
        ("tool-argument key", CHAT, {"messages": [{"role": "assistant", "tool_calls": [{"type": "function",
                                     "function": {"name": "f", "arguments": json.dumps({"\ud800": 1})}}]},
                                     {"role": "user", "content": "x"}], "max_tokens": 1}),
    ]:
        yield Case(f"surrogate: {where}", "POST", path, _j(body), bad)
    # chat_template_kwargs values of the wrong type
    for value in (5, None, {"a": [1]}):
        for key in ("reasoning_effort", "enable_thinking", "tools", "messages", "foo"):
            yield Case(f"chat_template_kwargs.{key}={str(value)[:12]}", "POST", CHAT,
                       _j({"messages": USER, "max_tokens": 1, "chat_template_kwargs": {key: value}}), (200, 400))
    # nesting
    for depth in (100, 100_000):
        yield Case(f"nested {depth} deep", "POST", CHAT, _raw('{"messages":' + "[" * depth + "]" * depth + "}"), bad)
        yield Case(f"nested {depth} deep objects", "POST", COMP,
                   _raw('{"prompt":"x","user":' + '{"a":' * depth + "1" + "}" * depth + "}"), bad)
    # numbers
    for field in ("temperature", "top_p", "max_tokens", "n", "seed", "presence_penalty", "top_k"):
        for literal in ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 5000, "1e308",
                        "123456789012345678901234567890", "-5", "0", "true", '"5"', "5.5", "null", "[]", "{}"):
            yield Case(f"{field}={literal[:12]}", "POST", COMP,
                       _raw('{"prompt":"x","max_tokens":1,' + f'"{field}":{literal}' + "}")
                       if field != "max_tokens" else _raw('{"prompt":"x",' + f'"max_tokens":{literal}' + "}"),
                       (200, 400))
    for mt in (-1, 0, 10**9, 2**63, 2**64 + 1):
        yield Case(f"max_tokens {mt}", "POST", COMP, _j({"prompt": "x", "max_tokens": mt}), bad)
        yield Case(f"max_completion_tokens {mt}", "POST", CHAT, _j({"messages": USER, "max_completion_tokens": mt}),
                   bad)
    # messages
    for name, msgs in [("empty", []), ("not a list", "hi"), ("null", None), ("role wizard", [{"role": "wizard",
                       "content": "x"}]), ("role int", [{"role": 5, "content": "x"}]), ("no role", [{"content": "x"}]),
                       ("content int", [{"role": "user", "content": 5}]), ("content null", [{"role": "user"}]),
                       ("image part", [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]),
                       ("part no text", [{"role": "user", "content": [{"type": "text"}]}]),
                       ("message a string", ["hello"]), ("tool_calls dict", [{"role": "assistant", "tool_calls": {}}]),
                       ("arguments list", [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
                                           "arguments": "[1]"}}]}]),
                       ("arguments not json", [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
                                               "arguments": "{"}}]}])]:
        yield Case(f"messages: {name}", "POST", CHAT, _j({"messages": msgs, "max_tokens": 1}), bad)
    # bodies that are not JSON objects
    for name, raw in [("binary garbage", bytes(range(256)) * 4), ("invalid utf-8", b'{"prompt":"\xff\xfe\xc3"}'),
                      ("utf-16 bom", '{"prompt":"x"}'.encode("utf-16")), ("empty body", b""), ("null", b"null"),
                      ("array", b"[1,2]"), ("string", b'"x"'), ("truncated", b'{"prompt":"x"'),
                      ("trailing garbage", b'{"prompt":"x"} x'), ("nul byte", b'{"prompt":"\x00"}')]:
        for path in (CHAT, COMP, TOK, DETOK, RESP):
            yield Case(f"{name} -> {path}", "POST", path, raw, bad)
    # size
    big = max_request_bytes + 1024
    yield Case("body over the limit", "POST", COMP, _j({"prompt": "a" * big, "max_tokens": 1}), (413,))
    yield Case("10 MB prompt", "POST", COMP, _j({"prompt": "a " * (5 << 20), "max_tokens": 1}), (413,))
    half = max_request_bytes // 2
    yield Case("prompt longer than max_model_len", "POST", COMP, _j({"prompt": "ab " * (half // 3)}), bad)
    yield Case("chat longer than max_model_len", "POST", CHAT,
               _j({"messages": [{"role": "user", "content": "ab " * (half // 3)}]}), bad)
    yield Case("tokenize a huge prompt", "POST", TOK, _j({"prompt": "ab " * (half // 3)}), bad)
    yield Case("responses input longer than max_model_len", "POST", RESP, _j({"input": "ab " * (half // 3)}), bad)
    yield from _responses_cases()
    # fields
    for name, body in [("unknown field", {"prompt": "x", "frobnicate": 1}), ("stream yes", {"prompt": "x",
                       "stream": "yes"}), ("stream_options alone", {"prompt": "x", "stream_options": {}}),
                       ("prompt []", {"prompt": []}), ("prompt [[]]", {"prompt": [[]]}),
                       ("prompt ids negative", {"prompt": [-1]}), ("prompt id huge", {"prompt": [10**12]}),
                       ("prompt mixed", {"prompt": [1, "a"]}), ("prompt bool ids", {"prompt": [True]}),
                       ("stop empty", {"prompt": "x", "stop": [""]}), ("echo yes", {"prompt": "x", "echo": "yes"}),
                       ("best_of", {"prompt": "x", "best_of": 3}), ("logprobs 99", {"prompt": "x", "logprobs": 99}),
                       ("logit_bias key", {"prompt": "x", "logit_bias": {"abc": 1}}),
                       ("logit_bias value", {"prompt": "x", "logit_bias": {"5": 1000}}),
                       ("logit_bias token out of vocab", {"prompt": "x", "logit_bias": {"999999999": 1}}),
                       ("response_format xml", {"prompt": "x", "response_format": {"type": "xml"}}),
                       ("json_schema missing", {"prompt": "x", "response_format": {"type": "json_schema"}}),
                       ("no prompt", {}), ("stop_token_ids strings", {"prompt": "x", "stop_token_ids": ["a"]}),
                       ("structured_outputs two kinds", {"prompt": "x", "structured_outputs": {"regex": "a",
                                                                                               "choice": ["b"]}}),
                       ("structured_outputs bad regex", {"prompt": "x", "structured_outputs": {"regex": "(("}}),
                       ("min_tokens over max_tokens", {"prompt": "x", "max_tokens": 2, "min_tokens": 3})]:
        yield Case(name, "POST", COMP, _j(body), bad)
    for name, body in [("tool_choice unknown name", {"messages": USER, "tools": TOOLS, "tool_choice": {
                        "type": "function", "function": {"name": "nope"}}}),
                       ("tool_choice required, no tools", {"messages": USER, "tool_choice": "required"}),
                       ("tools not a list", {"messages": USER, "tools": {"a": 1}}),
                       ("tool name with space", {"messages": USER, "tools": [{"type": "function",
                                                 "function": {"name": "a b"}}]}),
                       ("top_logprobs without logprobs", {"messages": USER, "top_logprobs": 2}),
                       ("reasoning_effort int", {"messages": USER, "reasoning_effort": 3}),
                       ("reasoning_effort weird", {"messages": USER, "reasoning_effort": "ultra"}),
                       ("enable_thinking string", {"messages": USER, "chat_template_kwargs": {"enable_thinking": "no"}}),
                       ("functions (legacy)", {"messages": USER, "functions": [{"name": "f"}]}),
                       ("modalities audio", {"messages": USER, "modalities": ["text", "audio"]}),
                       ("metadata 17 keys (chat)", {"messages": USER, "metadata": {str(i): "v" for i in range(17)}}),
                       ("service_tier unknown", {"messages": USER, "service_tier": "fast"})]:
        yield Case(name, "POST", CHAT, _j(body), bad)
    yield Case("tokenize prompt and messages", "POST", TOK, _j({"prompt": "x", "messages": USER}), bad)
    yield Case("tokenize neither", "POST", TOK, _j({}), bad)
    yield Case("detokenize negative", "POST", DETOK, _j({"tokens": [-1]}), bad)
    yield Case("detokenize huge", "POST", DETOK, _j({"tokens": [10**20]}), bad)
    yield Case("detokenize strings", "POST", DETOK, _j({"tokens": ["a"]}), bad)
    # models and routes
    yield Case("unknown model", "POST", COMP, _j({"prompt": "x", "model": "gpt-9"}), (404,))
    yield Case("unknown model (chat)", "POST", CHAT, _j({"messages": USER, "model": "gpt-9"}), (404,))
    yield Case("unknown model (responses)", "POST", RESP, _j({"input": "x", "model": "gpt-9"}), (404,))
    yield Case("wrong method (responses)", "GET", RESP, None, (405,))
    yield Case("GET unknown model", "GET", "/v1/models/gpt-9", None, (404,))
    yield Case("unknown route", "GET", "/v1/nope", None, (404,))
    yield Case("wrong method", "GET", COMP, None, (405,))
    yield Case("wrong method (delete)", "DELETE", "/v1/models", None, (405,))
    # still answering normally afterwards
    yield Case("valid completion", "POST", COMP, _j({"prompt": "x", "max_tokens": 2}), (200,))
    yield Case("valid chat", "POST", CHAT, _j({"messages": USER, "max_tokens": 2}), (200,))
    yield Case("valid response", "POST", RESP, _j({"input": USER, "max_output_tokens": 2}), (200,))


def _responses_cases() -> Iterator[Case]:
    """/v1/responses: items, tools and the stateful features it refuses (400 naming the field)."""
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    for name, body in [("input empty list", {"input": []}), ("input null", {"input": None}),
                       ("input int", {"input": 5}), ("no input", {}), ("item a string", {"input": ["hi"]}),
                       ("item no role", {"input": [{}]}),
                       ("item role tool", {"input": [{"role": "tool", "content": "x"}]}),
                       ("item image", {"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
                       ("item file type", {"input": [{"type": "file_search_call"}]}),
                       ("item content null", {"input": [{"role": "user", "content": None}]}),
                       ("call no name", {"input": [{**call, "name": ""}]}),
                       ("call arguments list", {"input": [{**call, "arguments": "[1]"}]}),
                       ("call arguments dict", {"input": [{**call, "arguments": {}}]}),
                       ("call output no id", {"input": [{"type": "function_call_output", "output": "x"}]}),
                       ("reasoning only", {"input": [{"type": "reasoning", "summary": []}]}),
                       ("web_search tool", {"input": "x", "tools": [{"type": "web_search"}]}),
                       ("tool without type", {"input": "x", "tools": [{"name": "f"}]}),
                       ("tool_choice unknown", {"input": "x", "tools": [{"type": "function", "name": "f"}],
                                                "tool_choice": {"type": "function", "name": "g"}}),
                       ("tool_choice file_search", {"input": "x", "tool_choice": {"type": "file_search"}}),
                       ("previous_response_id", {"input": "x", "previous_response_id": "resp_1"}),
                       ("background", {"input": "x", "background": True, "store": True}),
                       ("prompt template", {"input": "x", "prompt": {"id": "p"}}),
                       ("logprobs include", {"input": "x", "include": ["message.output_text.logprobs"]}),
                       ("top_logprobs", {"input": "x", "top_logprobs": 5}),
                       ("truncation auto", {"input": "x", "truncation": "auto"}),
                       ("metadata 17 keys", {"input": "x", "metadata": {str(i): "v" for i in range(17)}}),
                       ("metadata long value", {"input": "x", "metadata": {"k": "v" * 513}}),
                       ("text format xml", {"input": "x", "text": {"format": {"type": "xml"}}}),
                       ("json_schema no schema", {"input": "x", "text": {"format": {"type": "json_schema",
                                                                                    "name": "a"}}}),
                       ("reasoning effort ultra", {"input": "x", "reasoning": {"effort": "ultra"}}),
                       ("max_tool_calls", {"input": "x", "max_tool_calls": 2}),
                       ("stream yes", {"input": "x", "stream": "yes"})]:
        yield Case(f"responses: {name}", "POST", RESP, _j(body), (400,))
    for mt in (-1, 0, 2**64 + 1):
        yield Case(f"max_output_tokens {mt}", "POST", RESP, _j({"input": "x", "max_output_tokens": mt}), (400,))


def run_corpus(url: str, *, headers: dict | None = None, max_request_bytes: int = 8 << 20,
               timeout: float = 60.0) -> tuple[int, list[tuple[Case, int, str]]]:
    """(cases sent, [(case, status, body head) for each case with an unexpected status])."""
    import httpx

    wrong = []
    sent = 0
    with httpx.Client(base_url=url, timeout=timeout, headers=headers or {}) as client:
        for case in cases(max_request_bytes):
            print(case.name, flush=True) if __import__("os").environ.get("CORPUS_DEBUG") else None
            r = client.request(case.method, case.path, content=case.body,
                               headers={"content-type": "application/json"} if case.body is not None else None)
            sent += 1
            if r.status_code not in case.expect or (r.status_code >= 400 and not _openai_error(r)):
                wrong.append((case, r.status_code, r.text[:300]))
    return sent, wrong


def _openai_error(r) -> bool:
    try:
        err = r.json()["error"]
        return isinstance(err["message"], str) and "type" in err and "param" in err and "code" in err
    except Exception:  # noqa: BLE001 - not JSON, or not the shape
        return False
