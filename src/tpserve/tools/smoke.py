"""`tpserve smoke --url U`: a quick check of a running OpenAI-compatible server after a restart.

Nine checks, each PASS or FAIL with the reason; exit code 1 on any failure (2 when the server
cannot be reached at all). A model that answers badly fails `factual`, `reasoning-on`,
`short-answer` and `tool-call` (answers set by --expect / --expect-short); `models`,
`reasoning-off`, `max-tokens-5`, `over-context-400` and `stream-agrees` judge the server's
protocol whatever the model says (the random built-in tiny model passes exactly those).
"""

from __future__ import annotations

import json

from tpserve.tools.client import ApiError, Client, ToolError, add_client_args, collect_chat_stream, emit_json, friendly

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def register(sub, bench, tune) -> None:
    p = sub.add_parser("smoke", help="PASS/FAIL checks of a running server")
    add_client_args(p)
    p.add_argument("--expect", default="Paris", help="substring the factual answer must contain (default: Paris)")
    p.add_argument("--expect-short", default="OK", help="substring the short answer must contain (default: OK)")
    p.add_argument("--max-tokens", type=int, default=256, help="budget of the open-ended checks")
    p.add_argument("--only", default=None, help="comma-separated checks to run (default: all): "
                   + ", ".join(name for name, _ in CHECKS))
    p.set_defaults(func=run)


def _chat(c: Client, content: str, **kw) -> dict:
    body = {"model": c.model, "messages": [{"role": "user", "content": content}], "temperature": 0}
    body.update(kw)
    return c.post("/v1/chat/completions", body)


def _thinking(on: bool) -> dict:
    return {"chat_template_kwargs": {"enable_thinking": on}}


def _msg(r: dict) -> dict:
    choices = r.get("choices") or []
    if not choices or not isinstance(choices[0].get("message"), dict):
        raise ToolError("response has no choices[0].message")
    return choices[0]


def _reasoning(m: dict) -> str:
    return m.get("reasoning_content") or m.get("reasoning") or ""


def check_models(c: Client, a) -> str:
    ids = [m.get("id") for m in c.models()]
    if not ids:
        raise AssertionError("GET /v1/models lists no model")
    if a.served_model and a.served_model not in ids:
        raise AssertionError(f"{a.served_model!r} is not among {ids}")
    return f"{len(ids)} listed: {', '.join(map(str, ids[:3]))}"


def check_factual(c: Client, a) -> str:
    ch = _msg(_chat(c, "What is the capital of France? Answer in one word.", max_tokens=a.max_tokens,
                    **_thinking(False)))
    text = ch["message"].get("content") or ""
    if a.expect.lower() not in text.lower():
        raise AssertionError(f"answer does not contain {a.expect!r}: {text[:80]!r}")
    return f"answer contains {a.expect!r}"


def check_reasoning_on(c: Client, a) -> str:
    ch = _msg(_chat(c, "Is 17 a prime number?", max_tokens=a.max_tokens, **_thinking(True)))
    m = ch["message"]
    if not _reasoning(m):
        raise AssertionError("no reasoning_content with thinking on")
    if "<think>" in (m.get("content") or "") or "</think>" in (m.get("content") or ""):
        raise AssertionError("think tags leaked into content")
    return f"{len(_reasoning(m))} chars of reasoning, separate from content"


def check_reasoning_off(c: Client, a) -> str:
    ch = _msg(_chat(c, "Is 17 a prime number?", max_tokens=a.max_tokens, **_thinking(False)))
    m = ch["message"]
    if _reasoning(m):
        raise AssertionError(f"reasoning_content with thinking off: {_reasoning(m)[:60]!r}")
    if not m.get("content"):
        raise AssertionError("empty content with thinking off")
    return "no reasoning, answer in content"


def check_short(c: Client, a) -> str:
    ch = _msg(_chat(c, f"Reply with only the word {a.expect_short} and nothing else.", max_tokens=a.max_tokens,
                    **_thinking(False)))
    text = (ch["message"].get("content") or "").strip()
    if ch.get("finish_reason") != "stop":
        raise AssertionError(f"finish_reason {ch.get('finish_reason')!r} (not 'stop') after {len(text)} chars")
    if a.expect_short.lower() not in text.lower() or len(text) > 4 * len(a.expect_short) + 16:
        raise AssertionError(f"not a short answer containing {a.expect_short!r}: {text[:80]!r}")
    return f"{text!r}"


def check_tool_call(c: Client, a) -> str:
    ch = _msg(_chat(c, "What is the weather in Paris right now? Use the tool.", max_tokens=a.max_tokens,
                    tools=[WEATHER_TOOL], tool_choice="auto", **_thinking(False)))
    calls = ch["message"].get("tool_calls") or []
    if not calls:
        raise AssertionError(f"no tool_calls (finish_reason {ch.get('finish_reason')!r}, content "
                             f"{(ch['message'].get('content') or '')[:60]!r})")
    fn = calls[0].get("function") or {}
    if fn.get("name") != "get_weather":
        raise AssertionError(f"called {fn.get('name')!r}, not get_weather")
    try:
        args = json.loads(fn.get("arguments") or "")
    except ValueError:
        raise AssertionError(f"arguments are not JSON: {fn.get('arguments')!r}") from None
    if not isinstance(args, dict) or "city" not in args:
        raise AssertionError(f"arguments lack 'city': {args!r}")
    if ch.get("finish_reason") != "tool_calls" or not calls[0].get("id"):
        raise AssertionError(f"finish_reason {ch.get('finish_reason')!r} or no call id")
    return f"get_weather({json.dumps(args)})"


def check_max_tokens(c: Client, a) -> str:
    r = c.post("/v1/completions", {"model": c.model, "prompt": "Count: 1, 2, 3,", "max_tokens": 5,
                                   "temperature": 0, "ignore_eos": True})
    n = (r.get("usage") or {}).get("completion_tokens")
    reason = (r.get("choices") or [{}])[0].get("finish_reason")
    if n != 5 or reason != "length":
        raise AssertionError(f"max_tokens=5 gave completion_tokens={n}, finish_reason={reason!r}")
    return "5 tokens, finish_reason 'length'"


def check_over_context(c: Client, a) -> str:
    _ = c.model
    n = (c.max_model_len or 200_000) + 16
    status, body = c.post_raw("/v1/completions", {"model": c.model, "prompt": [100] * n, "max_tokens": 4})
    if status != 400:
        raise AssertionError(f"a {n}-token prompt gave HTTP {status}, not 400")
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str) or "type" not in err:
        raise AssertionError(f"400 body is not OpenAI-shaped: {str(body)[:100]!r}")
    return f"400: {err['message'][:60]}"


def check_stream_agrees(c: Client, a) -> str:
    body = {"model": c.model, "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
            "temperature": 0, "seed": 0, "max_tokens": min(32, a.max_tokens), **_thinking(False)}
    full = _msg(c.post("/v1/chat/completions", body))
    streamed = collect_chat_stream(c.stream("/v1/chat/completions", dict(body, stream_options={"include_usage": True})))
    want = (_reasoning(full["message"]), full["message"].get("content") or "", full.get("finish_reason"))
    got = (streamed["reasoning_content"], streamed["content"], streamed["finish_reason"])
    if want != got:
        raise AssertionError(f"streamed {got[1][:40]!r}/{got[2]} != non-streamed {want[1][:40]!r}/{want[2]}")
    return f"{len(want[1])} chars equal, finish_reason {want[2]!r}"


CHECKS = [("models", check_models), ("factual", check_factual), ("reasoning-on", check_reasoning_on),
          ("reasoning-off", check_reasoning_off), ("short-answer", check_short), ("tool-call", check_tool_call),
          ("max-tokens-5", check_max_tokens), ("over-context-400", check_over_context),
          ("stream-agrees", check_stream_agrees)]


def run_checks(c: Client, args) -> list[dict]:
    from tqdm import tqdm

    rows = []
    only = [x.strip() for x in args.only.split(",")] if getattr(args, "only", None) else None
    unknown = set(only or ()) - {name for name, _ in CHECKS}
    if unknown:
        raise ToolError(f"--only: unknown checks {sorted(unknown)}")
    for name, fn in tqdm([(n, f) for n, f in CHECKS if only is None or n in only], desc="smoke", unit="check",
                         leave=False):
        try:
            rows.append({"check": name, "ok": True, "reason": fn(c, args)})
        except (AssertionError, ApiError) as exc:
            rows.append({"check": name, "ok": False, "reason": str(exc)})
        except ToolError as exc:
            if "connect" in str(exc) or "API key" in str(exc):
                raise
            rows.append({"check": name, "ok": False, "reason": str(exc)})
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            rows.append({"check": name, "ok": False, "reason": f"malformed response: {type(exc).__name__}: {exc}"})
    return rows


@friendly
def run(args) -> int:
    c = Client(args.url, args.api_key, args.served_model)
    try:
        _ = c.model  # reachability, the API key and the model name first: one clear error
        rows = run_checks(c, args)
    finally:
        c.close()
    if args.json_out != "-":
        width = max(len(r["check"]) for r in rows)
        for r in rows:
            print(f"{'PASS' if r['ok'] else 'FAIL'}  {r['check']:<{width}}  {r['reason']}")
        print(f"{sum(r['ok'] for r in rows)}/{len(rows)} passed against {c.url} ({c.model})")
    emit_json(args.json_out, {"url": c.url, "model": c.model, "checks": rows, "passed": all(r["ok"] for r in rows)})
    return 0 if all(r["ok"] for r in rows) else 1
