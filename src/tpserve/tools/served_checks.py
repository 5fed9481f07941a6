"""The demo model's acceptance checks that go through the OpenAI server (started in this process):

tools        30 prompts that name a tool held out of training: the share of valid calls.
plain_tools  30 prompts that ask in plain words and never name the tool, tools of held-out topics and
             names (train/plain_tools.py): valid calls (parsed, a declared tool, arguments valid for its
             schema), the right tool, the right tool with the request's arguments.
one_word     20 questions asked for a one-word answer (thinking off): the answer, and nothing more.
clients      what a user runs against the server: `tpserve smoke`, `tpserve quality count` (a chat
             message, and --raw) and `tpserve agent-tools` (5 tasks, streamed and not).
Every request is greedy; tool prompts are also streamed and the streamed answer compared.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from tqdm import tqdm

from tpserve.train import answers, corpus, plain_tools

TOOL_PROMPTS = 30
TOOL_SEED = 20261201
PLAIN_SEED = 20261217
ONE_WORD_PROMPTS = 20
ONE_WORD_SEED = 20261218


class Served:
    """The model behind the OpenAI server in this process, as `tpserve serve` runs it (dtype auto:
    float32 on the CPU, bfloat16 on a GPU)."""

    def __init__(self, model_dir: Path, device: str = "cpu"):
        from tpserve.config import EngineConfig
        from tpserve.server.local import LocalServer

        self.server = LocalServer(EngineConfig(model=str(model_dir), device=device, dtype="auto"),
                                  served_model_names=["demo"])
        self.url = self.server.url

    def close(self) -> None:
        self.server.close()


def held_out_tool_cases(n: int = TOOL_PROMPTS, seed: int = TOOL_SEED) -> list[dict]:
    """Prompts that name the tool: tools with held-out names and argument schemas."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        tools = [corpus.make_tool(rng, held_out=True) for _ in range(rng.randint(1, 3))]
        tool = rng.choice(tools)
        args = corpus.tool_arguments(rng, tool)
        cases.append({"tools": tools, "user": corpus.tool_request(rng, tool["function"]["name"], args),
                      "thinking": rng.random() < 0.5})
    return cases


def schema_errors(args, schema: dict) -> list[str]:
    """The few JSON-schema rules our tools use: object, required, properties' type and enum."""
    if not isinstance(args, dict):
        return ["arguments are not an object"]
    errors = [f"missing {k}" for k in schema.get("required", []) if k not in args]
    props = schema.get("properties", {})
    kinds = {"string": str, "integer": int, "number": (int, float), "boolean": bool}
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            errors.append(f"unknown argument {key}")
            continue
        want = kinds[spec["type"]]
        if isinstance(value, bool) and spec["type"] != "boolean" or not isinstance(value, want):
            errors.append(f"{key}: not {spec['type']}")
        if "enum" in spec and value not in spec["enum"]:
            errors.append(f"{key}: not in enum")
    return errors


def _stream(client, body: dict) -> dict:
    calls: dict[int, list[str]] = {}
    content = []
    with client.stream("POST", "/v1/chat/completions", json=dict(body, stream=True)) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:])["choices"]
            delta = choices[0]["delta"] if choices else {}
            content.append(delta.get("content") or "")
            for tc in delta.get("tool_calls") or []:
                entry = calls.setdefault(tc["index"], ["", ""])
                fn = tc.get("function") or {}
                entry[0] += fn.get("name") or ""
                entry[1] += fn.get("arguments") or ""
    return {"calls": [tuple(calls[i]) for i in sorted(calls)], "content": "".join(content)}


def _tool_answer(url: str, case: dict) -> dict:
    """One tool prompt, plain and streamed: its calls, whether they are valid, whether both agree."""
    import httpx

    body = {"model": "demo", "messages": [{"role": "user", "content": case["user"]}], "tools": case["tools"],
            "temperature": 0, "max_tokens": 200, "chat_template_kwargs": {"enable_thinking": case["thinking"]}}
    with httpx.Client(base_url=url, timeout=3600) as client:
        plain = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        streamed = _stream(client, body)
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in plain.get("tool_calls") or []]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case["tools"]}
    valid = bool(calls) and all(name in schemas and not schema_errors(json.loads(arguments), schemas[name])
                                for name, arguments in calls)
    same = calls == streamed["calls"] and (plain.get("content") or "") == streamed["content"]
    return {"valid": valid, "same": same, "user": case["user"], "calls": calls, "content": plain.get("content")}


def _all(url: str, cases: list[dict], desc: str) -> list[dict]:
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:  # all prompts at once: the engine batches them
        return list(tqdm(pool.map(lambda c: _tool_answer(url, c), cases), total=len(cases), desc=desc))


def check_tools(served: Served) -> dict:
    results = _all(served.url, held_out_tool_cases(), "tool prompts")
    return {"prompts": len(results), "valid": sum(r["valid"] for r in results),
            "stream_equal": sum(r["same"] for r in results), "cases": results}


def check_plain_tools(served: Served, n: int = TOOL_PROMPTS, strict: bool = False) -> dict:
    cases = plain_tools.plain_tool_cases(n, PLAIN_SEED)
    if strict:  # OpenAI's strict function calling: the server holds every call to a declared tool and its schema
        cases = [{**c, "tools": [{**t, "function": {**t["function"], "strict": True}} for t in c["tools"]]}
                 for c in cases]
    results = _all(served.url, cases, "plain-words tool prompts")
    for case, r in zip(cases, results):
        want = case["want"]
        r["want"] = want
        r["right_tool"] = [name for name, _ in r["calls"]] == [want["name"]]
        r["right_args"] = r["right_tool"] and json.loads(r["calls"][0][1]) == want["arguments"]
    return {"prompts": len(results), "valid": sum(r["valid"] for r in results),
            "right_tool": sum(r["right_tool"] for r in results), "right_args": sum(r["right_args"] for r in results),
            "stream_equal": sum(r["same"] for r in results), "cases": results}


def one_word_cases(n: int = ONE_WORD_PROMPTS, seed: int = ONE_WORD_SEED) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [answers.one_word_qa(rng)[:2] for _ in range(n)]


def check_one_word(served: Served) -> dict:
    """Right when the answer, less a final period, is the expected word (any case) and the turn ends."""
    import httpx

    def one(case):
        user, want = case
        body = {"model": "demo", "messages": [{"role": "user", "content": user}], "temperature": 0, "max_tokens": 32,
                "chat_template_kwargs": {"enable_thinking": False}}
        with httpx.Client(base_url=served.url, timeout=3600) as client:
            choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        text = (choice["message"].get("content") or "").strip()
        ok = choice["finish_reason"] == "stop" and text.rstrip(".").lower() == want.rstrip(".").lower()
        return {"user": user, "want": want, "answer": text, "ok": ok}

    cases = one_word_cases()
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        results = list(tqdm(pool.map(one, cases), total=len(cases), desc="one-word answers"))
    return {"prompts": len(results), "right": sum(r["ok"] for r in results), "cases": results}


def check_clients(served: Served) -> dict:
    """smoke, quality count (chat and raw) and agent-tools, as their commands run them."""
    import tempfile

    from tpserve.tools.agent_tools import TASKS, run_task
    from tpserve.tools.client import Client
    from tpserve.tools.quality.compare import run_count
    from tpserve.tools.smoke import run_checks

    c = Client(served.url, None, "demo", timeout=3600)
    try:
        smoke = run_checks(c, SimpleNamespace(expect="Paris", expect_short="OK", max_tokens=256, only=None,
                                              served_model="demo"))
        count = {mode: run_count(SimpleNamespace(max_tokens=1200, raw=mode == "raw"), [c])[0]["results"][0]
                 for mode in ("chat", "raw")}
        agent = [run_task(c, name, stream, 6, 512) for name in tqdm(TASKS, desc="agent-tools")
                 for stream in (False, True)]
    finally:
        c.close()
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="agent-tools-", delete=False) as f:
        json.dump(agent, f, indent=2)
    return {"smoke": {r["check"]: r["ok"] for r in smoke}, "smoke_passed": sum(r["ok"] for r in smoke),
            "smoke_reasons": {r["check"]: r["reason"] for r in smoke},
            "count": {mode: {"ok": r["ok"], "reason": r["reason"]} for mode, r in count.items()},
            "agent_tools": {f"{r['task']}-{'stream' if r['stream'] else 'plain'}": r["reason"] for r in agent},
            "agent_tools_passed": sum(r["ok"] for r in agent), "agent_tools_transcripts": f.name}
