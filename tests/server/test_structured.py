"""Structured output (llguidance) and logit_bias: through the server on the tiny model, and the
logits processor on its own."""

import json

import httpx
import pytest
import torch

from live import LiveServer
from tpserve.engine.logits_process import apply_logits_processors, unpack_bitmask
from tpserve.engine.request import Sequence
from tpserve.sampling_params import SamplingParams

USER = [{"role": "user", "content": "weather?"}]
# a finite language: a constrained random model must close it and stop
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
          "maximum": 99}, "color": {"enum": ["red", "green"]}}, "required": ["ok", "n", "color"],
          "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["unit", "days"]}}},
         {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def server(tiny):
    s = LiveServer(str(tiny("default")), max_num_seqs=8)
    yield s
    s.close()


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=120)


def check_schema(obj):
    assert set(obj) == {"ok", "n", "color"}
    assert isinstance(obj["ok"], bool) and isinstance(obj["n"], int) and 0 <= obj["n"] <= 99
    assert obj["color"] in ("red", "green")


@pytest.mark.parametrize("seed", [1])
def test_json_schema_output_matches(server, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
    r = post(server, "/v1/chat/completions", {"messages": USER, "response_format": fmt, "max_tokens": 120,
                                              "seed": seed, "temperature": 1.0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    check_schema(json.loads(choice["message"]["content"]))
    c = post(server, "/v1/completions", {"prompt": "x", "response_format": fmt, "max_tokens": 120, "seed": seed})
    assert c.json()["choices"][0]["finish_reason"] == "stop"
    check_schema(json.loads(c.json()["choices"][0]["text"]))


def test_json_object_output_is_a_json_prefix(server):
    import llguidance

    from tpserve.server.structured import grammar_compiler

    r = post(server, "/v1/chat/completions", {"messages": USER, "response_format": {"type": "json_object"},
                                              "max_tokens": 40, "seed": 3, "logprobs": True})
    out = r.json()["choices"][0]
    assert out["message"]["content"].startswith("{")
    spec = grammar_compiler(server.state).json_object()
    tok = server.engine.tokenizer
    ids = tok.encode(out["message"]["content"], add_special_tokens=False)
    matcher = llguidance.LLMatcher(spec.tokenizer, spec.grammar)
    if out["finish_reason"] == "stop":
        assert isinstance(json.loads(out["message"]["content"]), dict)
    else:
        assert matcher.validate_tokens(ids) == len(ids)  # every token the grammar allowed


@pytest.mark.parametrize("seed", [0])
def test_named_tool_choice_is_enforced(server, seed):
    r = post(server, "/v1/chat/completions", {"messages": USER, "tools": TOOLS, "max_tokens": 80, "seed": seed,
                                              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather" and args["unit"] in ("c", "f") and 1 <= args["days"] <= 7


def test_required_tool_choice_calls_a_tool(server):
    r = post(server, "/v1/chat/completions", {"messages": USER, "tools": TOOLS[:1], "max_tokens": 200, "seed": 4,
                                              "tool_choice": "required"})
    choice = r.json()["choices"][0]
    assert choice["message"]["tool_calls"], choice
    for call in choice["message"]["tool_calls"]:
        assert call["function"]["name"] == "get_weather"


def test_logit_bias_moves_the_greedy_token(server):
    body = {"prompt": [5, 6, 7], "max_tokens": 1, "temperature": 0, "logprobs": 1}
    first = post(server, "/v1/completions", body).json()["choices"][0]["text"]
    tok = server.engine.tokenizer
    top = tok.encode(first, add_special_tokens=False)[0]
    moved = post(server, "/v1/completions", {**body, "logit_bias": {str(top): -100}}).json()["choices"][0]["text"]
    assert moved != first
    forced = post(server, "/v1/completions", {**body, "max_tokens": 4, "ignore_eos": True,
                                              "logit_bias": {"77": 100}}).json()["choices"][0]["text"]
    assert tok.encode(forced, add_special_tokens=False) == [77] * 4


@pytest.mark.parametrize("schema,needle", [
    ({"type": "objectx"}, "objectx"),
    ({"type": "string", "pattern": "(("}, "unclosed group"),
])
def test_schema_the_library_rejects_is_a_400(server, schema, needle):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = post(server, "/v1/chat/completions", {"messages": USER, "response_format": fmt})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "response_format.json_schema.schema" and needle in err["message"]


def test_logits_processor_bias_and_mask_in_one_batch():
    class Spec:  # a fake constraint: allows tokens 3 and 40 only
        tokenizer = type("T", (), {"vocab_size": 64})()

    class Allow:
        def fill(self, bitmask, row):
            bitmask[row, 0] = 1 << 3
            bitmask[row, 1] = 1 << (40 - 32)
            return True

    plain = Sequence("a", 0, [1], SamplingParams(logit_bias={2: 5.0, 9: -1.5}), 4, frozenset({0}))
    con = Sequence("b", 0, [1], SamplingParams(structured_outputs=Spec()), 4, frozenset({0}))
    con.constraint = Allow()
    logits = torch.zeros(2, 50)
    out = apply_logits_processors(logits.clone(), [plain, con])
    expect0 = torch.zeros(50)
    expect0[2], expect0[9] = 5.0, -1.5
    assert torch.equal(out[0], expect0)
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [3, 40]
    bits = torch.tensor([[-1, 0]], dtype=torch.int32)  # -1: all 32 bits set
    assert unpack_bitmask(bits, 40)[0].tolist() == [True] * 32 + [False] * 8


def test_parallel_tool_calls_false_makes_one_call():
    from tpserve.server.structured import tool_call_grammar

    one = tool_call_grammar(TOOLS, several=False)
    several = tool_call_grammar(TOOLS, several=True)
    assert one.splitlines()[0] == "start: (call_0 | call_1)"
    assert several.splitlines()[0] == 'start: (call_0 | call_1) ("\\n"? (call_0 | call_1))*'
    assert '"days" </arg_key>' in one and "%json" in one and '("c" | "f")' in one


STRICT = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
CALL = ("<tool_call>get_weather<arg_key>unit</arg_key><arg_value>c</arg_value><arg_key>days</arg_key>"
        "<arg_value>3</arg_value></tool_call>")


def strict_run(compiler, text: str, mode: str) -> str:
    """How the auto tool_choice grammar of STRICT (reasoning `mode`) takes `text`: "whole", "prefix" (every token,
    not an end; a call cut off) or "refused"."""
    import llguidance

    from tpserve.server.structured import strict_tools_grammar, tag_token_ids, think_token_ids

    gc, tok = compiler
    grammar = strict_tools_grammar(STRICT, several=True, tokens=tag_token_ids(tok), mode=mode,
                                   think_ids=think_token_ids(tok))
    matcher = llguidance.LLMatcher(gc.tokenizer, gc.lark(grammar, "strict_tools").grammar)
    ids = tok.encode(text, add_special_tokens=False)
    if matcher.validate_tokens(ids) < len(ids):
        return "refused"
    return "whole" if matcher.consume_tokens(ids) and matcher.is_accepting() else "prefix"


@pytest.mark.parametrize("mode,want", [
    ("off", {"text": "whole", "call": "whole", "closes": "refused", "opens": "refused"}),
    ("open", {"text": "whole", "call": "refused", "closes": "whole", "opens": "refused"}),
    ("auto", {"text": "whole", "call": "whole", "closes": "refused", "opens": "whole"}),
])
def test_strict_tools_take_any_text_then_only_valid_calls(compiler, mode, want):
    """tool_choice "auto" with a strict tool: reasoning as the prompt left it (off; open, and closed before any
    answer; auto, the output may open it), free text, then calls that name a declared tool, the strict tool's
    arguments by its schema, another tool's any."""
    got = {"text": strict_run(compiler, "It is sunny.", mode),
           "call": strict_run(compiler, "Let me see." + CALL, mode),
           "closes": strict_run(compiler, "hmm</think>ok" + CALL, mode),
           "opens": strict_run(compiler, "<think>hmm</think>ok" + CALL, mode)}
    assert got == want
    answer = "" if mode != "open" else "hmm</think>"
    for bad in ("<tool_call>get_wether</tool_call>", "<tool_call>get_weather<arg_key>town</arg_key>",
                "<tool_call>get_weather<arg_key>unit</arg_key><arg_value>k</arg_value>"):
        assert strict_run(compiler, answer + bad, mode) == "refused", bad
    assert strict_run(compiler, answer + "<tool_call>noop<arg_key>x</arg_key><arg_value>y</arg_value></tool_call>",
                      mode) == "whole"


def test_strict_tools_need_the_call_tags_as_special_tokens():
    """With text tags free text could write a call the grammar never checked: no constraint then (as no strict)."""
    from types import SimpleNamespace

    from tpserve.server.parsers import resolve_tool_choice
    from tpserve.server.reasoning import ReasoningMode
    from tpserve.server.structured import strict_tools_constraint

    state = SimpleNamespace(tokenizer=SimpleNamespace(get_added_vocab=lambda: {}))
    req = SimpleNamespace(parallel_tool_calls=None)
    assert strict_tools_constraint(state, req, resolve_tool_choice(STRICT, "auto"), ReasoningMode.OFF) is None


@pytest.mark.parametrize("thinking", [False, True])
def test_strict_tool_calls_through_the_server_are_valid(server, thinking):
    """A random model pushed to call (logit_bias on the call tag, and on the end of reasoning when thinking is on)
    calls once, validly, as the strict grammar holds it."""
    tok = server.engine.tokenizer
    bias = {str(tok.convert_tokens_to_ids(t)): 100 for t in ("<tool_call>", "</think>")}
    r = post(server, "/v1/chat/completions", {"messages": USER, "tools": STRICT[:1], "max_tokens": 60, "seed": 5,
                                              "logit_bias": bias, "parallel_tool_calls": False,
                                              "chat_template_kwargs": {"enable_thinking": thinking}})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather" and set(args) == {"unit", "days"}  # (both required)
    assert args["unit"] in ("c", "f") and 1 <= args["days"] <= 7


def test_a_strict_tool_whose_schema_cannot_be_held_is_a_400(server):
    bad = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}
    r = post(server, "/v1/chat/completions", {"messages": USER, "tools": [bad], "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    r = post(server, "/v1/chat/completions", {"messages": USER, "tools": [{"type": "function", "function": {
        **bad["function"], "strict": False}}], "max_tokens": 4})
    assert r.status_code == 200, r.text  # not strict: not held, as before


@pytest.fixture(scope="module")
def compiler(tiny):
    from transformers import AutoTokenizer

    from tpserve.engine.logits_process import GrammarCompiler

    tok = AutoTokenizer.from_pretrained(str(tiny("default")))
    return GrammarCompiler(tok, len(tok), [tok.eos_token_id or 0]), tok


def accepts(compiler, schema, text) -> bool:
    """Does the grammar of `schema` (closed as the server closes it) take `text` as a whole JSON value?"""
    import llguidance

    from tpserve.server.structured import close_objects

    gc, tok = compiler
    spec = gc.json_schema(close_objects(schema))
    matcher = llguidance.LLMatcher(spec.tokenizer, spec.grammar)
    ids = tok.encode(text, add_special_tokens=False)
    return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


NESTED = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "object", "properties": {
    "c": {"type": "string"}}}}, "required": ["a"]}


def test_objects_close_unless_the_schema_opens_them(compiler):
    assert accepts(compiler, NESTED, '{"a":1}') and accepts(compiler, NESTED, '{"a":1,"b":{"c":"q"}}')
    assert not accepts(compiler, NESTED, '{"a":1,"x":2}')  # no additionalProperties: closed, as vLLM does
    assert not accepts(compiler, NESTED, '{"a":1,"b":{"c":"q","z":1}}')  # nested objects too
    opened = {**NESTED, "additionalProperties": True}
    assert accepts(compiler, opened, '{"a":1,"x":2}') and not accepts(compiler, opened, '{"a":1,"b":{"z":1}}')
    typed = {**NESTED, "additionalProperties": {"type": "integer"}}
    assert accepts(compiler, typed, '{"a":1,"x":2}') and not accepts(compiler, typed, '{"a":1,"x":"s"}')
    assert accepts(compiler, {"type": "object"}, '{"x":2}')  # json_object: any object


def test_close_objects_walks_subschemas_not_names():
    from tpserve.server.structured import close_objects

    item = {"type": "object", "properties": {"k": {"type": "integer"}}}
    schema = {"type": "object", "properties": {"properties": {"type": "string"}, "list": {"type": "array",
              "items": item}}, "$defs": {"D": item}, "anyOf": [item], "allOf": [item]}
    out = close_objects(schema)
    assert out["additionalProperties"] is False and "additionalProperties" not in out["properties"]
    assert out["properties"]["list"]["items"]["additionalProperties"] is False
    assert out["$defs"]["D"]["additionalProperties"] is False
    # alternatives of an object that lists keys, and allOf members, combine with it: left open
    assert "additionalProperties" not in out["anyOf"][0] and "additionalProperties" not in out["allOf"][0]
    assert close_objects({"anyOf": [item, {"type": "null"}]})["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in item  # the request's schema is not changed


@pytest.mark.parametrize("so,check", [
    ({"regex": "[0-9]{3}"}, lambda t: len(t) == 3 and t.isdigit()),
    ({"choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
    ({"json": json.dumps({k: v for k, v in SCHEMA.items() if k != "additionalProperties"})},
     lambda t: check_schema(json.loads(t)) is None),
    ({"grammar": 'start: "a" ("b" | "c")'}, lambda t: t in ("ab", "ac")),
    ({"grammar": 'root ::= "x" [0-9]'}, lambda t: len(t) == 2 and t[0] == "x" and t[1].isdigit()),  # GBNF
])
def test_structured_outputs(server, so, check):
    for path, body in (("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": USER})):
        r = post(server, path, {**body, "structured_outputs": so, "max_tokens": 120, "seed": 2})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        assert choice["finish_reason"] == "stop" and check(text), choice


def test_bad_structured_outputs_are_400(server):
    for so, param in (({"regex": "(("}, "structured_outputs.regex"),
                      ({"grammar": "start: ("}, "structured_outputs.grammar"),
                      ({"json": {"type": "objectx"}}, "structured_outputs.json")):
        r = post(server, "/v1/completions", {"prompt": "x", "structured_outputs": so})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_min_tokens_gives_way_to_a_finished_grammar(server):
    """min_tokens holds back a stop while the grammar still allows other tokens; once it allows only the end,
    the output ends there (no banned-everything row sampled into junk)."""
    r = post(server, "/v1/completions", {"prompt": "x", "structured_outputs": {"choice": ["yes", "no"]},
                                         "min_tokens": 4, "max_tokens": 16, "seed": 3})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] in ("yes", "no") and choice["finish_reason"] == "stop", choice
