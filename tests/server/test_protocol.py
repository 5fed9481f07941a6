"""OpenAI request validation, error bodies, sampling params and response shapes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tpserve.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    ChatCompletionChoice,
    ChatCompletionStreamChoice,
    ChatChoiceLogprobs,
    ChatLogprobToken,
    ChatMessage,
    ChatTopLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    DetokenizeRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    UsageInfo,
    error_body,
    parse_request,
    validation_error_to_body,
)
from tpserve.server.parsers import merge_deltas

MSGS = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]


def error_of(model, body: dict) -> dict:
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    err = validation_error_to_body(info.value)["error"]
    assert err["type"] == "BadRequestError" and err["code"] is None  # OpenAI's code: a string or null
    ErrorResponse.model_validate({"error": err})
    return err


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"presence_penalty": 2.1}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stop": ""}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"chat_template_kwargs": {"enable_thinking": "yes"}},
         "chat_template_kwargs.enable_thinking"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": "sometimes", "tools": TOOLS}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "other"}}, "tools": TOOLS},
         "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
         "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"stream": True, "stream_options": {"continuous_usage_stats": 1}}, "stream_options.continuous_usage_stats"),
        ({"stream": True, "stream_options": {"unknown": True}}, "stream_options.unknown"),
        ({"store": "yes"}, "store"),
        ({"metadata": {"k": 5}}, "metadata.k"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"service_tier": "turbo"}, "service_tier"),
        ({"verbosity": "loud"}, "verbosity"),
        ({"prompt_cache_key": 7}, "prompt_cache_key"),
        ({"safety_identifier": ["x"]}, "safety_identifier"),
        ({"prediction": {"type": "content"}}, "prediction.content"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
        ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
         "structured_outputs"),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_chat_request_errors_name_the_field(extra, param):
    err = error_of(ChatCompletionRequest, {"model": "m", "messages": MSGS, **extra})
    assert err["param"] == param
    assert param.split("[")[0].split(".")[0] in err["message"]


def test_chat_request_valid_and_sampling_params():
    req = ChatCompletionRequest.model_validate({
        "model": "glm", "messages": MSGS, "temperature": 0.3, "top_p": 0.9, "top_k": -1,
        "seed": 7, "stop": "END", "stop_token_ids": [5], "max_tokens": 10,
        "max_completion_tokens": 20, "logprobs": True, "top_logprobs": 4, "n": 2,
        "presence_penalty": 0.5, "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": " High ",
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "min_tokens": 3, "skip_special_tokens": False, "include_stop_str_in_output": True,
        # accepted and ignored (docs/api.md)
        "store": False, "metadata": {"k": "v"}, "service_tier": "auto", "prompt_cache_key": "p",
        "safety_identifier": "s", "verbosity": "low", "modalities": ["text"],
        "prediction": {"type": "content", "content": [{"type": "text", "text": "x"}]},
    })
    assert req.reasoning_effort == "high" and req.enable_thinking() is False
    assert req.usage_options() == (True, True)
    assert req.to_sampling_params() == {
        "temperature": 0.3, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "seed": 7,
        "max_tokens": 20, "stop": ["END"], "stop_token_ids": [5], "ignore_eos": False,
        "presence_penalty": 0.5, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
        "logprobs": 4, "n": 2, "min_tokens": 3, "skip_special_tokens": False, "include_stop_str_in_output": True,
    }
    # like vLLM, usage on every chunk needs include_usage
    cont = {"messages": MSGS, "stream": True, "stream_options": {"continuous_usage_stats": True}}
    assert ChatCompletionRequest.model_validate(cont).usage_options() == (False, False)


def test_sampling_defaults():
    req = ChatCompletionRequest.model_validate({"messages": MSGS, "logprobs": True})
    params = req.to_sampling_params({"temperature": 0.6, "top_p": 0.95, "max_tokens": 99})
    assert params["temperature"] == 0.6 and params["top_p"] == 0.95
    assert params["max_tokens"] == 99 and params["logprobs"] == 0 and params["stop"] == []
    assert ChatCompletionRequest.model_validate({"messages": MSGS}).to_sampling_params()[
        "logprobs"] is None
    assert ChatCompletionRequest.model_validate({"messages": MSGS}).to_sampling_params()[
        "max_tokens"] is None


@pytest.mark.parametrize(
    "prompt,expected",
    [
        ("hello", ["hello"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_completion_prompt_forms(prompt, expected):
    req = CompletionRequest.model_validate({"prompt": prompt, "logprobs": 5})
    assert req.prompts() == expected
    assert req.to_sampling_params()["logprobs"] == 5


@pytest.mark.parametrize(
    "body,param",
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": "x", "logprobs": 6}, "logprobs"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "echo": True, "max_tokens": -1}, "max_tokens"),
        ({"prompt": "x", "echo": "yes"}, "echo"),
        ({"prompt": "x", "store": True}, "store"),  # a chat field, not a legacy completions one
        ({"prompt": "x", "suffix": "tail"}, "suffix"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
    ],
)
def test_completion_errors(body, param):
    err = error_of(CompletionRequest, body)
    assert err["param"].startswith(param)


def test_completion_echo_params():
    echo = CompletionRequest.model_validate({"prompt": [1, 2, 3], "echo": True, "logprobs": 2, "max_tokens": 0})
    params = echo.to_sampling_params()
    assert echo.prompt_only() and params["max_tokens"] == 1 and params["prompt_logprobs"] == 2
    both = CompletionRequest.model_validate({"prompt": "x", "echo": True, "logprobs": 1, "prompt_logprobs": 3})
    assert both.to_sampling_params()["prompt_logprobs"] == 3 and not both.prompt_only()
    plain = CompletionRequest.model_validate({"prompt": "x", "echo": True, "max_tokens": 4})
    assert "prompt_logprobs" not in plain.to_sampling_params()  # echo without logprobs: text only
    so = CompletionRequest.model_validate({"prompt": "x", "structured_outputs": {"json": '{"type": "object"}'}})
    assert so.structured_outputs.json_ == {"type": "object"}


def test_tokenize_requests():
    by_prompt = TokenizeRequest.model_validate({"model": "m", "prompt": "hi"})
    assert by_prompt.special_tokens() is True
    by_chat = TokenizeRequest.model_validate({"model": "m", "messages": MSGS})
    assert by_chat.special_tokens() is False and by_chat.add_generation_prompt
    assert error_of(TokenizeRequest, {"model": "m"})["param"] == "prompt"
    assert error_of(TokenizeRequest, {"prompt": "x", "messages": MSGS})["param"] == "prompt"
    bad = {"messages": [{"role": "user", "content": None}]}
    assert error_of(TokenizeRequest, bad)["param"] == "messages[0].content"
    assert DetokenizeRequest.model_validate({"tokens": [1, 2]}).tokens == [1, 2]
    assert error_of(DetokenizeRequest, {"tokens": [1, -5]})["param"] == "tokens[1]"
    out = TokenizeResponse(tokens=[1, 2], count=2, max_model_len=128).model_dump()
    assert out == {"tokens": [1, 2], "count": 2, "max_model_len": 128, "token_strs": None}


def test_error_body_and_parse_request():
    assert error_body("boom") == {
        "error": {"message": "boom", "type": "BadRequestError", "param": None, "code": None}
    }
    assert error_body("x", type="NotFoundError", param="model", code="model_not_found")["error"]["code"] == \
        "model_not_found"
    req, err = parse_request(ChatCompletionRequest, {"messages": MSGS})
    assert err is None and isinstance(req, ChatCompletionRequest)
    req, err = parse_request(ChatCompletionRequest, ["not", "an", "object"])
    assert req is None and err["error"]["param"] is None and err["error"]["code"] is None
    req, err = parse_request(ChatCompletionRequest, {"messages": MSGS, "n": "many"})
    assert req is None and err["error"]["param"] == "n"


def test_response_shapes():
    usage = UsageInfo.of(prompt_tokens=5, completion_tokens=3, cached_tokens=2)
    assert usage.model_dump() == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                                  "prompt_tokens_details": {"cached_tokens": 2}}
    assert UsageInfo().model_dump()["prompt_tokens_details"] == {"cached_tokens": 0}
    resp = ChatCompletionResponse(
        model="glm",
        choices=[ChatCompletionChoice(index=0, message=ChatMessage(content="hey"),
                                      finish_reason="stop")],
        usage=usage,
    ).model_dump()
    assert resp["object"] == "chat.completion" and resp["id"].startswith("chatcmpl-")
    assert resp["choices"][0]["message"] == {"role": "assistant", "content": "hey",
                                             "reasoning_content": None, "reasoning": None}  # no "tool_calls" key
    delta = DeltaMessage.from_parser(merge_deltas([
        {"reasoning_content": "r"},
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                         "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
    ]))
    assert delta.tool_calls[0].function.arguments == "{}" and delta.reasoning_content == "r"
    chunk = ChatCompletionStreamResponse(
        id="chatcmpl-1", model="glm",
        choices=[ChatCompletionStreamChoice(index=0, delta=delta)],
    ).model_dump()
    assert chunk["object"] == "chat.completion.chunk" and chunk["usage"] is None
    streamed = ChatCompletionStreamResponse(id="c", model="glm", choices=[
        ChatCompletionStreamChoice(index=0, delta=DeltaMessage(content="x"))]).model_dump(exclude_none=True)
    assert streamed["choices"][0] == {"index": 0, "delta": {"content": "x"}, "logprobs": None, "finish_reason": None}
    legacy = CompletionResponse(
        model="glm",
        choices=[CompletionChoice(index=0, text="x", finish_reason="length",
                                  logprobs=CompletionLogprobs(tokens=["x"], token_logprobs=[-0.1],
                                                              top_logprobs=[{"x": -0.1}],
                                                              text_offset=[0]))],
    ).model_dump()
    assert legacy["object"] == "text_completion"
    assert set(legacy["choices"][0]["logprobs"]) == {"tokens", "token_logprobs", "top_logprobs",
                                                     "text_offset"}
    top = ChatTopLogprob(token="x", logprob=-0.1, bytes=[120])
    chat_lp = ChatChoiceLogprobs(content=[ChatLogprobToken(token="x", logprob=-0.1, bytes=[120],
                                                           top_logprobs=[top])]).model_dump()
    assert chat_lp == {"content": [{"token": "x", "logprob": -0.1, "bytes": [120],
                                    "top_logprobs": [{"token": "x", "logprob": -0.1,
                                                      "bytes": [120]}]}]}
    models = ModelList(data=[ModelCard(id="glm", max_model_len=4096)]).model_dump()
    assert models["object"] == "list" and models["data"][0]["object"] == "model"
