"""POST /v1/completions: one or several prompts (text or token ids), n samples each; `echo` puts
the prompt (its tokens and, with `logprobs`, their logprobs) in front of each completion."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tpserve.engine.tokenizer import encode
from tpserve.server.metrics import RequestTimer
from tpserve.server.protocol import CompletionRequest
from tpserve.server.responses import CompletionChoice, CompletionResponse, CompletionStreamResponse, UsageInfo
from tpserve.server.serving_common import (completion_logprobs, cut_at_drain, merged, request_id, sampling_params,
                                          sse, sse_error)
from tpserve.server.state import ServerState, until_disconnect
from tpserve.server.structured import logit_bias, request_constraint


@dataclass
class Prompt:
    ids: list[int]
    text: str | None  # the prompt as sent, or (with echo) a token prompt decoded; None otherwise


async def completions(state: ServerState, request: Request, req: CompletionRequest):
    model = state.check_model(req.model)
    bias = logit_bias(state, req)
    constrained = req.response_format is not None or req.structured_outputs is not None
    constraint = await state.off_loop(request_constraint, state, req) if constrained else None
    params = sampling_params(req, state.sampling_defaults, logit_bias=bias, structured_outputs=constraint)
    texts = [p for p in req.prompts() if isinstance(p, str)]
    tok = state.tokenizer
    if texts:
        state.need_tokenizer("a text prompt")
    if req.echo:
        state.need_tokenizer("echo")
    for p in texts:
        state.check_text_length(len(p), "prompt")

    def tokenized() -> list[Prompt]:
        return [Prompt(encode(tok, p), p) if isinstance(p, str)
                else Prompt(list(p), tok.decode(p) if req.echo else None) for p in req.prompts()]

    prompts = await state.off_loop(tokenized) if texts or req.echo else tokenized()
    rid = request_id("cmpl")
    streams, timers = [], []
    try:
        for j, p in enumerate(prompts):
            stream = state.engine.add(f"{rid}-{j}", p.ids, params, p.text, cache_salt=req.cache_salt)
            streams.append(stream)
            timers.append(RequestTimer(state.metrics, stream.arrival, len(p.ids)))
    except Exception:
        for s in streams:
            state.engine.abort(s.request_id)
        raise
    if req.stream:
        return StreamingResponse(_stream(state, tok, rid, model, req, prompts, streams, timers, params.n),
                                 media_type="text/event-stream")

    async def collect():
        finals = {}
        async for j, out in merged(streams, timers):
            finals[j] = out
        return finals

    finals = await until_disconnect(request, collect(), state.drain_cut)
    choices, generated = [], 0
    k = req.logprobs_count()
    for j, p in enumerate(prompts):
        for c in finals[j].outputs:
            text, tokens, entries = _returned(req, p, finals[j].prompt_logprobs, c.text, c.token_ids, c.logprobs)
            logprobs = completion_logprobs(tok, tokens, entries, k, 0) if k is not None else None
            choices.append(CompletionChoice(index=j * params.n + c.index, text=text, logprobs=logprobs,
                                            finish_reason=c.finish_reason, stop_reason=c.stop_reason))
            generated += 0 if req.prompt_only() else len(c.token_ids)
    usage = UsageInfo.of(sum(len(p.ids) for p in prompts), generated,
                         sum(f.num_cached_tokens for f in finals.values()))
    body = CompletionResponse(id=rid, model=model, choices=choices, usage=usage).model_dump()
    if req.prompt_logprobs is not None:  # vLLM's shape: per choice, [None, {token id: {logprob, rank, decoded_token}}]
        for choice in body["choices"]:
            j = choice["index"] // params.n
            choice["prompt_logprobs"] = prompt_logprobs_json(finals[j].prompt_logprobs, prompts[j].ids,
                                                             req.prompt_logprobs)
    return JSONResponse(body)


def _returned(req: CompletionRequest, prompt: Prompt, prompt_lps, text: str, tokens: list[int], entries):
    """(text, token ids, per-token logprob entries) a choice returns: with echo the prompt comes first."""
    if not req.echo:
        return text, tokens, entries
    lps = list(prompt_lps or [None] * len(prompt.ids))
    if req.prompt_only():
        return prompt.text, prompt.ids, lps
    return prompt.text + text, prompt.ids + tokens, lps + list(entries or [])


def prompt_logprobs_json(entries, ids: list[int], k: int) -> list | None:
    """Each position's prompt token and its top k (the engine may have scored more, for echo)."""
    if entries is None:
        return None
    return [None if e is None else {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
                                    for t, lp in e.items() if t == ids[i] or lp.rank <= k}
            for i, e in enumerate(entries)]


async def _stream(state, tok, rid, model, req: CompletionRequest, prompts: list[Prompt], streams, timers, n):
    created = int(time.time())
    k = req.logprobs_count()
    include_usage, continuous = req.usage_options()
    prompt_tokens = sum(len(p.ids) for p in prompts)
    sent_text, sent_tokens, offset, generated, done, cached = {}, {}, {}, {}, set(), {}

    def usage() -> UsageInfo:
        return UsageInfo.of(prompt_tokens, sum(generated.values()), sum(cached.values()))

    try:
        async for j, out in cut_at_drain(state, merged(streams, timers)):
            choices, cached[j] = [], out.num_cached_tokens
            for c in out.outputs:
                idx = j * n + c.index
                if idx in done:
                    continue
                a, t = sent_text.get(idx, 0), sent_tokens.get(idx, 0)
                text, tokens = c.text[a:], c.token_ids[t:]
                entries = c.logprobs[t:] if c.logprobs is not None else None
                first = idx not in offset
                if req.prompt_only() and c.finish_reason is None:
                    continue  # the prompt alone, sent once the engine is done with it
                if req.echo and first and (tokens or c.finish_reason is not None):
                    text, tokens, entries = _returned(req, prompts[j], out.prompt_logprobs, text, tokens, entries)
                elif first and not tokens and c.finish_reason is None:
                    continue
                logprobs = None
                if k is not None and tokens:
                    logprobs = completion_logprobs(tok, tokens, entries, k, offset.get(idx, 0))
                sent_text[idx], sent_tokens[idx] = len(c.text), len(c.token_ids)
                offset[idx] = offset.get(idx, 0) + len(text)
                generated[idx] = 0 if req.prompt_only() else len(c.token_ids)
                if c.finish_reason is not None:
                    done.add(idx)
                if not text and logprobs is None and c.finish_reason is None:
                    continue
                choices.append(CompletionChoice(index=idx, text=text, logprobs=logprobs,
                                                finish_reason=c.finish_reason, stop_reason=c.stop_reason))
            if choices:
                yield sse(CompletionStreamResponse(id=rid, model=model, created=created, choices=choices,
                                                   usage=usage() if continuous else None))
    except Exception as exc:
        yield sse_error(f"generation failed: {exc}", "ServiceUnavailableError")
        yield sse("[DONE]")
        return
    if include_usage:
        yield sse(CompletionStreamResponse(id=rid, model=model, created=created, choices=[], usage=usage()))
    yield sse("[DONE]")
