"""Parse GLM-4.5/4.7/5 tool calls out of model content, one-shot or streaming.

Wire format: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`,
whitespace (newlines, GLM-4.5 style) allowed between the name and the pairs and between
pairs; `<tool_call>NAME</tool_call>` is a call without arguments. Several calls may follow
each other. String values are written raw, other values as JSON, so each value is typed by
the tool's JSON schema (`convert_argument`).

A block that does not parse (bad name, missing tags, a name outside `allowed_names`) or is
never closed stays in the content as raw text. Whitespace next to an accepted call is
dropped (the segment before a call is right-stripped, the one after it left-stripped).

Output shapes are OpenAI's: one-shot `parse_tool_calls` returns `(content, tool_calls)` with
`{"id", "type": "function", "function": {"name", "arguments": "<JSON>"}}` items; the
streaming `ToolCallStreamParser.feed` returns a list of `delta` objects: `{"content": ...}`
or `{"tool_calls": [...]}` (per call: one delta with index, id, type and name and empty
arguments, then one with the whole arguments JSON once the call has closed).
"""

from __future__ import annotations

import ast
import json
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from tpserve.server.reasoning import partial_tag_suffix

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
KEY_START, KEY_END = "<arg_key>", "</arg_key>"
VALUE_START, VALUE_END = "<arg_value>", "</arg_value>"
_JSON_TYPES = ("integer", "number", "boolean", "object", "array", "null")


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def tool_parameter_schemas(tools: Iterable[Any] | None) -> dict[str, dict[str, Any]]:
    """{function name: {parameter name: JSON schema}} from an OpenAI tools list."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        if hasattr(tool, "model_dump"):
            tool = tool.model_dump(exclude_none=True)
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        params = function.get("parameters")
        props = params.get("properties") if isinstance(params, Mapping) else None
        out[function["name"]] = dict(props) if isinstance(props, Mapping) else {}
    return out


def schema_types(schema: Any) -> set[str]:
    """The JSON types a schema allows (from type, anyOf/oneOf/allOf, enum or const)."""
    if not isinstance(schema, Mapping):
        return set()
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    types: set[str] = set()
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or ():
            types |= schema_types(sub)
    values = list(schema.get("enum") or ())
    if "const" in schema:
        values.append(schema["const"])
    for value in values:
        types.add("string" if isinstance(value, str) else "json")
    return types


def _decode_json(raw: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(raw)
    except (ValueError, RecursionError):
        return False, None


def _json_type_ok(value: Any, types: set[str]) -> bool:
    checks = {
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "null": lambda v: v is None,
        "json": lambda v: True,
    }
    return any(checks[t](value) for t in types if t in checks)


def convert_argument(raw: str, schema: Any) -> Any:
    """Type one raw `<arg_value>` by its parameter schema (None: parameter not in the schema).

    string-only parameters stay strings ("007" stays "007"); integer/number/boolean/object/
    array/null are decoded as JSON (then, for object/array, as a Python literal; True/False
    are accepted for booleans), keeping the raw string when that fails; a parameter that
    allows string and other types is decoded only if the result has one of the other types;
    unknown parameters and schemas without a type are decoded as JSON if possible.
    """
    types = schema_types(schema)
    if types == {"string"}:
        return raw
    ok, value = _decode_json(raw.strip())
    if "string" in types:
        return value if ok and _json_type_ok(value, types - {"string"}) else raw
    if not types or not types & {*_JSON_TYPES, "json"}:
        return value if ok else raw
    if ok:
        return value
    text = raw.strip()
    if "boolean" in types and text in ("True", "False"):
        return text == "True"
    if types & {"object", "array"}:
        try:
            literal = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return raw
        if isinstance(literal, (dict, list)):
            return literal
    return raw


def _valid_name(name: str) -> bool:
    return bool(name) and not any(c.isspace() or c in "<>" for c in name)


def parse_call_body(body: str) -> tuple[str, list[tuple[str, str]]] | None:
    """(name, [(key, raw value)...]) of the text between the call tags, or None if malformed."""
    first = body.find(KEY_START)
    name = (body if first < 0 else body[:first]).strip()
    if not _valid_name(name):
        return None
    pairs: list[tuple[str, str]] = []
    pos = len(body) if first < 0 else first
    while True:
        while pos < len(body) and body[pos].isspace():
            pos += 1
        if pos == len(body):
            return name, pairs
        if not body.startswith(KEY_START, pos):
            return None
        key_end = body.find(KEY_END, pos)
        if key_end < 0:
            return None
        key = body[pos + len(KEY_START) : key_end].strip()
        pos = key_end + len(KEY_END)
        while pos < len(body) and body[pos].isspace():
            pos += 1
        if not key or not body.startswith(VALUE_START, pos):
            return None
        value_end = body.find(VALUE_END, pos)
        if value_end < 0:
            return None
        pairs.append((key, body[pos + len(VALUE_START) : value_end]))
        pos = value_end + len(VALUE_END)


class _CallBuilder:
    """Turns call bodies into OpenAI tool calls, typed by the tools' schemas."""

    def __init__(self, tools: Iterable[Any] | None, allowed_names: Iterable[str] | None):
        self.schemas = tool_parameter_schemas(tools)
        self.allowed = None if allowed_names is None else frozenset(allowed_names)

    def build(self, body: str) -> dict | None:
        parsed = parse_call_body(body)
        if parsed is None:
            return None
        name, pairs = parsed
        if self.allowed is not None and name not in self.allowed:
            return None
        params = self.schemas.get(name, {})
        arguments = {key: convert_argument(raw, params.get(key)) for key, raw in pairs}
        return {
            "id": new_call_id(),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
        }


def parse_tool_calls(
    text: str,
    tools: Iterable[Any] | None = None,
    allowed_names: Iterable[str] | None = None,
) -> tuple[str, list[dict]]:
    """One-shot: (content outside accepted calls, OpenAI tool_calls)."""
    builder = _CallBuilder(tools, allowed_names)
    segments: list[str] = []  # content around accepted calls: len(calls) + 1 of them
    calls: list[dict] = []
    current = ""
    pos = 0
    while True:
        start = text.find(CALL_START, pos)
        end = -1 if start < 0 else text.find(CALL_END, start + len(CALL_START))
        if end < 0:
            current += text[pos:]
            break
        call = builder.build(text[start + len(CALL_START) : end])
        after = end + len(CALL_END)
        if call is None:
            current += text[pos:after]  # not a call: the raw block stays content
        else:
            segments.append(current + text[pos:start])
            calls.append(call)
            current = ""
        pos = after
    segments.append(current)
    content = []
    for i, segment in enumerate(segments):
        if i < len(calls):
            segment = segment.rstrip()
        if i > 0:
            segment = segment.lstrip()
        content.append(segment)
    return "".join(content), calls


class ToolCallStreamParser:
    """Streaming: `feed(delta) -> list of OpenAI delta dicts`, then `finish()`."""

    def __init__(
        self,
        tools: Iterable[Any] | None = None,
        allowed_names: Iterable[str] | None = None,
    ):
        self._builder = _CallBuilder(tools, allowed_names)
        self._buf = ""
        self._in_call = False
        self._pending_ws = ""  # trailing whitespace held: dropped if a call follows
        self._skip_ws = False  # just after an accepted call: drop leading whitespace
        self._out: list[dict] = []
        self.calls: list[dict] = []  # completed calls, in OpenAI shape

    def _emit_content(self, text: str) -> None:
        if self._skip_ws:
            text = text.lstrip()
            if not text:
                return
            self._skip_ws = False
        if not text:
            return
        combined = self._pending_ws + text
        body = combined.rstrip()
        self._pending_ws = combined[len(body) :]
        if body:
            self._out.append({"content": body})

    def _close_call(self, body: str) -> None:
        call = self._builder.build(body)
        if call is None:
            self._emit_content(CALL_START + body + CALL_END)
            return
        index = len(self.calls)
        self.calls.append(call)
        self._pending_ws = ""
        self._skip_ws = True
        function = call["function"]
        self._out.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": function["name"], "arguments": ""},
                    }
                ]
            }
        )
        self._out.append(
            {"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]}
        )

    def feed(self, delta: str) -> list[dict]:
        self._buf += delta
        while self._buf:
            if self._in_call:
                end = self._buf.find(CALL_END)
                if end < 0:
                    break
                body, self._buf = self._buf[:end], self._buf[end + len(CALL_END) :]
                self._in_call = False
                self._close_call(body)
                continue
            start = self._buf.find(CALL_START)
            if start >= 0:
                self._emit_content(self._buf[:start])
                self._buf = self._buf[start + len(CALL_START) :]
                self._in_call = True
                continue
            hold = partial_tag_suffix(self._buf, CALL_START)
            self._emit_content(self._buf[: len(self._buf) - hold])
            self._buf = self._buf[len(self._buf) - hold :]
            break
        out, self._out = self._out, []
        return out

    def finish(self) -> list[dict]:
        """Flush held text (an unclosed call becomes content); call once at the end."""
        buf, self._buf = self._buf, ""
        self._emit_content(CALL_START + buf if self._in_call else buf)
        self._in_call = False
        if self._pending_ws:
            self._out.append({"content": self._pending_ws})
            self._pending_ws = ""
        out, self._out = self._out, []
        return out
