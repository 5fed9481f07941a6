"""Request fields that constrain sampling: `logit_bias`, `response_format` and a forced
`tool_choice` ("required" or a named function), turned into SamplingParams extras.

Constrained outputs are generated without thinking (the grammar covers the whole output): the
chat handler renders the prompt with thinking off when `constraint_for_chat` returns a grammar.
Tool calls are constrained to GLM's wire format (see tool_calls.py) with each argument value
constrained by its JSON schema (string values raw, others as JSON).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tpserve.engine.logits_process import GrammarCompiler, StructuredOutput
from tpserve.server.tool_calls import schema_types
from tpserve.server.state import ApiError, ServerState


def grammar_compiler(state: ServerState) -> GrammarCompiler:
    """The server's compiler (built by the engine's warm-up, else on first use; ~10 ms for the tiny tokenizer, ~1 s
    for a real one)."""
    if state.grammar is None:
        eng = state.engine.engine
        state.grammar = getattr(eng, "grammar_compiler", None) or GrammarCompiler(
            state.need_tokenizer("structured output"), eng.model_config.vocab_size, sorted(eng.eos_ids))
    return state.grammar


def logit_bias(state: ServerState, req) -> dict[int, float] | None:
    if not req.logit_bias:
        return None
    vocab = state.engine.engine.model_config.vocab_size
    out = {int(k): float(v) for k, v in req.logit_bias.items()}
    bad = [t for t in out if t >= vocab]
    if bad:
        raise ApiError(400, f"logit_bias: token ids {bad[:3]} are out of range for vocab_size {vocab}",
                       param="logit_bias")
    return out


def response_format_constraint(state: ServerState, req) -> StructuredOutput | None:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    try:
        if fmt.type == "json_object":
            return grammar_compiler(state).json_object()
        schema = fmt.json_schema.json_schema
        return grammar_compiler(state).json_schema(schema)
    except ValueError as exc:
        raise ApiError(400, f"response_format.json_schema.schema: {exc}",
                       param="response_format.json_schema.schema") from None


def constraint_for_chat(state: ServerState, req, policy) -> StructuredOutput | None:
    """The grammar of a chat request: a forced tool call, else response_format, else None."""
    forced = policy.required or (policy.allowed_names is not None)
    if forced and policy.template_tools:
        try:
            several = policy.required and req.parallel_tool_calls is not False
            grammar = tool_call_grammar(policy.template_tools, several=several,
                                        tokens=tag_token_ids(state.tokenizer))
            return grammar_compiler(state).lark(grammar, "tool_call")
        except ValueError as exc:
            raise ApiError(400, f"tools: a tool's parameters cannot be used for tool_choice: {exc}",
                           param="tools") from None
    return response_format_constraint(state, req)


TAGS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


def tag_token_ids(tokenizer) -> dict[str, int] | None:
    """{tag: id} when every tool-call tag is one added token of the tokenizer, else None (text tags)."""
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    return {t: added[t] for t in TAGS} if all(t in added for t in TAGS) else None


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _value_rule(schema: Any) -> str:
    types = schema_types(schema)
    if types == {"string"}:
        values = [v for v in (schema.get("enum") or ()) if isinstance(v, str)]
        if "const" in schema and isinstance(schema["const"], str):
            values = [schema["const"]]
        return "(" + " | ".join(_lit(v) for v in values) + ")" if values else "/[^<]*/"
    return "%json " + json.dumps(schema if isinstance(schema, Mapping) else {}, ensure_ascii=False)


def tool_call_grammar(tools: list[dict], *, several: bool, tokens: Mapping[str, int] | None = None) -> str:
    """Lark (llguidance dialect) for one (or, with `several`, one or more) GLM tool calls."""
    tag = {name: f"<{name}>" for name in ("tool_call", "/tool_call", "arg_key", "/arg_key", "arg_value",
                                           "/arg_value")}
    if tokens is not None:  # the tags are single special tokens: reference them by id
        tag = {name: f"<[{tokens[f'<{name}>']}]>" for name in tag}
    rules, calls = [], []
    for i, tool in enumerate(tools):
        function = tool["function"]
        params = function.get("parameters") or {}
        props = params.get("properties") if isinstance(params, Mapping) else None
        props = props if isinstance(props, Mapping) else {}
        required = set(params.get("required") or ()) if isinstance(params, Mapping) else set()
        pairs = []
        for j, (key, schema) in enumerate(props.items()):
            rules.append(f"v_{i}_{j}: {_value_rule(schema)}")
            pair = (f'"\\n"? {tag["arg_key"]} {_lit(key)} {tag["/arg_key"]} "\\n"? {tag["arg_value"]} v_{i}_{j} '
                    f'{tag["/arg_value"]}')
            pairs.append(f"({pair})" + ("" if key in required else "?"))
        rules.append(f'call_{i}: {tag["tool_call"]} {_lit(function["name"])} {" ".join(pairs)} "\\n"? '
                     f'{tag["/tool_call"]}')
        calls.append(f"call_{i}")
    any_call = "(" + " | ".join(calls) + ")"
    start = f'start: {any_call} ("\\n"? {any_call})*' if several else f"start: {any_call}"
    return "\n".join([start, *rules]) + "\n"
