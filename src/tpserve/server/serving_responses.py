"""POST /v1/responses: OpenAI's Responses API on top of the chat path (serving_chat.start_chat).

The request becomes a chat request (responses_protocol), so rendering, tokenizing (off the event
loop), sampling, reasoning and tool-call parsing are the chat route's. The output becomes items:
a `reasoning` item (when the reasoning parser split reasoning off), a `message` item with one
`output_text` part, and a `function_call` item per tool call. A generation cut by
max_output_tokens (or max_model_len) gives status "incomplete" with
incomplete_details.reason "max_output_tokens". Streams are OpenAI's named events (`event:` +
`data:` lines): response.created, response.in_progress, per item output_item.added,
content_part.added, *.delta, *.done, content_part.done, output_item.done, then
response.completed (or response.incomplete, as OpenAI sends when cut short).
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tpserve.server.reasoning import THINK_END
from tpserve.server.responses_models import (FunctionCallItem, IncompleteDetails, MessageItem, OutputText,
                                             ReasoningItem, ReasoningText, ResponsesResponse, ResponseUsage, item_id)
from tpserve.server.responses_protocol import NamedFunctionChoice, ResponsesRequest
from tpserve.server.serving_chat import ChatRun, start_chat
from tpserve.server.serving_common import cut_at_drain, merged
from tpserve.server.state import ServerState, until_disconnect

Item = MessageItem | ReasoningItem | FunctionCallItem


async def create_response(state: ServerState, request: Request, req: ResponsesRequest):
    chat = await state.off_loop(req.to_chat_request)  # ParamError -> 400 naming the field
    run = await start_chat(state, chat, rid=item_id("resp"))
    echo = _echo(req, run)
    if req.stream:
        return StreamingResponse(_stream(state, run, echo), media_type="text/event-stream")

    async def collect():
        final = None
        async for _, out in merged([run.stream], [run.timer]):
            final = out
        return final

    final = await until_disconnect(request, collect(), state.drain_cut)
    c = final.outputs[0]
    msg = run.parse(c.text)
    incomplete = c.finish_reason == "length"
    items = output_items(msg, incomplete)
    usage = ResponseUsage.of(len(run.ids), len(c.token_ids), _reasoning_tokens(state, c.token_ids, msg),
                             final.num_cached_tokens)
    return JSONResponse(_response(echo, items, usage, incomplete).model_dump(mode="json"))


def output_items(msg: dict, incomplete: bool) -> list[Item]:
    """The output items of a parsed assistant message (parsers.parse_chat_output)."""
    items: list[Item] = []
    if msg.get("reasoning_content"):
        items.append(ReasoningItem(content=[ReasoningText(text=msg["reasoning_content"])]))
    calls = msg.get("tool_calls") or []
    if msg.get("content") is not None and (msg["content"] or not calls):
        items.append(MessageItem(content=[OutputText(text=msg["content"])]))
    items += [FunctionCallItem(call_id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
              for c in calls]
    if _needs_message(items, incomplete):
        items.append(MessageItem(content=[OutputText(text="")]))
    if incomplete:
        items[-1].status = "incomplete"
    return items


def _needs_message(items: list[Item], incomplete: bool) -> bool:
    """A finished turn always has a message or a call (an empty message if need be); a turn cut
    short during reasoning ends with its (incomplete) reasoning item, as OpenAI's does."""
    return not items or (not incomplete and not any(isinstance(i, MessageItem | FunctionCallItem) for i in items))


def _reasoning_tokens(state: ServerState, token_ids: list[int], msg: dict) -> int:
    """Output tokens before the end-of-thinking token (all of them when thinking never ended)."""
    if not msg.get("reasoning_content"):
        return 0
    tok = state.tokenizer
    end = tok.convert_tokens_to_ids(THINK_END)
    if isinstance(end, int) and tok.convert_ids_to_tokens(end) == THINK_END and end in token_ids:
        return token_ids.index(end)
    return len(token_ids)


def _echo(req: ResponsesRequest, run: ChatRun) -> dict[str, Any]:
    """The response object's fields that echo the request (sampling values as used)."""
    choice = req.tool_choice
    return {"id": run.rid, "created_at": int(time.time()), "model": run.model, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "metadata": req.metadata, "user": req.user,
            "parallel_tool_calls": req.parallel_tool_calls is not False, "temperature": run.params.temperature,
            "top_p": run.params.top_p,
            "tool_choice": choice.model_dump() if isinstance(choice, NamedFunctionChoice) else choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
            "text": req.text.model_dump(by_alias=True, exclude_none=True) if req.text else {"format": {"type": "text"}},
            "reasoning": req.reasoning.model_dump(exclude_none=True) if req.reasoning else None}


def _response(echo: dict, items: list[Item], usage: ResponseUsage | None, incomplete: bool | None) -> ResponsesResponse:
    status = "in_progress" if incomplete is None else "incomplete" if incomplete else "completed"
    details = IncompleteDetails(reason="max_output_tokens") if incomplete else None
    return ResponsesResponse(**echo, status=status, output=items, usage=usage, incomplete_details=details)


class _Events:
    """Numbered SSE events; output items built from the chat parser's deltas."""

    def __init__(self) -> None:
        self.seq = 0
        self.items: list[Item] = []
        self.open: Item | None = None

    def event(self, type: str, **fields: Any) -> str:
        payload = {"type": type, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {type}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.open.id, "output_index": len(self.items) - 1}

    def _start(self, item: Item) -> list[str]:
        out = self.close("completed")
        item.status = "in_progress"
        self.items.append(item)
        self.open = item
        out.append(self.event("response.output_item.added", output_index=len(self.items) - 1,
                              item=item.model_dump(mode="json")))
        if isinstance(item, MessageItem | ReasoningItem):
            part = OutputText(text="") if isinstance(item, MessageItem) else ReasoningText(text="")
            item.content.append(part)
            out.append(self.event("response.content_part.added", **self._where(), content_index=0,
                                  part=part.model_dump(mode="json")))
        return out

    def feed(self, delta: dict) -> list[str]:
        out: list[str] = []
        for key, cls, name in (("reasoning_content", ReasoningItem, "reasoning_text"), ("content", MessageItem,
                                                                                        "output_text")):
            text = delta.get(key)
            if not text:
                continue
            if not isinstance(self.open, cls):
                out += self._start(cls())
            self.open.content[0].text += text
            extra = {"logprobs": []} if cls is MessageItem else {}
            out.append(self.event(f"response.{name}.delta", **self._where(), content_index=0, delta=text, **extra))
        for call in delta.get("tool_calls") or ():
            function = call.get("function") or {}
            if "id" in call:
                out += self._start(FunctionCallItem(call_id=call["id"], name=function.get("name", ""), arguments=""))
            if function.get("arguments") and isinstance(self.open, FunctionCallItem):
                self.open.arguments += function["arguments"]
                out.append(self.event("response.function_call_arguments.delta", **self._where(),
                                      delta=function["arguments"]))
        return out

    def close(self, status: str) -> list[str]:
        """Close the open item (if any) with `status`: its *.done events."""
        item, out = self.open, []
        if item is None:
            return out
        where = self._where()
        if isinstance(item, FunctionCallItem):
            out.append(self.event("response.function_call_arguments.done", **where, name=item.name,
                                  arguments=item.arguments))
        else:
            part = item.content[0]
            name, extra = ("output_text", {"logprobs": []}) if isinstance(item, MessageItem) else ("reasoning_text", {})
            out.append(self.event(f"response.{name}.done", **where, content_index=0, text=part.text, **extra))
            out.append(self.event("response.content_part.done", **where, content_index=0,
                                  part=part.model_dump(mode="json")))
        item.status = status
        out.append(self.event("response.output_item.done", output_index=where["output_index"],
                              item=item.model_dump(mode="json")))
        self.open = None
        return out

    def finish(self, incomplete: bool) -> list[str]:
        out: list[str] = []
        if _needs_message(self.items, incomplete):
            out += self._start(MessageItem())  # as output_items does
        return out + self.close("incomplete" if incomplete else "completed")


async def _stream(state: ServerState, run: ChatRun, echo: dict):
    ev, parser = _Events(), run.new_parser()
    yield ev.event("response.created", response=_response(echo, [], None, None).model_dump(mode="json"))
    yield ev.event("response.in_progress", response=_response(echo, [], None, None).model_dump(mode="json"))
    sent, final, cached = 0, None, 0
    try:
        async for _, out in cut_at_drain(state, merged([run.stream], [run.timer])):
            c, cached = out.outputs[0], out.num_cached_tokens
            deltas = parser.feed(c.text[sent:])
            sent = len(c.text)
            if c.finish_reason is not None:
                deltas += parser.finish()
                final = c
            for delta in deltas:
                for event in ev.feed(delta):
                    yield event
    except Exception as exc:  # the engine died or the drain ran out: tell the client, then end the stream
        yield ev.event("error", code="ServiceUnavailableError", message=f"generation failed: {exc}", param=None)
        return
    incomplete = final is None or final.finish_reason == "length"
    for event in ev.finish(incomplete):
        yield event
    token_ids = final.token_ids if final is not None else []
    msg = {"reasoning_content": "".join(i.content[0].text for i in ev.items if isinstance(i, ReasoningItem))}
    usage = ResponseUsage.of(len(run.ids), len(token_ids), _reasoning_tokens(state, token_ids, msg), cached)
    done = _response(echo, ev.items, usage, incomplete).model_dump(mode="json")
    yield ev.event("response.incomplete" if incomplete else "response.completed", response=done)
