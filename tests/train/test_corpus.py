"""The generated corpus: its document families render through the chat template, their tool calls
parse with the server's parser and carry the request's values, file tasks agree with real file
tools, the held-out words stay out of training tools, and the corpus is the same for a seed."""

from __future__ import annotations

import json
import random
import re

import pytest

from tpserve.server.tool_calls import parse_tool_calls
from tpserve.train import answers, corpus, file_agent, plain_tools, topics
from tpserve.train.chatdoc import EOT, held_out_vocabulary, is_held_out, pseudo_word, words_of
from tpserve.tools.served_checks import schema_errors


def _declared(doc: str) -> list[dict]:
    m = re.search(r"<tools>\n(.*?)</tools>", doc, re.S)
    return [json.loads(line) for line in m.group(1).splitlines()] if m else []


def _turns(doc: str) -> list[tuple[str, str]]:
    """(last user message, assistant text after its reasoning) for every assistant turn."""
    out, user, role = [], "", ""
    for piece in re.split(r"(<\|user\|>|<\|assistant\|>|<\|observation\|>|<\|system\|>|<\|endoftext\|>)", doc):
        if piece.startswith("<|"):
            role = piece
            continue
        if role == "<|user|>":
            user = piece
        elif role == "<|assistant|>":
            out.append((user, piece.split("</think>", 1)[-1]))
    return out


def _calls(doc: str) -> list[tuple[str, dict, list[dict]]]:
    """(user message, parsed call, declared tools) for every call of the document, parsed as the server does."""
    tools, out = _declared(doc), []
    for user, text in _turns(doc):
        content, calls = parse_tool_calls(text, tools)
        assert "<tool_call>" not in content, text  # every call block parsed
        out += [(user, c, tools) for c in calls]
    return out


def _values(obj) -> list[str]:
    return [str(v) for v in obj.values()]


@pytest.mark.parametrize("family", [plain_tools.plain_tool_chat, file_agent.file_agent_chat])
def test_tool_families_render_and_parse(family):
    """Chat-template documents whose calls our parser accepts, each to a declared tool with
    arguments valid for its schema; a document ends at its end of text or at a call's observation."""
    rng = random.Random(3)
    n_calls = 0
    for _ in range(150):
        doc = family(rng)
        assert doc.startswith("[gMASK]<sop>") and (doc.endswith(EOT) or doc.endswith("<|observation|>"))
        assert doc.count("<tool_call>") == doc.count("</tool_call>")
        for _, call, tools in _calls(doc):
            schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
            name = call["function"]["name"]
            assert name in schemas
            assert not schema_errors(json.loads(call["function"]["arguments"]), schemas[name])
            n_calls += 1
    assert n_calls > 150


def test_plain_requests_carry_every_argument():
    """Every argument value of a call is written in the request; some requests get no call (no
    declared tool fits them)."""
    rng = random.Random(5)
    direct = calls = 0
    for _ in range(300):
        doc = plain_tools.plain_tool_chat(rng)
        for user, call, _ in _calls(doc):
            for v in _values(json.loads(call["function"]["arguments"])):
                assert v in user, (v, user)
            calls += 1
        turns = _turns(doc)
        # an answer with no call right after the user's message: no tool was needed
        direct += sum("<tool_call>" not in text and user != prev for (prev, _), (user, text) in zip(
            [("", "")] + turns, turns))
    assert calls > 300 and direct > 30


def test_acceptance_cases_use_held_out_topics_and_their_arguments():
    cases = plain_tools.plain_tool_cases(30, 1)
    assert len(cases) == 30 and len({c["user"] for c in cases}) == 30
    for case in cases:
        want = case["want"]
        tool = next(t for t in case["tools"] if t["function"]["name"] == want["name"])
        assert is_held_out(want["key"])
        assert not schema_errors(want["arguments"], tool["function"]["parameters"])
        assert all(v in case["user"] for v in _values(want["arguments"]))
        assert want["name"] not in case["user"]
    assert plain_tools.plain_tool_cases(30, 1) == cases


def test_training_tools_take_names_and_neighbours_the_acceptance_tools_never_do():
    """In training, plain-words tools often take argument names from outside their topic's own, and
    some toolboxes hold only tools that take the same kinds of values; the acceptance prompts, drawn
    on their own path, are the same as before either existed."""
    import hashlib

    from tpserve.tools.served_checks import PLAIN_SEED

    rng = random.Random(4)
    renamed = similar = boxes = 0
    for _ in range(400):
        box = plain_tools.toolbox(rng, False, 3)
        for t in box:
            own = {a for _, args, _ in t["topic"].params for a in args}
            renamed += not set(t["labels"].values()) <= own
        boxes += 1
        similar += len({plain_tools._slots(t["topic"]) for t in box}) == 1
    assert 0.25 < renamed / (3 * boxes) < 0.55 and similar / boxes > 0.1  # 0.25% where boxes are drawn freely
    cases = json.dumps(plain_tools.plain_tool_cases(30, PLAIN_SEED), sort_keys=True)
    assert hashlib.sha256(cases.encode()).hexdigest()[:16] == "417d1a2325ac79b4"


def _training_tools(n: int = 400) -> list[dict]:
    rng = random.Random(11)
    docs = [f(rng) for _ in range(n) for f in (plain_tools.plain_tool_chat, file_agent.file_agent_chat,
                                                 corpus.tool_chat)]
    return [t["function"] for d in docs for t in _declared(d)]


def test_held_out_words_never_name_or_describe_a_training_tool():
    """Neither the word lists' held-out words nor the held-out topics' keys occur in a training
    tool's name, argument names or description; the acceptance tools use them."""
    held_keys = tuple(t.key for t in topics.TOPICS if is_held_out(t.key))
    assert len(held_keys) >= 6 and {"route", "taxi"} <= set(held_keys)
    held = held_out_vocabulary(held_keys)
    rng = random.Random(0)
    assert not any(is_held_out(pseudo_word(rng)) for _ in range(5000))  # syllables can spell "token"
    for fn in _training_tools():
        text = " ".join([fn["name"], fn.get("description", ""), *fn["parameters"]["properties"]])
        assert not words_of(text) & held, fn
    used = set()
    for case in plain_tools.plain_tool_cases(30, 2):
        for tool in case["tools"]:
            used |= words_of(tool["function"]["name"] + " " + tool["function"].get("description", "")) & held
    assert len(used) >= 10


def test_one_word_answers():
    """One word: the word asked for, or the answer of a question asked for in one word (sums checked)."""
    rng = random.Random(2)
    forms = [re.compile(re.escape(f).replace(r"\{q\}", "(.+)")) for f in answers.ONE_WORD]
    echoes = sums = 0
    for _ in range(400):
        user, answer, _ = answers.one_word_qa(rng)
        word = answer.rstrip(".")
        assert len(answer.split()) == 1 and word
        if user in {a.format(w=answer) for a in answers.ECHO_ASKS}:
            echoes += 1
            continue
        q = next(m.group(1) for f in forms if (m := f.fullmatch(user)))
        if m := re.fullmatch(r"What is (\d+) \+ (\d+)\?", q):
            assert int(word) == int(m.group(1)) + int(m.group(2))
            sums += 1
    assert echoes > 100 and sums > 10
    doc = answers.one_word(random.Random(0))
    assert doc.startswith("[gMASK]<sop>") and doc.endswith(EOT) and "<|assistant|>" in doc


def test_raw_counts_continue_to_their_target():
    """Raw counting documents ("Count from 1 to 200, separated by commas: 1, 2, ...") run from
    start to stop with no chat tokens; some stop at 200."""
    rng = random.Random(0)
    raw = stops_200 = 0
    for _ in range(1500):
        doc = corpus.counting(rng)
        if doc.startswith("[gMASK]"):
            continue
        raw += 1
        m = re.match(r"\D*?(\d+) to (\d+)(?: in steps of (\d+))?[^:]*: ([\d, ]+)", doc)
        start, stop, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
        assert [int(x) for x in m.group(4).split(", ")] == list(range(start, stop + 1, step))
        assert doc.endswith(EOT) and "<|" not in doc[:-len(EOT)]
        stops_200 += start == 1 and stop == 200 and "separated by commas" in doc
    assert 0.3 < raw / 1500 < 0.5 and stops_200 >= 1


def test_file_tasks_agree_with_real_file_tools(tmp_path):
    """Replaying each task's calls on agent-tools' workspace gives the results the document shows and
    leaves the files the task says; count answers are right."""
    from tpserve.tools.agent_tools import Workspace

    real = {"list": "list_files", "read": "read_file", "find": "search", "write": "write_file", "edit": "edit_file"}
    rng = random.Random(8)
    kinds = set()
    for i in range(80):
        files = file_agent.workspace(rng)
        tools = {op: file_agent._tool(rng, op) for op in real}
        ask, steps, _, answer, after = file_agent.task(rng, files, tools)
        root = tmp_path / str(i)
        ws = Workspace(root)
        for f in [f for f in root.rglob("*") if f.is_file()]:
            f.unlink()
        for path, text in files.items():  # the workspace as the task found it
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        for _, call, result in steps:
            fn = call["function"]
            op = next(op for op, t in tools.items() if t["tool"]["function"]["name"] == fn["name"])
            back = {arg: label for label, arg in tools[op]["labels"].items()}
            assert ws.call(real[op], {back[k]: v for k, v in fn["arguments"].items()}) == result, (ask, op)
            kinds.add(op)
        assert {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()} == after
        if ask.startswith(("How many", "Count the")):
            ext = re.search(r"\.\w+", ask).group()
            assert int(re.search(r"\d+", answer).group()) == sum(p.endswith(ext) for p in files)
    assert kinds == set(real)


def test_corpus_is_deterministic_and_the_mixture_sums_to_one():
    assert abs(sum(w for _, w in corpus.MIXTURE) - 1) < 1e-9
    names = {f.__name__ for f, _ in corpus.MIXTURE}
    assert {"plain_tool_chat", "file_agent_chat", "one_word", "counting", "tool_chat"} <= names
    a = corpus.documents(120, 7)
    assert len(a) == 120 and a == corpus.documents(120, 7) and a != corpus.documents(120, 8)


def test_client_prompts_are_not_in_the_corpus():
    """The prompts of smoke, agent-tools and quality count are the model's test, not its training."""
    from tpserve.tools.agent_tools import TASKS
    from tpserve.tools.quality.compare import COUNT_MESSAGE

    prompts = [p for p, _ in TASKS.values()] + [COUNT_MESSAGE, "Reply with only the word OK and nothing else.",
                                                "What is the weather in Paris right now? Use the tool."]
    docs = corpus.documents(2500, 0)
    for p in prompts:
        assert not any(p in d for d in docs), p
