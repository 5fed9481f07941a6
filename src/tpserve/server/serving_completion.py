"""POST /v1/completions: one or several prompts (text or token ids), n samples each."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tpserve.server.metrics import RequestTimer
from tpserve.server.protocol import CompletionRequest
from tpserve.server.responses import CompletionChoice, CompletionResponse, CompletionStreamResponse, UsageInfo
from tpserve.server.serving_common import (completion_logprobs, cut_at_drain, merged, request_id, sampling_params,
                                          sse, sse_error)
from tpserve.server.state import ServerState, until_disconnect
from tpserve.server.structured import logit_bias, response_format_constraint


async def completions(state: ServerState, request: Request, req: CompletionRequest):
    model = state.check_model(req.model)
    bias = logit_bias(state, req)
    constraint = await state.off_loop(response_format_constraint, state, req) if req.response_format else None
    params = sampling_params(req, state.sampling_defaults, logit_bias=bias, structured_outputs=constraint)
    texts = [p for p in req.prompts() if isinstance(p, str)]
    tok = state.need_tokenizer("a text prompt") if texts else state.tokenizer
    for p in texts:
        state.check_text_length(len(p), "prompt")

    def encode() -> list:
        return [(tok.encode(p), p) if isinstance(p, str) else (list(p), None) for p in req.prompts()]

    prompts = await state.off_loop(encode) if texts else encode()
    rid = request_id("cmpl")
    streams, timers = [], []
    try:
        for j, (ids, text) in enumerate(prompts):
            stream = state.engine.add(f"{rid}-{j}", ids, params, text, cache_salt=req.cache_salt)
            streams.append(stream)
            timers.append(RequestTimer(state.metrics, stream.arrival, len(ids)))
    except Exception:
        for s in streams:
            state.engine.abort(s.request_id)
        raise
    n, k = params.n, req.logprobs_count()
    prompt_tokens = sum(len(ids) for ids, _ in prompts)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_stream(state, tok, rid, model, streams, timers, n, k, prompt_tokens, include_usage),
                                 media_type="text/event-stream")

    async def collect():
        finals = {}
        async for j, out in merged(streams, timers):
            finals[j] = out
        return finals

    finals = await until_disconnect(request, collect(), state.drain_cut)
    choices = []
    for j in range(len(prompts)):
        for c in finals[j].outputs:
            logprobs = completion_logprobs(tok, c.token_ids, c.logprobs, k, 0) if k is not None else None
            choices.append(CompletionChoice(index=j * n + c.index, text=c.text, logprobs=logprobs,
                                            finish_reason=c.finish_reason, stop_reason=c.stop_reason))
    usage = UsageInfo.of(prompt_tokens, sum(len(c.token_ids) for f in finals.values() for c in f.outputs),
                         sum(f.num_cached_tokens for f in finals.values()))
    body = CompletionResponse(id=rid, model=model, choices=choices, usage=usage).model_dump()
    if req.prompt_logprobs is not None:  # vLLM's shape: per choice, [None, {token id: {logprob, rank, decoded_token}}]
        for choice in body["choices"]:
            choice["prompt_logprobs"] = prompt_logprobs_json(finals[choice["index"] // n].prompt_logprobs)
    return JSONResponse(body)


def prompt_logprobs_json(entries) -> list | None:
    if entries is None:
        return None
    return [None if e is None else {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
                                    for t, lp in e.items()} for e in entries]


async def _stream(state, tok, rid, model, streams, timers, n, k, prompt_tokens, include_usage):
    created = int(time.time())
    sent_text, sent_tokens, done, cached = {}, {}, set(), {}
    completion_tokens = 0
    try:
        async for j, out in cut_at_drain(state, merged(streams, timers)):
            choices, cached[j] = [], out.num_cached_tokens
            for c in out.outputs:
                idx = j * n + c.index
                if idx in done:
                    continue
                a, t = sent_text.get(idx, 0), sent_tokens.get(idx, 0)
                logprobs = None
                if k is not None and len(c.token_ids) > t:
                    logprobs = completion_logprobs(tok, c.token_ids[t:], c.logprobs[t:], k, a)
                sent_text[idx], sent_tokens[idx] = len(c.text), len(c.token_ids)
                if c.finish_reason is not None:
                    done.add(idx)
                    completion_tokens += len(c.token_ids)
                if len(c.text) == a and logprobs is None and c.finish_reason is None:
                    continue
                choices.append(CompletionChoice(index=idx, text=c.text[a:], logprobs=logprobs,
                                                finish_reason=c.finish_reason, stop_reason=c.stop_reason))
            if choices:
                yield sse(CompletionStreamResponse(id=rid, model=model, created=created, choices=choices))
    except Exception as exc:
        yield sse_error(f"generation failed: {exc}", 503, "ServiceUnavailableError")
        yield sse("[DONE]")
        return
    if include_usage:
        yield sse(CompletionStreamResponse(id=rid, model=model, created=created, choices=[],
                                           usage=UsageInfo.of(prompt_tokens, completion_tokens,
                                                              sum(cached.values()))))
    yield sse("[DONE]")
