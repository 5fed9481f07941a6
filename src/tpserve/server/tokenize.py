"""POST /tokenize and /detokenize (vLLM's shapes); tokenizing and rendering run off the event loop."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from tpserve.engine.tokenizer import encode
from tpserve.server.chat import ParamError, apply_chat_template
from tpserve.server.protocol import DetokenizeRequest, TokenizeRequest
from tpserve.server.responses import DetokenizeResponse, TokenizeResponse
from tpserve.server.state import ApiError, ServerState


def message_chars(messages: list[dict]) -> int:
    """Characters of message text (a lower bound on what the template renders)."""
    total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text", "")) for p in content if isinstance(p, dict)
                         and isinstance(p.get("text"), str))
    return total


async def tokenize_request(state: ServerState, req: TokenizeRequest) -> JSONResponse:
    state.check_model(req.model)
    tok = state.need_tokenizer("tokenize")
    if req.messages is not None:
        state.check_text_length(message_chars(req.messages), "messages")

        def work():
            try:
                text = apply_chat_template(tok, req.messages, req.tools,
                                           add_generation_prompt=req.add_generation_prompt,
                                           reasoning_effort=req.reasoning_effort,
                                           enable_thinking=req.enable_thinking(),
                                           chat_template_kwargs=req.chat_template_kwargs)
            except ParamError as exc:
                raise ApiError(400, str(exc), param=exc.param) from None
            return encode(tok, text, add_special_tokens=req.special_tokens())
    else:
        state.check_text_length(len(req.prompt), "prompt")

        def work():
            return encode(tok, req.prompt, add_special_tokens=req.special_tokens())

    ids = await state.off_loop(work)
    strs = tok.convert_ids_to_tokens(ids) if req.return_token_strs else None
    return JSONResponse(TokenizeResponse(tokens=ids, count=len(ids), max_model_len=state.max_model_len,
                                         token_strs=strs).model_dump(exclude_none=True))


async def detokenize_request(state: ServerState, req: DetokenizeRequest) -> JSONResponse:
    state.check_model(req.model)
    tok = state.need_tokenizer("detokenize")
    vocab = state.engine.engine.model_config.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise ApiError(400, f"token ids {bad[:3]} are out of range for vocab_size {vocab}", param="tokens")
    text = await state.off_loop(tok.decode, req.tokens)
    return JSONResponse(DetokenizeResponse(prompt=text).model_dump())
