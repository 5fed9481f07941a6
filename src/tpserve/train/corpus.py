"""The demo corpus, generated deterministically from a seed.

Documents: counting (to 1,000, in steps; chats and raw "Count from a to b, ...: a, a+1, ..."
continuations), lists and arithmetic with answers, one-word answers when asked for one, GSM8K-style
word problems ("Question: ... Answer: ... #### N"), JSON objects, repeating words back, GLM-format
tool calls for tools given in the system prompt (requests that name the tool; requests in plain
words that leave the choice to the tools' names and descriptions, plain_tools.py; multi-turn file
tasks, file_agent.py), rendered with our chat template with tool results and a final answer, all
chats with and without reasoning blocks, and plain text from the Python standard library's own
source files (docstrings and code, shipped with every Python).

Tool and argument names come from a word list; `is_held_out(word)` splits it so the acceptance
check can use tools whose names never occur in training. Most training tools take made-up names
(`pseudo_word`) or the standard library's identifiers (`stdlib_identifiers`, none containing a
held-out word), which cannot be guessed: the model has to copy names from the prompt.
"""

from __future__ import annotations

import json
import random

from tpserve.train.answers import arithmetic, one_word
from tpserve.train.chatdoc import EOT, chat_doc, is_held_out, pseudo_word, render_chat, split_words
from tpserve.train.file_agent import EXTS, FOLDERS, file_agent_chat
from tpserve.train.plain_tools import plain_tool_chat
from tpserve.train.stdlib_text import held_in_doc_words, stdlib_identifiers, stdlib_texts, stdlib_words
from tpserve.train.words import ADJECTIVES, ANIMALS, CITIES, FOODS, NAMES, NOUNS, OBJECTS, VERBS

PLURALS = tuple(a.lower() for a in ANIMALS)

__all__ = ["EOT", "is_held_out", "render_chat", "stdlib_identifiers", "stdlib_words", "documents", "MIXTURE"]


# ------------------------------------------------------------------------------- counting
ROUND_STOPS = (10, 20, 25, 30, 40, 50, 60, 75, 80, 100, 120, 150, 200, 250, 300)
RAW_COUNTS = ("Count from {a} to {b}, separated by commas: ", "Counting from {a} to {b}{s}: ",
              "The numbers from {a} to {b}{s}: ", "Count from {a} to {b}{s}: ", "Numbers {a} to {b}, comma-separated: ",
              "List the numbers from {a} to {b}{s}, separated by commas: ")
RAW_SHARE = 0.4  # counts written as raw text (completions), the rest as chats


def counting(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.45:
        start, step = 1, 1
        # Round targets are what people ask for, and a long count runs through 100 and 200 far more
        # often than it stops there: the model must see it stop at them too.
        stop = rng.choice([rng.randint(2, 60), rng.randint(60, 260), rng.randint(100, 320), rng.choice(ROUND_STOPS)])
    elif r < 0.75:
        step = rng.choice([2, 3, 5, 10, 25, 50, 100])
        start = rng.choice([0, step, rng.randint(0, 100)])
        stop = min(1000, start + step * rng.randint(3, 120))
    else:
        step = 1
        start = rng.randint(0, 980)
        stop = min(1000, start + rng.randint(5, 150))
    nums = ", ".join(str(n) for n in range(start, stop + 1, step))
    steps = f" in steps of {step}" if step > 1 else ""
    if rng.random() < RAW_SHARE:
        # a raw prompt ("Count from 1 to 200, separated by commas: 1, 2, 3,") is continued to its end
        head = rng.choice(RAW_COUNTS if step == 1 else [h for h in RAW_COUNTS if "{s}" in h])
        return head.format(a=start, b=stop, s=steps) + nums + rng.choice([".\n", "\n", ""]) + EOT
    asks = ["Count from {a} to {b}.", "Please count from {a} to {b}.", "Count from {a} to {b}, please.",
            "List the numbers from {a} to {b}.", "List the numbers from {a} to {b}, separated by commas.",
            "Write the numbers from {a} to {b}, comma-separated."]
    ask = rng.choice(asks if step == 1 else asks[:4])
    if step > 1:
        ask = ask.rstrip(".,please ") + f" in steps of {step}."
    user = ask.format(a=start, b=stop)
    return chat_doc(rng, user, nums, f"The user wants the numbers from {start} to {stop}{steps}.")


# ------------------------------------------------------------------------------- word problems
def word_problem(rng: random.Random) -> str:
    """One to three GSM8K-style problems with worked answers ending in '#### N'."""
    parts = []
    for _ in range(rng.randint(1, 3)):
        name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
        a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 9)
        form = rng.randrange(4)
        if form == 0:
            q = f"{name} has {a} {obj}. {name} buys {b} more. How many {obj} does {name} have now?"
            ans = f"{name} has {a} + {b} = {a + b} {obj}.\n#### {a + b}"
        elif form == 1:
            a = a + b
            q = f"{name} had {a} {obj} and gave away {b}. How many {obj} are left?"
            ans = f"{name} has {a} - {b} = {a - b} {obj} left.\n#### {a - b}"
        elif form == 2:
            q = f"A box holds {c} {obj}. How many {obj} are in {b} boxes?"
            ans = f"There are {b} * {c} = {b * c} {obj}.\n#### {b * c}"
        else:
            q = (f"{name} buys {b} {obj} at ${c} each and pays with a ${b * c + a} bill. "
                 f"How much change does {name} get?")
            ans = f"The {obj} cost {b} * {c} = ${b * c}. The change is {b * c + a} - {b * c} = ${a}.\n#### {a}"
        parts.append(f"Question: {q}\nAnswer: {ans}")
    return "\n\n".join(parts) + "\n" + EOT


# ------------------------------------------------------------------------------- JSON
def _json_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if r < 0.3:
        return rng.choice(NOUNS + CITIES)
    if r < 0.55:
        return rng.randint(0, 1000)
    if r < 0.65:
        return round(rng.uniform(0, 100), 2)
    if r < 0.75:
        return rng.random() < 0.5
    if r < 0.88 or depth > 1:
        return [rng.randint(0, 99) for _ in range(rng.randint(0, 4))]
    return {rng.choice(NOUNS): _json_value(rng, depth + 1) for _ in range(rng.randint(1, 3))}


def json_doc(rng: random.Random) -> str:
    obj = {rng.choice(NOUNS): _json_value(rng) for _ in range(rng.randint(1, 5))}
    text = json.dumps(obj, indent=rng.choice([None, 2]))
    if rng.random() < 0.3:
        return text + "\n" + EOT
    name, age, city = rng.choice(NAMES), rng.randint(1, 99), rng.choice(CITIES)
    if rng.random() < 0.5:
        user = f"Write a JSON object with name {name}, age {age} and city {city}."
        return chat_doc(rng, user, json.dumps({"name": name, "age": age, "city": city}),
                        "Three keys: name, age and city.")
    keys = ", ".join(f"{k} = {json.dumps(v)}" for k, v in obj.items())
    return chat_doc(rng, f"Make a JSON object where {keys}.", json.dumps(obj), "One key per assignment.")


# ------------------------------------------------------------------------------- tool calls
PSEUDO_NAMES = 0.25      # share of training tools (and their arguments) named with made-up words
IDENTIFIER_NAMES = 0.25  # share named with the standard library's snake_case identifiers
DOC_WORD_NAMES = 0.25    # share named with words of the standard library's docstrings (none held out)


def make_tool(rng: random.Random, held_out: bool, style: float | None = None) -> dict:
    """A random tool: name verb_noun, 1-4 typed arguments (string, integer, number, boolean, enum).

    Training tools (held_out=False) take made-up names, standard-library identifiers or docstring
    words three times in four (the held-out path draws from the word lists only, so the acceptance
    prompts stay fixed). style: the naming style's draw, given instead of drawn (probes of one style: below
    PSEUDO_NAMES made-up words, then identifiers, then docstring words, then the word lists)."""
    if style is None:
        style = rng.random() if not held_out else 1.0
    idents = stdlib_identifiers() if PSEUDO_NAMES <= style < PSEUDO_NAMES + IDENTIFIER_NAMES else ()
    doc_words = held_in_doc_words() if 0 <= style - PSEUDO_NAMES - IDENTIFIER_NAMES < DOC_WORD_NAMES else ()

    def pick(words):
        if style < PSEUDO_NAMES and rng.random() < 0.7:
            return pseudo_word(rng)
        if idents and rng.random() < 0.5:
            return rng.choice(idents).split("_")[0]
        if doc_words and rng.random() < 0.8:
            return rng.choice(doc_words)
        return rng.choice(split_words(words, held_out))

    name = rng.choice(idents) if idents and rng.random() < 0.6 else f"{pick(VERBS)}_{pick(NOUNS)}"
    props, required = {}, []
    for _ in range(rng.randint(1, 4)):
        arg = pick(NOUNS) if rng.random() < 0.6 else f"{pick(ADJECTIVES)}_{pick(NOUNS)}"
        if arg in props:
            continue
        kind = rng.choice(["string", "string", "integer", "number", "boolean", "enum"])
        if kind == "enum":
            spec = {"type": "string", "enum": sorted({pick(ADJECTIVES) for _ in range(rng.randint(2, 4))})}
        else:
            spec = {"type": kind}
        if rng.random() < 0.5:
            spec["description"] = f"The {arg.replace('_', ' ')}."
        props[arg] = spec
        required.append(arg)
    desc = f"{name.split('_')[0].capitalize()} the {name.split('_', 1)[1].replace('_', ' ')}."
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": required}}}


def tool_arguments(rng: random.Random, tool: dict) -> dict:
    out = {}
    for arg, spec in tool["function"]["parameters"]["properties"].items():
        if "enum" in spec:
            out[arg] = rng.choice(spec["enum"])
        elif spec["type"] == "string":
            out[arg] = rng.choice(CITIES + NAMES + NOUNS)
        elif spec["type"] == "integer":
            out[arg] = rng.randint(0, 500)
        elif spec["type"] == "number":
            out[arg] = round(rng.uniform(0, 100), 1)
        else:
            out[arg] = rng.random() < 0.5
    return out


def tool_request(rng: random.Random, name: str, args: dict) -> str:
    """The user's request, naming the tool and every argument value."""
    def show(v):
        return json.dumps(v) if not isinstance(v, str) else v
    pairs = [f"{k} {show(v)}" if rng.random() < 0.5 else f"{k} = {show(v)}" for k, v in args.items()]
    listed = ", ".join(pairs[:-1]) + (" and " if len(pairs) > 1 else "") + pairs[-1]
    form = rng.choice(["Call {n} with {a}.", "Please use {n} with {a}.", "Use the {n} tool: {a}.",
                       "Run {n} for {a}.", "I need {n} with {a}."])
    return form.format(n=name, a=listed)


def tool_chat(rng: random.Random, held_out: bool = False) -> str:
    tools = [make_tool(rng, held_out) for _ in range(rng.randint(1, 3))]
    tool = rng.choice(tools)
    name = tool["function"]["name"]
    args = tool_arguments(rng, tool)
    user = tool_request(rng, name, args)
    thinking = rng.random() < 0.5
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}]}
    if thinking:
        call["reasoning_content"] = f"The user wants {name}. I will call it with the given arguments."
    messages = [{"role": "user", "content": user}, call]
    if rng.random() < 0.3:  # the conversation stops at the call (the model must end its turn there)
        return render_chat(messages, tools, thinking=thinking) + "<|observation|>"
    result = {"status": "ok", "result": rng.choice([rng.randint(0, 999), rng.choice(CITIES + NOUNS)])}
    messages.append({"role": "tool", "content": json.dumps(result)})
    final = {"role": "assistant", "content": f"{name} returned {json.dumps(result['result'])}."}
    if thinking:
        final["reasoning_content"] = "The tool answered; I report its result."
    messages.append(final)
    return render_chat(messages, tools, thinking=thinking) + EOT


def copy_chat(rng: random.Random) -> str:
    """Repeat a list of words: made-up ones, standard-library identifiers, every word of the word
    lists (verbs and adjectives too, held-out ones included: this is copying, not naming a tool),
    words of the standard library's docstrings and file paths. The plainest copying exercise, over
    as many different tokens as the corpus has: a model copies into tool calls mostly the words it
    has copied somewhere in training."""
    idents, words = stdlib_identifiers(), stdlib_words()

    def word():
        r = rng.random()
        if r < 0.1:  # a path, as file tools return them
            stem = pseudo_word(rng) if rng.random() < 0.3 else rng.choice(NOUNS + FOODS + PLURALS)
            return rng.choice(FOLDERS) + stem + rng.choice(EXTS)
        if r < 0.25:
            return pseudo_word(rng)
        if r < 0.45 and idents:
            return rng.choice(idents)
        if r < 0.75 or not words:
            return rng.choice(VERBS + NOUNS + ADJECTIVES + CITIES + NAMES)
        return rng.choice(words)

    picked = [word() for _ in range(rng.randint(2, 12))]
    sep = rng.choice([" ", ", ", "_", "\n"])
    text = sep.join(picked)
    user = rng.choice(["Repeat: {t}", "Say this back: {t}", "Copy the words: {t}", "Echo {t}"]).format(t=text)
    return chat_doc(rng, user, text, "Repeat the words exactly.")


# ------------------------------------------------------------------------------- plain text
def plain_text(rng: random.Random) -> str:
    texts = stdlib_texts()
    return rng.choice(texts) + "\n" + EOT if texts else json_doc(rng)


# Shares of documents (they sum to 1). Tool chats are long (the tools' JSON), one-word answers short:
# the shares keep about 320 tokens a document (38.5M tokens in the 120,000 documents the demo model trains on).
MIXTURE = ((counting, 0.15), (arithmetic, 0.09), (one_word, 0.07), (word_problem, 0.05), (json_doc, 0.08),
           (tool_chat, 0.10), (plain_tool_chat, 0.22), (file_agent_chat, 0.09), (copy_chat, 0.08), (plain_text, 0.07))


def documents(n: int, seed: int) -> list[str]:
    """n documents drawn from MIXTURE with random.Random(seed)."""
    rng = random.Random(seed)
    fns, weights = zip(*MIXTURE)
    return [rng.choices(fns, weights)[0](rng) for _ in range(n)]
