"""A scripted OpenAI chat server that plays a competent agent for `tpserve agent-tools`: it calls
the right tools, reads their results from the `tool` messages, and answers from them. It
answers 400 when a tool message does not answer the call id it made (the driver's protocol)."""

import json
import re
import uuid

from fakes import ThreadServer


def _plan(task: str, turn: int, results: list[str]):
    """(tool name, arguments) to call next, or the final answer text."""
    if "How many .txt" in task:
        if turn == 0:
            return "list_files", {"path": "."}
        return f"There are {sum(f.endswith('.txt') for f in json.loads(results[-1]))} .txt files."
    if "What port" in task:
        if turn == 0:
            return "read_file", {"path": "config.ini"}
        return "The port is " + re.search(r"port = (\d+)", results[-1]).group(1) + "."
    if "pelican" in task:
        if turn == 0:
            return "search", {"pattern": "pelican"}
        return "It is in " + json.loads(results[-1])[0] + "."
    if "hello.txt" in task:
        return ("write_file", {"path": "hello.txt", "content": "hello world"}) if turn == 0 else "Done."
    if "todo.txt" in task:
        if turn == 0:
            return "read_file", {"path": "todo.txt"}
        if turn == 1:
            return "edit_file", {"path": "todo.txt", "old": "buy milk", "new": "buy bread"}
        return "Done."
    return "I do not know this task."


def agent_server(wrong: bool = False) -> ThreadServer:
    """wrong=True: the same agent, but its write/edit tool arguments are off by a word."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "scripted-agent", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        msgs = body["messages"]
        task = next(m["content"] for m in msgs if m["role"] == "user")
        pending = {}
        for m in msgs:
            for call in m.get("tool_calls") or []:
                pending[call["id"]] = call
            if m["role"] == "tool" and pending.pop(m.get("tool_call_id"), None) is None:
                return JSONResponse({"error": {"message": "tool message answers no call", "type": "BadRequestError",
                                               "param": "messages", "code": 400}}, status_code=400)
        results = [m["content"] for m in msgs if m["role"] == "tool"]
        step = _plan(task, sum(1 for m in msgs if m["role"] == "assistant"), results)
        call = None
        if isinstance(step, tuple):
            name, args = step
            if wrong and name in ("write_file", "edit_file"):
                args = dict(args, content="hello there", new="buy cheese")
            call = {"id": "call_" + uuid.uuid4().hex[:12], "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)}}
        reason = "tool_calls" if call else "stop"
        if not body.get("stream"):
            message = {"role": "assistant", "content": None if call else step, "tool_calls": [call] if call else []}
            return {"id": "chatcmpl-x", "object": "chat.completion", "model": "scripted-agent",
                    "choices": [{"index": 0, "message": message, "finish_reason": reason}]}

        def events():
            def chunk(delta, finish=None):
                doc = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "model": "scripted-agent",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                return f"data: {json.dumps(doc)}\n\n"

            yield chunk({"role": "assistant"})
            if call:
                a = call["function"]["arguments"]
                yield chunk({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                             "function": {"name": call["function"]["name"], "arguments": a[:5]}}]})
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": a[5:]}}]})
            else:
                for k in range(0, len(step), 6):
                    yield chunk({"content": step[k:k + 6]})
            yield chunk({}, reason)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return ThreadServer(app)
