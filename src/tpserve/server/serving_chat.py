"""POST /v1/chat/completions: GLM chat template, reasoning and tool-call parsing, streaming."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tpserve.engine.tokenizer import encode
from tpserve.server.chat import ParamError, apply_chat_template, thinking_enabled
from tpserve.server.metrics import RequestTimer
from tpserve.server.parsers import (ChatOutputParser, chat_finish_reason, merge_deltas, parse_chat_output,
                                    reasoning_mode_for_prompt, resolve_tool_choice)
from tpserve.server.protocol import ChatCompletionRequest
from tpserve.server.responses import (ChatCompletionChoice, ChatCompletionResponse, ChatCompletionStreamChoice,
                                      ChatCompletionStreamResponse, ChatMessage, DeltaMessage, UsageInfo)
from tpserve.server.serving_common import (chat_logprobs, cut_at_drain, merged, request_id, sampling_params, sse,
                                          sse_error)
from tpserve.server.state import ApiError, ServerState, until_disconnect
from tpserve.server.structured import constraint_for_chat, logit_bias, strict_tools, strict_tools_constraint
from tpserve.server.tokenize import message_chars


@dataclass
class ChatRun:
    """A chat request rendered, tokenized and handed to the engine (shared with /v1/responses)."""

    rid: str
    model: str
    stream: Any  # the engine's RequestStream
    timer: RequestTimer
    ids: list[int]
    params: Any  # SamplingParams
    mode: Any  # the ReasoningMode of the output
    policy: Any  # the ToolPolicy

    def new_parser(self) -> ChatOutputParser:
        return ChatOutputParser(self.mode, self.policy.template_tools, parse_tools=self.policy.parse_tools,
                                allowed_names=self.policy.allowed_names)

    def parse(self, text: str) -> dict:
        """The whole output as an OpenAI assistant message dict (parsers.parse_chat_output)."""
        return parse_chat_output(text, self.mode, self.policy.template_tools, parse_tools=self.policy.parse_tools,
                                 allowed_names=self.policy.allowed_names)


async def start_chat(state: ServerState, req: ChatCompletionRequest, rid: str | None = None) -> ChatRun:
    """Validate, render the template and tokenize (off the event loop), then add the request."""
    model = state.check_model(req.model)
    tok = state.need_tokenizer("chat completions")
    try:
        policy = resolve_tool_choice(req.tools, req.tool_choice)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="tool_choice") from None
    state.check_text_length(message_chars(req.messages), "messages")
    bias = logit_bias(state, req)
    constraint = await state.off_loop(constraint_for_chat, state, req, policy)
    enable_thinking = False if constraint is not None else req.enable_thinking()  # the grammar covers it all

    def render() -> tuple[str, list[int]]:
        try:
            text = apply_chat_template(tok, req.messages, policy.template_tools, reasoning_effort=req.reasoning_effort,
                                       enable_thinking=enable_thinking,
                                       chat_template_kwargs=req.chat_template_kwargs,
                                       add_generation_prompt=req.add_generation_prompt)
        except ParamError as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        except (ValueError, TypeError) as exc:  # a template that chokes on a kwarg value
            raise ApiError(400, f"chat template error: {exc}", param="chat_template_kwargs") from None
        return text, encode(tok, text, add_special_tokens=False)

    prompt, ids = await state.off_loop(render)
    mode = reasoning_mode_for_prompt(prompt, thinking_enabled(req.reasoning_effort, enable_thinking))
    if constraint is None and strict_tools(policy):  # (its grammar compiles off the event loop)
        constraint = await state.off_loop(strict_tools_constraint, state, req, policy, mode)
    params = sampling_params(req, state.sampling_defaults, logit_bias=bias, structured_outputs=constraint)
    rid = rid or request_id("chatcmpl")
    stream = state.engine.add(rid, ids, params, prompt, cache_salt=req.cache_salt)
    timer = RequestTimer(state.metrics, stream.arrival, len(ids))
    return ChatRun(rid, model, stream, timer, ids, params, mode, policy)


async def chat_completions(state: ServerState, request: Request, req: ChatCompletionRequest):
    run = await start_chat(state, req)
    rid, model, stream, timer, ids, params, new_parser = (run.rid, run.model, run.stream, run.timer, run.ids,
                                                          run.params, run.new_parser)
    tok = state.tokenizer
    k = req.logprobs_count()

    if req.stream:
        return StreamingResponse(_stream(state, rid, model, stream, timer, new_parser, params.n, len(ids), k,
                                         req.usage_options()), media_type="text/event-stream")

    async def collect():
        final = None
        async for _, out in merged([stream], [timer]):
            final = out
        return final

    final = await until_disconnect(request, collect(), state.drain_cut)
    choices = []
    for c in final.outputs:
        msg = run.parse(c.text)
        calls = msg.get("tool_calls") or None
        message = ChatMessage(content=msg["content"], reasoning_content=msg["reasoning_content"],
                              reasoning=msg["reasoning_content"], tool_calls=calls)
        logprobs = chat_logprobs(tok, c.token_ids, c.logprobs, k) if k is not None else None
        choices.append(ChatCompletionChoice(index=c.index, message=message, logprobs=logprobs,
                                            finish_reason=chat_finish_reason(c.finish_reason, calls),
                                            stop_reason=c.stop_reason))
    usage = UsageInfo.of(len(ids), sum(len(c.token_ids) for c in final.outputs), final.num_cached_tokens)
    return JSONResponse(ChatCompletionResponse(id=rid, model=model, choices=choices, usage=usage).model_dump())


async def _stream(state, rid, model, stream, timer, new_parser, n, prompt_len, k, usage_options):
    tok = state.tokenizer
    created = int(time.time())
    include_usage, continuous = usage_options
    parsers = [new_parser() for _ in range(n)]
    sent_text, sent_tokens, done = [0] * n, [0] * n, [False] * n
    cached = 0

    def chunk(choices, usage=None):
        if usage is None and continuous:  # vLLM's continuous_usage_stats: the usage so far on every chunk
            usage = UsageInfo.of(prompt_len, sum(sent_tokens), cached)
        return sse(ChatCompletionStreamResponse(id=rid, model=model, created=created, choices=choices, usage=usage))

    yield chunk([ChatCompletionStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                 for i in range(n)])
    try:
        async for _, out in cut_at_drain(state, merged([stream], [timer])):
            choices, cached = [], out.num_cached_tokens
            for c in out.outputs:
                i = c.index
                if done[i]:
                    continue
                deltas = parsers[i].feed(c.text[sent_text[i]:])
                sent_text[i] = len(c.text)
                new_tokens = c.token_ids[sent_tokens[i]:]
                logprobs = None
                if k is not None and new_tokens:
                    logprobs = chat_logprobs(tok, new_tokens, c.logprobs[sent_tokens[i]:], k)
                sent_tokens[i] = len(c.token_ids)
                finish = None
                if c.finish_reason is not None:
                    deltas += parsers[i].finish()
                    finish = chat_finish_reason(c.finish_reason, parsers[i].tool_calls)
                    done[i] = True
                delta = merge_deltas(deltas)
                if delta is None and logprobs is None and finish is None:
                    continue
                choices.append(ChatCompletionStreamChoice(index=i, delta=DeltaMessage.from_parser(delta),
                                                          logprobs=logprobs, finish_reason=finish,
                                                          stop_reason=c.stop_reason if finish else None))
            if choices:
                yield chunk(choices)
    except Exception as exc:  # the engine died or the drain ran out: tell the client, then end the stream
        yield sse_error(f"generation failed: {exc}", "ServiceUnavailableError")
        yield sse("[DONE]")
        return
    if include_usage:
        yield chunk([], usage=UsageInfo.of(prompt_len, sum(sent_tokens), cached))
    yield sse("[DONE]")
