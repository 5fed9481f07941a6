"""Request fields that constrain sampling: `logit_bias`, `response_format`, vLLM's
`structured_outputs` and a forced `tool_choice` ("required" or a named function), turned into
SamplingParams extras.

Constrained outputs are generated without thinking (the grammar covers the whole output): the
chat handler renders the prompt with thinking off when `constraint_for_chat` returns a grammar.
Tool calls are constrained to GLM's wire format (see tool_calls.py) with each argument value
constrained by its JSON schema (string values raw, others as JSON). JSON schemas go through
`close_objects` first: an object lists the only keys it may have unless the schema opens it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tpserve.engine.logits_process import GrammarCompiler, StructuredOutput
from tpserve.server.reasoning import THINK_END, THINK_START, ReasoningMode
from tpserve.server.tool_calls import schema_types
from tpserve.server.state import ApiError, ServerState


def grammar_compiler(state: ServerState) -> GrammarCompiler:
    """The server's compiler (built by the engine's warm-up, else on first use: it indexes the vocabulary)."""
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


# keywords whose value is one subschema, a list of them, or a name -> subschema map
_ONE = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems", "unevaluatedItems", "contains",
        "not", "if", "then", "else", "propertyNames")
_LIST = ("anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def close_objects(schema: Any, close: bool = True) -> Any:
    """A copy of `schema` where each object schema that lists properties and says nothing of other
    keys (no additionalProperties / unevaluatedProperties) gets additionalProperties: false.

    OpenAI's strict mode and vLLM's default backend close objects so; left open, a sampled model
    can keep adding keys until max_tokens. allOf members stay open (closing each would forbid the
    other members' keys), and so do anyOf / oneOf members of an object that lists keys itself."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    lists_keys = "properties" in out or "patternProperties" in out
    for key in _MAP:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: close_objects(sub) for name, sub in out[key].items()}
    for key in _ONE:
        if isinstance(out.get(key), Mapping):
            out[key] = close_objects(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            members = key in ("anyOf", "oneOf")  # alternatives of this object, not array items
            out[key] = [close_objects(sub, close=not (members and lists_keys)) for sub in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [close_objects(sub, close=False) for sub in out["allOf"]]
    if close and lists_keys and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out


def request_constraint(state: ServerState, req) -> StructuredOutput | None:
    """The grammar of `response_format` or `structured_outputs` (the request models allow one)."""
    if getattr(req, "structured_outputs", None) is not None:
        return structured_outputs_constraint(state, req.structured_outputs)
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    schema = fmt.json_schema.json_schema if fmt.type == "json_schema" else fmt.object_schema
    param = "response_format.json_schema.schema" if fmt.type == "json_schema" else "response_format.schema"
    try:
        if schema is None:
            return grammar_compiler(state).json_object()
        return grammar_compiler(state).json_schema(close_objects(schema))
    except ValueError as exc:
        raise ApiError(400, f"{param}: {exc}", param=param) from None


def structured_outputs_constraint(state: ServerState, so) -> StructuredOutput:
    """vLLM's structured_outputs: json (a schema), json_object, regex, choice or grammar (Lark or GBNF)."""
    import llguidance
    from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

    compiler = grammar_compiler(state)
    kind = "json" if so.json_ is not None else next(k for k in ("json_object", "regex", "choice", "grammar")
                                                    if getattr(so, k))
    try:
        if kind == "json":
            return compiler.json_schema(close_objects(so.json_))
        if kind == "json_object":
            return compiler.json_object()
        if kind == "regex":
            return compiler.lark(llguidance.LLMatcher.grammar_from_regex(so.regex), "regex")
        if kind == "choice":
            return compiler.lark("start: " + " | ".join(_lit(c) for c in so.choice) + "\n", "choice")
        return compiler.lark(any_to_lark(so.grammar), "grammar")
    except (ValueError, TypeError, GbnfToLarkError) as exc:
        raise ApiError(400, f"structured_outputs.{kind}: {exc}", param=f"structured_outputs.{kind}") from None


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
    return request_constraint(state, req)


def strict_tools(policy) -> bool:
    """Whether the request's calls are parsed and a tool is `strict` (what strict_tools_constraint holds)."""
    return policy.parse_tools and any((t.get("function") or {}).get("strict") for t in policy.template_tools or ())


def strict_tools_constraint(state: ServerState, req, policy, mode: ReasoningMode) -> StructuredOutput | None:
    """For tool_choice "auto" where a tool is `strict` (and nothing else constrains the output), as OpenAI's
    strict function calling: the output's reasoning (as `mode`, the rendered prompt's) and text are free, and
    any calls after them valid (strict_tools_grammar). None otherwise."""
    if not strict_tools(policy):
        return None
    tools, tokenizer = policy.template_tools, state.tokenizer
    tokens = tag_token_ids(tokenizer)
    if tokens is None:  # text tags: free text could not be kept from writing a call
        return None
    try:
        grammar = strict_tools_grammar(tools, several=req.parallel_tool_calls is not False, tokens=tokens, mode=mode,
                                       think_ids=think_token_ids(tokenizer))
        return grammar_compiler(state).lark(grammar, "strict_tools")
    except ValueError as exc:
        raise ApiError(400, f"tools: a strict tool's parameters cannot be used: {exc}", param="tools") from None


TAGS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


def _added_ids(tokenizer, names: tuple[str, ...]) -> list[int] | None:
    """The ids of `names` when each is one added token of the tokenizer, else None (text tags)."""
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    return [added[n] for n in names] if all(n in added for n in names) else None


def tag_token_ids(tokenizer) -> dict[str, int] | None:
    """{tag: id} when every tool-call tag is one added token of the tokenizer, else None (text tags)."""
    ids = _added_ids(tokenizer, TAGS)
    return None if ids is None else dict(zip(TAGS, ids))


def think_token_ids(tokenizer) -> tuple[int, int] | None:
    """(<think>, </think>) when both are added tokens of the tokenizer, else None (text tags)."""
    ids = _added_ids(tokenizer, (THINK_START, THINK_END))
    return None if ids is None else (ids[0], ids[1])


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _value_rule(schema: Any) -> str:
    types = schema_types(schema)
    if types == {"string"}:
        values = [v for v in (schema.get("enum") or ()) if isinstance(v, str)]
        if "const" in schema and isinstance(schema["const"], str):
            values = [schema["const"]]
        return "(" + " | ".join(_lit(v) for v in values) + ")" if values else "/[^<]*/"
    return "%json " + json.dumps(close_objects(schema) if isinstance(schema, Mapping) else {}, ensure_ascii=False)


def tool_call_grammar(tools: list[dict], *, several: bool, tokens: Mapping[str, int] | None = None) -> str:
    """Lark (llguidance dialect) for one (or, with `several`, one or more) GLM tool calls."""
    rules, any_call = _call_rules(tools, tokens, strict_only=False)
    start = f'start: {any_call} ("\\n"? {any_call})*' if several else f"start: {any_call}"
    return "\n".join([start, *rules]) + "\n"


def strict_tools_grammar(tools: list[dict], *, several: bool, tokens: Mapping[str, int], mode: ReasoningMode,
                         think_ids: tuple[int, int] | None = None) -> str:
    """Lark for tool_choice "auto" with `strict` tools: reasoning as `mode` has it (OPEN: the prompt opened it, and
    it closes before any text or call; AUTO: the output may open it), any text, then no call or valid calls. A
    call names a declared tool; a strict tool's arguments follow its schema, another's are any keys and values.
    The call tags are special tokens (`tokens`): free text cannot produce them, only the call rules do."""
    rules, any_call = _call_rules(tools, tokens, strict_only=True)
    think, end = (f"<[{think_ids[0]}]>", f"<[{think_ids[1]}]>") if think_ids else (_lit(THINK_START), _lit(THINK_END))
    answer = "TEXT " + (f'({any_call} ("\\n"? {any_call})*)?' if several else f"{any_call}?")
    start = {ReasoningMode.OFF: answer, ReasoningMode.OPEN: f"TEXT ({end} {answer})?",
             ReasoningMode.AUTO: f"({think} TEXT {end})? {answer}"}[ReasoningMode(mode)]
    return "\n".join([f"start: {start}", "TEXT: /(?s:.*)/", *rules]) + "\n"


def _call_rules(tools: list[dict], tokens: Mapping[str, int] | None, strict_only: bool) -> tuple[list[str], str]:
    """The rules of each tool's call and their alternatives: arguments by the tool's schema (with `strict_only`,
    only for tools marked `strict`; the others' any keys and values)."""
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
        if strict_only and not function.get("strict"):
            props = {}
            pairs.append(f'("\\n"? {tag["arg_key"]} /[^<]+/ {tag["/arg_key"]} "\\n"? {tag["arg_value"]} /[^<]*/ '
                         f'{tag["/arg_value"]})*')
        for j, (key, schema) in enumerate(props.items()):
            rules.append(f"v_{i}_{j}: {_value_rule(schema)}")
            pair = (f'"\\n"? {tag["arg_key"]} {_lit(key)} {tag["/arg_key"]} "\\n"? {tag["arg_value"]} v_{i}_{j} '
                    f'{tag["/arg_value"]}')
            pairs.append(f"({pair})" + ("" if key in required else "?"))
        rules.append(f'call_{i}: {tag["tool_call"]} {_lit(function["name"])} {" ".join(pairs)} "\\n"? '
                     f'{tag["/tool_call"]}')
        calls.append(f"call_{i}")
    return rules, "(" + " | ".join(calls) + ")"
