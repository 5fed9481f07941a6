"""Front door for output parsing: tool_choice policy and the combined chat output parser.

The pieces live in `reasoning.py` (think blocks) and `tool_calls.py` (GLM tool calls); this
module re-exports them and adds:

* `resolve_tool_choice(tools, tool_choice) -> ToolPolicy`: which tools the template sees,
  whether the output is parsed for calls, and which function names are accepted.
    - no tools: nothing is parsed;
    - "none": tools are not given to the template and the output is not parsed;
    - "auto" (the default when tools are given): all tools, calls parsed;
    - "required": like "auto" for parsing; the server forces one or more calls with a grammar
      (server/structured.py);
    - {"type": "function", "function": {"name": X}}: only X is given to the template and
      only calls to X are accepted; the server's grammar forces one call to X.
  Checking a named function against `tools` is protocol's job (HTTP 400).
* `ChatOutputParser`: reasoning then tool calls, streaming (`feed` / `finish`, OpenAI delta
  dicts) and one-shot (`parse_chat_output`, an OpenAI assistant message dict).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tpserve.server.reasoning import (
    ReasoningMode,
    ReasoningParser,
    ReasoningStreamParser,
    partial_tag_suffix,
    reasoning_mode_for_prompt,
)
from tpserve.server.tool_calls import (
    ToolCallStreamParser,
    convert_argument,
    parse_call_body,
    parse_tool_calls,
    tool_parameter_schemas,
)

__all__ = [
    "ChatOutputParser",
    "ReasoningMode",
    "ReasoningParser",
    "ReasoningStreamParser",
    "ToolCallStreamParser",
    "ToolPolicy",
    "chat_finish_reason",
    "convert_argument",
    "merge_deltas",
    "parse_call_body",
    "parse_chat_output",
    "parse_tool_calls",
    "partial_tag_suffix",
    "reasoning_mode_for_prompt",
    "resolve_tool_choice",
    "tool_parameter_schemas",
]


@dataclass(frozen=True)
class ToolPolicy:
    template_tools: list[dict] | None  # tools to render into the prompt
    parse_tools: bool  # look for tool calls in the output
    allowed_names: frozenset[str] | None  # accept only calls to these (None: any)
    required: bool  # tool_choice was "required" (forced by server/structured.py's grammar)


def _plain(value: Any) -> Any:
    return value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else value


def _tool_name(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    return function.get("name") if isinstance(function, Mapping) else None


def resolve_tool_choice(tools: Iterable[Any] | None, tool_choice: Any) -> ToolPolicy:
    """The ToolPolicy for a request's `tools` and `tool_choice` (see the module docstring).

    Raises ValueError for a tool_choice that is not "none"/"auto"/"required" or a named
    function, or that names a function missing from `tools`.
    """
    tool_list = [_plain(t) for t in tools or ()]
    choice = _plain(tool_choice)
    if choice is None:
        choice = "auto"
    if not tool_list or choice == "none":
        return ToolPolicy(None, False, None, False)
    if choice in ("auto", "required"):
        return ToolPolicy(tool_list, True, None, choice == "required")
    name = _tool_name(choice) if isinstance(choice, Mapping) else None
    if not isinstance(name, str) or choice.get("type", "function") != "function":
        raise ValueError(
            "tool_choice must be 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}'
        )
    chosen = [t for t in tool_list if _tool_name(t) == name]
    if not chosen:
        raise ValueError(f"tool_choice names function {name!r}, which is not in tools")
    return ToolPolicy(chosen, True, frozenset([name]), False)


class ChatOutputParser:
    """Streaming parser for one choice: reasoning first, then tool calls in the content.

    `feed(delta_text)` and `finish()` return lists of OpenAI `delta` dicts, each one of
    {"reasoning_content": str}, {"content": str} or {"tool_calls": [...]}; `merge_deltas`
    folds a list into one delta. `tool_calls` holds the completed calls.
    """

    def __init__(
        self,
        reasoning_mode: ReasoningMode | str = ReasoningMode.AUTO,
        tools: Iterable[Any] | None = None,
        *,
        parse_tools: bool = True,
        allowed_names: Iterable[str] | None = None,
    ):
        self._reasoning = ReasoningStreamParser(reasoning_mode)
        self._tools = ToolCallStreamParser(tools, allowed_names) if parse_tools else None

    @property
    def tool_calls(self) -> list[dict]:
        return list(self._tools.calls) if self._tools is not None else []

    def _route(self, reasoning: str, content: str, final: bool) -> list[dict]:
        out: list[dict] = [{"reasoning_content": reasoning}] if reasoning else []
        if self._tools is None:
            if content:
                out.append({"content": content})
            return out
        out += self._tools.feed(content)
        if final:
            out += self._tools.finish()
        return out

    def feed(self, delta_text: str) -> list[dict]:
        return self._route(*self._reasoning.feed(delta_text), final=False)

    def finish(self) -> list[dict]:
        return self._route(*self._reasoning.finish(), final=True)


def parse_chat_output(
    text: str,
    reasoning_mode: ReasoningMode | str = ReasoningMode.AUTO,
    tools: Iterable[Any] | None = None,
    *,
    parse_tools: bool = True,
    allowed_names: Iterable[str] | None = None,
) -> dict:
    """One-shot: the OpenAI assistant message for a whole output.

    {"role": "assistant", "content": str | None (None when there are calls and no text),
     "reasoning_content": str | None, "tool_calls": [...] (only when there are calls)}.
    """
    reasoning, content = ReasoningParser(reasoning_mode).parse(text)
    calls: list[dict] = []
    if parse_tools:
        content, calls = parse_tool_calls(content, tools, allowed_names)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if content or not calls else None,
        "reasoning_content": reasoning or None,
    }
    if calls:
        message["tool_calls"] = calls
    return message


def merge_deltas(deltas: Iterable[Mapping[str, Any]]) -> dict | None:
    """Fold parser deltas into one OpenAI delta (None if there is nothing to send).

    Text fields are concatenated; tool call fragments with the same index are merged.
    """
    merged: dict[str, Any] = {}
    calls: dict[int, dict] = {}
    for delta in deltas:
        for key in ("reasoning_content", "content"):
            if delta.get(key):
                merged[key] = merged.get(key, "") + delta[key]
        for call in delta.get("tool_calls") or ():
            slot = calls.setdefault(call["index"], {"index": call["index"]})
            for key in ("id", "type"):
                if key in call:
                    slot[key] = call[key]
            function = call.get("function") or {}
            slot_fn = slot.setdefault("function", {})
            if "name" in function:
                slot_fn["name"] = function["name"]
            if "arguments" in function:
                slot_fn["arguments"] = slot_fn.get("arguments", "") + function["arguments"]
    if calls:
        merged["tool_calls"] = [calls[i] for i in sorted(calls)]
    return merged or None


def chat_finish_reason(engine_reason: str | None, tool_calls: list[dict]) -> str | None:
    """OpenAI finish_reason: "tool_calls" when the turn stopped after making calls."""
    if engine_reason == "stop" and tool_calls:
        return "tool_calls"
    return engine_reason
