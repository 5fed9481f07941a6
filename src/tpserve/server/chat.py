"""Turn OpenAI chat messages into a GLM prompt string with the chat template.

`apply_chat_template` validates and normalizes OpenAI message shapes (ValueError naming the
offending field on anything malformed), then renders the tokenizer's template, or
`glm_chat_template.jinja` when the tokenizer has none. See that file for the prompt layout
and for how `reasoning_effort` / `enable_thinking` are rendered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import jinja2

DEFAULT_CHAT_TEMPLATE_PATH = Path(__file__).resolve().parent / "glm_chat_template.jinja"

ROLES = ("system", "user", "assistant", "tool")
# OpenAI's newer name for a system message.
ROLE_ALIASES = {"developer": "system"}
# Text parts of a list-valued content are joined with this (as vLLM does).
PART_SEPARATOR = "\n"
# reasoning_effort values and what the template is given (None: thinking off).
REASONING_EFFORTS = {
    "none": None,
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "max",
    "max": "max",
}
# apply_chat_template's own arguments: never taken from request chat_template_kwargs
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
    "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs", "conversations",
})


class ParamError(ValueError):
    """A ValueError naming the offending request field in `param` (e.g. "messages[2].content")."""

    def __init__(self, param: str | None, message: str):
        super().__init__(message)
        self.param = param


def _fail(param: str, problem: str) -> NoReturn:
    raise ParamError(param, f"{param} {problem}")


def default_chat_template() -> str:
    """The text of our GLM chat template (glm_chat_template.jinja next to this file)."""
    return DEFAULT_CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")


def normalize_reasoning_effort(value: str | None) -> str | None:
    """Lower-cased, stripped effort ("minimal" -> "low", "xhigh" -> "max"); None stays None.

    Returns "none" for "none". Raises ValueError for anything not in REASONING_EFFORTS.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        _fail("reasoning_effort", f"must be a string, got {type(value).__name__}")
    key = value.strip().lower()
    if key not in REASONING_EFFORTS:
        _fail("reasoning_effort", f"must be one of {sorted(REASONING_EFFORTS)}, got {value!r}")
    mapped = REASONING_EFFORTS[key]
    return "none" if mapped is None else mapped


def thinking_enabled(reasoning_effort: str | None, enable_thinking: bool | None) -> bool:
    """False if enable_thinking is False or the effort is "none", else True."""
    if enable_thinking is False:
        return False
    return normalize_reasoning_effort(reasoning_effort) != "none"


def _content_text(content: Any, where: str) -> str:
    """Flatten OpenAI content (a string or a list of text parts) to a string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        _fail(where, f"must be a string or a list of content parts, got {type(content).__name__}")
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, Mapping):
            _fail(f"{where}[{i}]", "must be an object with 'type' and 'text'")
        kind = part.get("type")
        if kind != "text":
            _fail(f"{where}[{i}].type", f"{kind!r} is not supported (only 'text' parts are)")
        text = part.get("text")
        if not isinstance(text, str):
            _fail(f"{where}[{i}].text", "must be a string")
        texts.append(text)
    return PART_SEPARATOR.join(texts)


def _parse_arguments(arguments: Any, where: str) -> dict:
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str):
        _fail(where, f"must be a JSON string, got {type(arguments).__name__}")
    try:
        parsed = json.loads(arguments)
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except json.JSONDecodeError as exc:
        raise ParamError(where, f"{where} is not valid JSON: {exc.msg}") from exc
    except RecursionError:
        raise ParamError(where, f"{where} is nested too deeply") from None
    except UnicodeEncodeError:
        raise ParamError(where, f"{where} contains a lone UTF-16 surrogate (not valid Unicode)") from None
    if not isinstance(parsed, dict):
        _fail(where, f"must encode a JSON object, got {type(parsed).__name__}")
    return parsed


def _normalize_tool_calls(tool_calls: Any, where: str) -> list[dict]:
    if not isinstance(tool_calls, list):
        _fail(where, "must be a list")
    calls = []
    for j, call in enumerate(tool_calls):
        at = f"{where}[{j}]"
        if not isinstance(call, Mapping):
            _fail(at, "must be an object")
        kind = call.get("type", "function")
        if kind != "function":
            _fail(f"{at}.type", f"must be 'function', got {kind!r}")
        function = call.get("function")
        if not isinstance(function, Mapping):
            _fail(f"{at}.function", "must be an object with 'name' and 'arguments'")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            _fail(f"{at}.function.name", "must be a non-empty string")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            _fail(f"{at}.id", "must be a string")
        arguments = _parse_arguments(function.get("arguments"), f"{at}.function.arguments")
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return calls


def _normalize_message(message: Any, i: int, call_names: dict[str, str]) -> dict:
    where = f"messages[{i}]"
    if not isinstance(message, Mapping):
        _fail(where, f"must be an object, got {type(message).__name__}")
    role = message.get("role")
    if not isinstance(role, str):
        _fail(f"{where}.role", "is required and must be a string")
    role = ROLE_ALIASES.get(role, role)
    if role not in ROLES:
        _fail(f"{where}.role", f"{role!r} is not supported; use {', '.join(ROLES)} or developer")
    content = message.get("content")
    out: dict[str, Any] = {"role": role}
    if role == "assistant":
        out["content"] = "" if content is None else _content_text(content, f"{where}.content")
        for key in ("reasoning_content", "reasoning"):
            reasoning = message.get(key)
            if reasoning is not None:
                if not isinstance(reasoning, str):
                    _fail(f"{where}.{key}", "must be a string")
                out["reasoning_content"] = reasoning
                break
        if message.get("tool_calls") is not None:
            out["tool_calls"] = _normalize_tool_calls(message["tool_calls"], f"{where}.tool_calls")
            for call in out["tool_calls"]:
                if call["id"]:
                    call_names[call["id"]] = call["function"]["name"]
    else:
        if content is None:
            _fail(f"{where}.content", f"is required for role '{role}'")
        out["content"] = _content_text(content, f"{where}.content")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if call_id is not None:
            if not isinstance(call_id, str):
                _fail(f"{where}.tool_call_id", "must be a string")
            out["tool_call_id"] = call_id
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            _fail(f"{where}.name", "must be a string")
        out["name"] = name
    elif role == "tool" and out.get("tool_call_id") in call_names:
        out["name"] = call_names[out["tool_call_id"]]
    return out


def normalize_messages(messages: Any) -> list[dict]:
    """Validated copies of OpenAI chat messages in the shape the template reads.

    Content becomes a string, `developer` becomes `system`, assistant `reasoning`
    becomes `reasoning_content`, tool call arguments (JSON strings) become dicts, and a tool
    message gets the `name` of the call its `tool_call_id` answers. Raises ValueError.
    """
    if not isinstance(messages, list) or not messages:
        _fail("messages", "must be a non-empty list")
    call_names: dict[str, str] = {}
    return [_normalize_message(m, i, call_names) for i, m in enumerate(messages)]


def normalize_tools(tools: Any) -> list[dict] | None:
    """Validated plain-dict copies of OpenAI tools; None or [] -> None. Raises ValueError."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        _fail("tools", "must be a list")
    out = []
    for i, tool in enumerate(tools):
        if hasattr(tool, "model_dump"):
            tool = tool.model_dump(exclude_none=True)
        if not isinstance(tool, Mapping):
            _fail(f"tools[{i}]", "must be an object")
        if tool.get("type", "function") != "function":
            _fail(f"tools[{i}].type", "must be 'function'")
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            _fail(f"tools[{i}].function.name", "must be a string")
        out.append({"type": "function", "function": dict(function)})
    return out or None


def apply_chat_template(
    tokenizer: Any,
    messages: list[dict],
    tools: list[dict] | None,
    *,
    add_generation_prompt: bool = True,
    reasoning_effort: str | None = None,
    enable_thinking: bool | None = None,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Render `messages` (OpenAI shapes) and `tools` into the prompt text.

    Template: `chat_template` if given, else the tokenizer's, else our GLM template.
    `tokenizer` may be None (then the template is rendered with transformers' renderer).
    `chat_template_kwargs` are extra template variables (e.g. {"enable_thinking": False});
    the explicit `enable_thinking` / `reasoning_effort` arguments win over them, and keys
    in RESERVED_TEMPLATE_KWARGS (apply_chat_template's own arguments) are ignored.
    Raises ValueError for malformed messages, tools, or a template error.
    """
    normalized = normalize_messages(messages)
    tool_list = normalize_tools(tools)
    kwargs = {
        k: v for k, v in (chat_template_kwargs or {}).items() if k not in RESERVED_TEMPLATE_KWARGS
    }
    effort = normalize_reasoning_effort(reasoning_effort)
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    if enable_thinking is not None:
        kwargs["enable_thinking"] = bool(enable_thinking)
    if effort == "none":
        kwargs["enable_thinking"] = False
    template = chat_template
    if template is None and not getattr(tokenizer, "chat_template", None):
        template = default_chat_template()  # else the tokenizer picks its own (may be named)

    try:
        if tokenizer is not None and hasattr(tokenizer, "apply_chat_template"):
            return tokenizer.apply_chat_template(
                normalized,
                tools=tool_list,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **kwargs,
            )
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template(
            conversations=[normalized],
            tools=tool_list,
            chat_template=template or default_chat_template(),
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
        return rendered[0]
    except jinja2.TemplateError as exc:
        raise ParamError("messages", f"chat template error: {exc}") from exc
