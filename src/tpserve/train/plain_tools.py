"""Chats that ask for a tool in plain words: several tools are declared, the request never names
one, and the model picks the tool whose name and description fit (topics.py), fills its arguments
from the words of the request, reads the tool's result and answers in a sentence. Some requests
need no tool (arithmetic, a one-word answer): the model answers them directly. In training, some
tools take made-up argument names (copied from the schema, not remembered) and half the toolboxes
prefer tools that take the same kinds of values as their first (told apart only by their words).

`plain_tool_cases` builds the acceptance check's prompts from the held-out topics and nouns, with
tool names of the held-out styles (made-up words, or a held-out topic's name with a made-up suffix).
"""

from __future__ import annotations

import json
import random
import re

from tpserve.train import answers, topics
from tpserve.train.chatdoc import EOT, pseudo_word, render_chat, split_words
from tpserve.train.stdlib_text import stdlib_identifiers
from tpserve.train.words import NOUNS

SUFFIXES = ("", "", "", "", " Use the tool.", " Use the tools.", " Please use a tool.", " Check with your tools.")
SYSTEMS = ("You are a helpful assistant.", "You are a helpful assistant with access to tools.",
           "Answer briefly. Use a tool when one fits the request.", "You are a careful assistant.")
NO_TOOL_SHARE = 0.18  # requests that no declared tool fits (answered directly)
RENAMED_ARGS = 0.4  # training tools whose argument names are made up: copied from the schema, not remembered
SIMILAR_BOX = 0.5  # training toolboxes that prefer tools taking the same kinds of values: words tell them apart


def tool_name(rng: random.Random, topic: topics.Topic, held_out: bool) -> tuple[str, bool]:
    """(name, descriptive): a usual name, a usual name with a made-up suffix (lookup_weather_xq), a
    made-up word, or (training only) a standard-library identifier: these say nothing, so the
    description alone tells what the tool does."""
    r = rng.random()
    if r < 0.3:
        return rng.choice(topic.names), True
    if r < 0.6:
        letters = "".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(2))
        return f"{rng.choice(topic.names)}_{letters if rng.random() < 0.5 else pseudo_word(rng)}", True
    if r < 0.88 or held_out:
        return pseudo_word(rng) + (f"_{pseudo_word(rng)}" if rng.random() < 0.3 else ""), False
    return rng.choice(stdlib_identifiers()), False


def make_tool(rng: random.Random, topic: topics.Topic, held_out: bool) -> dict:
    """An OpenAI tool object for the topic, with `labels` (label -> argument name) kept aside."""
    name, descriptive = tool_name(rng, topic, held_out)
    fn: dict = {"name": name}
    if not descriptive or rng.random() < 0.88:
        fn["description"] = rng.choice(topic.descs) + rng.choice(["", "."])
    labels = {label: rng.choice(args) for label, args, _ in topic.params}
    if not held_out and rng.random() < RENAMED_ARGS:
        labels = dict(zip(labels, _other_args(rng, len(labels))))
    props = {labels[label]: topics.param_schema(slot, labels[label], rng) for label, _, slot in topic.params}
    fn["parameters"] = {"type": "object", "properties": props, "required": list(props)}
    return {"tool": {"type": "function", "function": fn}, "topic": topic, "labels": labels}


def _other_args(rng: random.Random, n: int) -> list[str]:
    """n distinct argument names from outside the topics: made-up words, standard-library
    identifiers, training nouns with a suffix."""
    out: list[str] = []
    while len(out) < n:
        r = rng.random()
        name = pseudo_word(rng) if r < 0.4 else rng.choice(stdlib_identifiers()) if r < 0.7 else \
            rng.choice(split_words(NOUNS, False)) + rng.choice(["", "_name", "_id", "_value"])
        if name not in out:
            out.append(name)
    return out


def _slots(topic: topics.Topic) -> tuple[str, ...]:
    return tuple(slot for _, _, slot in topic.params)


def toolbox(rng: random.Random, held_out: bool, n: int) -> list[dict]:
    """n tools of different topics and names; in training, half the boxes redraw (19 times in 20) a
    topic that takes other kinds of values than the first's: where few topics share them, others fill the box."""
    out, keys, names = [], set(), set()
    similar = not held_out and rng.random() < SIMILAR_BOX
    while len(out) < n:
        topic = topics.draw_topic(rng, held_out)
        if similar and out and _slots(topic) != _slots(out[0]["topic"]) and rng.random() < 0.95:
            continue
        t = make_tool(rng, topic, held_out)
        name = t["tool"]["function"]["name"]
        if topic.key in keys or name in names:
            continue
        keys.add(topic.key)
        names.add(name)
        out.append(t)
    return out


def request(rng: random.Random, t: dict) -> tuple[str, dict, dict]:
    """(user text, call arguments, label -> value): every argument's value is written in the request."""
    values = topics.fill(rng, t["topic"])
    user, suffix = rng.choice(t["topic"].asks).format(**values), rng.choice(SUFFIXES)
    if suffix and user[-1] not in ".?!":
        user += "."
    user += suffix
    return user, {t["labels"][label]: v for label, v in values.items()}, values


def _exchange(rng: random.Random, t: dict, messages: list, thinking: bool, stop_at_call: bool) -> bool:
    """Append one request, its call and (unless stop_at_call) the result and answer."""
    user, args, values = request(rng, t)
    fn = t["tool"]["function"]
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": fn["name"], "arguments": args}}]}
    if thinking:
        what = f"{fn['name']}: {fn['description'].rstrip('.')}" if "description" in fn else \
            f"{fn['name']} is the tool for that"
        shown = ", ".join(f"{k} = {json.dumps(v) if not isinstance(v, str) else v}" for k, v in args.items())
        call["reasoning_content"] = f"The request is about the {t['topic'].key}. {what}. I call it with {shown}."
    messages += [{"role": "user", "content": user}, call]
    if stop_at_call:
        return True
    result = topics.result_of(rng, t["topic"])
    messages.append({"role": "tool", "content": json.dumps(result if rng.random() < 0.6 else {**args, **result})})
    final = {"role": "assistant", "content": t["topic"].reply.format(**values, **result)}
    if thinking:
        final["reasoning_content"] = "The tool answered; I tell the user what it returned."
    messages.append(final)
    return False


def plain_tool_chat(rng: random.Random) -> str:
    """1-4 declared tools, 1-3 requests in plain words (some that no tool fits), thinking or not."""
    tools = toolbox(rng, False, rng.choice([1, 2, 2, 3, 3, 4]))
    thinking = rng.random() < 0.5
    messages = [{"role": "system", "content": rng.choice(SYSTEMS)}] if rng.random() < 0.3 else []
    turns = rng.choice([1, 1, 1, 2, 2, 3])
    for k in range(turns):
        if rng.random() < NO_TOOL_SHARE:
            user, answer, why = answers.direct_qa(rng)
            msg = {"role": "assistant", "content": answer}
            if thinking:
                msg["reasoning_content"] = "No tool is needed for this. " + why
            messages += [{"role": "user", "content": user}, msg]
            continue
        if _exchange(rng, rng.choice(tools), messages, thinking, stop_at_call=k == turns - 1 and rng.random() < 0.25):
            return render_chat(messages, [t["tool"] for t in tools], thinking=thinking) + "<|observation|>"
    return render_chat(messages, [t["tool"] for t in tools], thinking=thinking) + EOT


def plain_tool_cases(n: int, seed: int) -> list[dict]:
    """Held-out prompts that never name the tool: 1-4 tools of held-out topics, one asked for.
    Each case: tools, user, thinking, want (the tool's name, the arguments the request gives, the
    topic's key). A request whose words happen to spell the tool's name is drawn again."""
    rng = random.Random(seed)
    cases = []
    while len(cases) < n:
        box = toolbox(rng, True, rng.choice([1, 2, 3, 3, 4]))
        t = rng.choice(box)
        user, args, _ = request(rng, t)
        name = t["tool"]["function"]["name"]
        if re.search(rf"\b{re.escape(name)}\b", user, re.I):
            continue
        cases.append({"tools": [b["tool"] for b in box], "user": user, "thinking": rng.random() < 0.5,
                      "want": {"name": name, "arguments": args, "key": t["topic"].key}})
    return cases
