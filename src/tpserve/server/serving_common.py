"""Pieces shared by the chat and completion handlers: sampling params, merged streams, SSE,
per-token logprobs."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from pydantic import BaseModel

from tpserve.engine.async_engine import RequestStream
from tpserve.engine.outputs import Logprob, RequestOutput
from tpserve.sampling_params import SamplingParams
from tpserve.server.errors import error_body
from tpserve.server.metrics import RequestTimer


LOGPROB_FLOOR = -9999.0


class DrainTimeout(Exception):
    """The SIGTERM drain ran out of time before this stream finished."""


async def cut_at_drain(state, outputs: AsyncIterator) -> AsyncIterator:
    """`outputs` until the server's drain deadline (state.drain_cut), then DrainTimeout."""
    cut = getattr(state, "drain_cut", None)
    if cut is None:
        async for item in outputs:
            yield item
        return
    it = outputs.__aiter__()
    waiter = asyncio.ensure_future(cut.wait())
    nxt = None
    try:
        while True:
            nxt = asyncio.ensure_future(it.__anext__())
            await asyncio.wait({nxt, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                raise DrainTimeout("the server is shutting down and the drain timeout has passed")
            try:
                item = nxt.result()
            except StopAsyncIteration:
                return
            yield item
    finally:  # the consumer went away, or the drain cut: close `outputs` (aborting its requests)
        waiter.cancel()
        if nxt is not None and not nxt.done():
            nxt.cancel()
        elif hasattr(it, "aclose"):
            await it.aclose()


def sampling_params(req, defaults: dict, **extra) -> SamplingParams:
    """The request's SamplingParams; `extra` adds logit_bias / structured_outputs (server/structured.py)."""
    return SamplingParams(**req.to_sampling_params(defaults), **extra)


def request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse(payload: BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json(exclude_none=True)
    return f"data: {data}\n\n"


def sse_error(message: str, type: str = "InternalServerError") -> str:
    """An error event inside a stream (the HTTP status is already sent): OpenAI's error body."""
    return sse(json.dumps(error_body(message, type)))


async def merged(streams: list[RequestStream], timers: list[RequestTimer]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of several request streams as they come, tagged with the stream's index."""
    if len(streams) == 1:
        async for out in streams[0]:
            _time(timers[0], out)
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(k: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                await queue.put((k, out))
        except BaseException as exc:  # noqa: BLE001 - forwarded to the consumer
            await queue.put((k, exc))
        await queue.put((k, None))

    tasks = [asyncio.ensure_future(pump(k, s)) for k, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            k, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                _time(timers[k], item)
                yield k, item
    finally:
        for t in tasks:
            t.cancel()


def _time(timer: RequestTimer, out: RequestOutput) -> None:
    now = time.monotonic()
    timer.tokens_seen(sum(len(c.token_ids) for c in out.outputs), now)
    if out.finished:
        timer.done([c.finish_reason for c in out.outputs], now)


def token_text(tokenizer, token: int) -> str:
    return tokenizer.decode([token]) if tokenizer is not None else f"token_id:{token}"


def ranked(top: dict[int, Logprob], k: int) -> list[tuple[int, Logprob]]:
    return sorted(((t, lp) for t, lp in top.items() if lp.rank is not None and lp.rank <= k),
                  key=lambda item: item[1].rank)[:k]


def finite(logprob: float) -> float:
    """-inf (a token a grammar forbids) as the finite floor OpenAI and vLLM send: JSON has no -inf."""
    return max(logprob, LOGPROB_FLOOR)


def chat_logprobs(tokenizer, tokens: list[int], entries: list[dict[int, Logprob]], k: int) -> dict:
    content = []
    for tok, top in zip(tokens, entries):
        text = token_text(tokenizer, tok)
        content.append({"token": text, "logprob": finite(top[tok].logprob), "bytes": list(text.encode()),
                        "top_logprobs": [{"token": (s := token_text(tokenizer, t)), "logprob": finite(lp.logprob),
                                          "bytes": list(s.encode())} for t, lp in ranked(top, k)]})
    return {"content": content}


def _top_by_text(tokenizer, top: dict[int, Logprob], k: int) -> dict[str, float] | None:
    """The top k keyed by text; of two tokens with one text, the likelier keeps its place."""
    out: dict[str, float] = {}
    for t, lp in ranked(top, k):
        out.setdefault(token_text(tokenizer, t), finite(lp.logprob))
    return out or None


def completion_logprobs(tokenizer, tokens: list[int], entries: list[dict[int, Logprob] | None], k: int,
                        offset: int) -> dict:
    """The legacy logprobs object; an entry of None (the first prompt token of an echo) gives nulls."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tok, top in zip(tokens, entries):
        text = token_text(tokenizer, tok)
        out["tokens"].append(text)
        out["token_logprobs"].append(None if top is None else finite(top[tok].logprob))
        out["top_logprobs"].append(None if top is None else _top_by_text(tokenizer, top, k))
        out["text_offset"].append(offset)
        offset += len(text)
    return out
