"""Servers for the operator-tool tests: a scripted tiny server (chosen prompts get a fixed answer,
the rest go to the real engine) and a fault-injecting proxy in front of a real server."""


import json
import threading
from pathlib import Path
import time

from tpserve.engine.outputs import CompletionOutput, RequestOutput


class ScriptedStream:
    """A RequestStream that plays `text` in pieces of `step` characters, one token per piece."""

    def __init__(self, request_id, prompt_ids, text, step=4):
        self.request_id, self.arrival, self.prompt_ids = request_id, time.monotonic(), prompt_ids
        self.text, self.step = text, step

    async def __aiter__(self):
        ends = list(range(self.step, len(self.text), self.step)) + [len(self.text)]
        for k, end in enumerate(ends):
            done = end == len(self.text)
            c = CompletionOutput(0, self.text[:end], list(range(k + 1)), finish_reason="stop" if done else None)
            yield RequestOutput(self.request_id, None, self.prompt_ids, [c], finished=done)


def script(server, answers) -> None:
    """Make `server` (a LocalServer) answer prompts with scripted text: `answers(prompt_text)`
    returns the text to play, or None to let the real engine answer."""
    tok = server.engine.engine.tokenizer
    real_add = server.engine.add

    def add(rid, ids, params, prompt=None, **kw):
        text = answers(tok.decode(ids))
        return real_add(rid, ids, params, prompt, **kw) if text is None else ScriptedStream(rid, ids, text)

    server.engine.add = add


FIXTURES = Path(__file__).parent / "fixtures"


def _gsm8k_answers() -> dict:
    rows = [json.loads(x) for x in (FIXTURES / "gsm8k" / "test.jsonl").read_text().splitlines() if x.strip()]
    # the first two right, the third wrong
    return {r["question"]: " Worked out.\n#### " + (r["answer"].split("####")[1].strip() if k < 2 else "-1")
            for k, r in enumerate(rows)}


def _humaneval_answers() -> dict:
    rows = [json.loads(x) for x in (FIXTURES / "humaneval.jsonl").read_text().splitlines() if x.strip()]
    # Fixture/0 right, Fixture/1 wrong, Fixture/2 tries the network (must fail in the sandbox)
    return {r["prompt"]: r["canonical_solution"] if r["task_id"] != "Fixture/1" else "    return n % 2 == 1\n"
            for r in rows}


def good_answers(prompt: str) -> str | None:
    """A good model's answers to the smoke checks and the quality tasks (else: the tiny model)."""
    if "Count from 1 to 200" in prompt:
        if prompt.endswith("<think>"):  # a chat, thinking on
            return "The numbers from 1 to 200.</think>Here they are: " + ", ".join(map(str, range(1, 201))) + "."
        if prompt.endswith("<think></think>"):
            return ", ".join(map(str, range(1, 201)))
        return " " + ", ".join(str(i) for i in range(4, 201)) + "."
    if prompt.endswith("\nAnswer:") and "Question:" in prompt:
        question = prompt.rsplit("Question: ", 1)[1][:-len("\nAnswer:")]
        return _gsm8k_answers().get(question)
    for head, body in _humaneval_answers().items():
        if prompt.endswith(head):
            return body
    return smoke_answers(prompt)


def smoke_answers(prompt: str) -> str | None:
    """What a good model would say to the smoke checks (the rest: the tiny model itself)."""
    thinking_off = prompt.endswith("<think></think>")
    if "What is the capital of France?" in prompt:
        return "Paris."
    if "Is 17 a prime" in prompt:
        return "Yes." if thinking_off else "Only 1 and 17 divide it.</think>Yes."
    if "Reply with only the word OK" in prompt:
        return "OK"
    if "weather in Paris" in prompt:
        return ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>")
    return None


class ThreadServer:
    """uvicorn serving `app` on a free localhost port, in a thread."""

    def __init__(self, app):
        import uvicorn

        from tpserve.engine.tp.launch import free_port

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


def fault_proxy(upstream: str, fault: str) -> ThreadServer:
    """A proxy to `upstream` that breaks one thing. fault: "max_tokens" (one token too many in
    usage and in streams), "http500" (every POST fails), "broken_sse" (streams cut after two
    events, with an undecodable event and no [DONE]), "cached" (streamed usage claims 3 cached
    prompt tokens), "no_cached" (streamed usage without prompt_tokens_details), "divergent"
    (non-streamed completions: the 4th token of choices[].logprobs.tokens changed)."""
    import httpx
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def proxy(path: str, request: Request):
        body = await request.body()
        if request.method == "POST" and fault == "http500":
            return JSONResponse({"error": {"message": "injected fault", "type": "InternalServerError",
                                           "param": None, "code": 500}}, status_code=500)
        client = httpx.AsyncClient(timeout=120)
        upstream_req = client.build_request(request.method, f"{upstream}/{path}", content=body,
                                            headers={"content-type": "application/json"})
        r = await client.send(upstream_req, stream=True)
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            data = await r.aread()
            await client.aclose()
            if fault == "divergent" and r.status_code == 200 and path.endswith("completions"):
                doc = json.loads(data)
                for ch in doc["choices"]:  # the 4th generated token replaced
                    if ch.get("logprobs") and len(ch["logprobs"]["tokens"]) > 3:
                        ch["logprobs"]["tokens"][3] += "~"
                data = json.dumps(doc).encode()
            if fault == "max_tokens" and r.status_code == 200 and path.endswith("completions"):
                doc = json.loads(data)
                doc["usage"]["completion_tokens"] += 1
                doc["usage"]["total_tokens"] += 1
                data = json.dumps(doc).encode()
            return Response(data, status_code=r.status_code, media_type=r.headers.get("content-type"))

        async def events():
            n = 0
            try:
                async for line in r.aiter_lines():
                    if not line.strip():
                        continue
                    n += 1
                    if fault == "broken_sse" and n == 3:
                        yield "data: {\"choices\": [{\"text\": \"cut\n\n"
                        return
                    if fault == "max_tokens" and line.startswith("data: {"):
                        doc = json.loads(line[6:])
                        if doc.get("usage"):
                            doc["usage"]["completion_tokens"] += 1
                        elif n == 1 and doc.get("choices"):
                            yield f"data: {json.dumps(doc)}\n\n"  # the first token event twice
                        line = f"data: {json.dumps(doc)}"
                    if fault in ("cached", "no_cached") and line.startswith("data: {") and '"usage"' in line:
                        doc = json.loads(line[6:])
                        if doc.get("usage"):
                            if fault == "cached":
                                doc["usage"]["prompt_tokens_details"] = {"cached_tokens": 3}
                            else:
                                doc["usage"].pop("prompt_tokens_details", None)
                        line = f"data: {json.dumps(doc)}"
                    yield line + "\n\n"
            finally:
                await r.aclose()
                await client.aclose()

        return StreamingResponse(events(), media_type="text/event-stream")

    return ThreadServer(app)
