"""The demo corpus, generated deterministically from a seed.

Documents: counting (to 1,000, in steps), lists and arithmetic with answers, GSM8K-style word
problems ("Question: ... Answer: ... #### N"), JSON objects, repeating words back, GLM-format tool calls for tools
given in the system prompt (rendered with our chat template, with tool results and a final
answer), all chats with and without reasoning blocks, and plain text from the Python standard
library's own source files (docstrings and code, shipped with every Python).

Tool and argument names come from a word list; `is_held_out(word)` splits it so the acceptance
check can use tools whose names never occur in training. Most training tools take made-up names
(`pseudo_word`) or the standard library's identifiers (`stdlib_identifiers`, none containing a
held-out word), which cannot be guessed: the model has to copy names from the prompt.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
import sysconfig
from functools import lru_cache
from pathlib import Path

from tpserve.train.words import ADJECTIVES, CITIES, NAMES, NOUNS, OBJECTS, VERBS

EOT = "<|endoftext|>"
TEMPLATE_PATH = Path(__file__).resolve().parent.parent / "server" / "glm_chat_template.jinja"


def is_held_out(word: str) -> bool:
    """About one word in six is kept out of training tool names (stable across runs)."""
    return hashlib.sha256(word.encode()).digest()[0] % 6 == 0


@lru_cache(maxsize=16)
def _split(words: tuple[str, ...], held_out: bool) -> tuple[str, ...]:
    return tuple(w for w in words if is_held_out(w) == held_out)


@lru_cache(maxsize=1)
def _template():
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(TEMPLATE_PATH.read_text(encoding="utf-8"))


def render_chat(messages: list[dict], tools: list[dict] | None = None, *, thinking: bool,
                add_generation_prompt: bool = False) -> str:
    """The chat template exactly as the server renders it (transformers' jinja environment)."""
    return _template().render(messages=messages, tools=tools or None, enable_thinking=thinking,
                              add_generation_prompt=add_generation_prompt)


def _chat(rng: random.Random, user: str, answer: str, reasoning: str) -> str:
    thinking = rng.random() < 0.5
    msg = {"role": "assistant", "content": answer}
    if thinking:
        msg["reasoning_content"] = reasoning
    return render_chat([{"role": "user", "content": user}, msg], thinking=thinking) + EOT


# ------------------------------------------------------------------------------- counting
ROUND_STOPS = (10, 20, 25, 30, 40, 50, 60, 75, 80, 100, 120, 150, 200, 250, 300)


def counting(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.45:
        start, step = 1, 1
        # Round targets are what people ask for, and a long count runs through 100 and 200 far more
        # often than it stops there: without them the fourth model counted on past 100 and 200.
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
    if rng.random() < 0.25:
        return f"Counting from {start} to {stop}" + (f" in steps of {step}" if step > 1 else "") + f": {nums}.\n" + EOT
    ask = rng.choice(["Count from {a} to {b}.", "Please count from {a} to {b}.", "Count from {a} to {b}, please.",
                      "List the numbers from {a} to {b}."])
    if step > 1:
        ask = ask.rstrip(".,please ") + f" in steps of {step}."
    user = ask.format(a=start, b=stop)
    reasoning = f"The user wants the numbers from {start} to {stop}" + (f" in steps of {step}" if step > 1 else "") + "."
    return _chat(rng, user, nums, reasoning)


# ------------------------------------------------------------------------------- lists / arithmetic
def arithmetic(rng: random.Random) -> str:
    kind = rng.randrange(7)
    if kind == 0:
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        user, ans, why = f"What is {a} + {b}?", f"{a} + {b} = {a + b}", f"Add {a} and {b}: {a + b}."
    elif kind == 1:
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        a, b = max(a, b), min(a, b)
        user, ans, why = f"What is {a} - {b}?", f"{a} - {b} = {a - b}", f"Subtract {b} from {a}: {a - b}."
    elif kind == 2:
        a, b = rng.randint(0, 40), rng.randint(0, 40)
        user, ans, why = f"What is {a} * {b}?", f"{a} * {b} = {a * b}", f"Multiply {a} by {b}: {a * b}."
    else:
        xs = [rng.randint(0, 99) for _ in range(rng.randint(2, 9))]
        lst = json.dumps(xs)
        if kind == 3:
            user, ans = f"Sort the list {lst}.", json.dumps(sorted(xs))
            why = "Sorted in increasing order."
        elif kind == 4:
            user, ans, why = f"What is the sum of {lst}?", f"The sum is {sum(xs)}.", f"Adding them gives {sum(xs)}."
        elif kind == 5:
            user, ans, why = f"What is the largest number in {lst}?", f"The largest number is {max(xs)}.", \
                f"The maximum is {max(xs)}."
        else:
            user, ans, why = f"Reverse the list {lst}.", json.dumps(xs[::-1]), "Read it from the end."
    return _chat(rng, user, ans, why)


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
        return _chat(rng, user, json.dumps({"name": name, "age": age, "city": city}),
                     "Three keys: name, age and city.")
    keys = ", ".join(f"{k} = {json.dumps(v)}" for k, v in obj.items())
    return _chat(rng, f"Make a JSON object where {keys}.", json.dumps(obj), "One key per assignment.")


# ------------------------------------------------------------------------------- tool calls
SYLLABLES = tuple("ba be bi bo bu da de di do ka ke ki ko ku la le li lo lu ma me mi mo mu na ne ni no nu "
                  "pa pe pi po ra re ri ro ru sa se si so ta te ti to tu va ve vi vo za ze zi zo "
                  "bar ken lor mix nor pel rak sim tor vex zan dul fin gor hap jem wix yat".split())
PSEUDO_NAMES = 0.25      # share of training tools (and their arguments) named with made-up words
IDENTIFIER_NAMES = 0.25  # share named with the standard library's snake_case identifiers
DOC_WORD_NAMES = 0.25    # share named with words of the standard library's docstrings (none held out)


def pseudo_word(rng: random.Random) -> str:
    """A made-up word of 2-3 syllables: names nobody can guess, so the model learns to copy them."""
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))


def _stdlib_modules():
    """(source, AST) of each of the standard library's top-level modules, in sorted order (those
    that do not parse here are skipped)."""
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        yield src, tree


@lru_cache(maxsize=1)
def stdlib_identifiers() -> tuple[str, ...]:
    """snake_case names from the standard library's top-level modules (functions, classes,
    variables, arguments), none with a held-out word as a part: real words and subwords in
    unfamiliar combinations, for tool and argument names."""
    held = {w for w in VERBS + NOUNS + ADJECTIVES if is_held_out(w)}
    names = set()
    for _, tree in _stdlib_modules():
        for node in ast.walk(tree):
            name = getattr(node, "name", None) if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
                node.id if isinstance(node, ast.Name) else node.arg if isinstance(node, ast.arg) else None
            if (name and re.fullmatch(r"[a-z]+(_[a-z]+)+", name) and 6 <= len(name) <= 24
                    and not set(name.split("_")) & held):
                names.add(name)
    return tuple(sorted(names))


def make_tool(rng: random.Random, held_out: bool, style: float | None = None) -> dict:
    """A random tool: name verb_noun, 1-4 typed arguments (string, integer, number, boolean, enum).

    Training tools (held_out=False) take made-up names, standard-library identifiers or docstring
    words three times in four (the held-out path draws exactly as before, so the acceptance prompts
    do not move). style: the naming style's draw, given instead of drawn (probes of one style: below
    PSEUDO_NAMES made-up words, then identifiers, then docstring words, then the word lists)."""
    if style is None:
        style = rng.random() if not held_out else 1.0
    idents = stdlib_identifiers() if PSEUDO_NAMES <= style < PSEUDO_NAMES + IDENTIFIER_NAMES else ()
    doc_words = _held_in_doc_words() if 0 <= style - PSEUDO_NAMES - IDENTIFIER_NAMES < DOC_WORD_NAMES else ()

    def pick(words):
        if style < PSEUDO_NAMES and rng.random() < 0.7:
            return pseudo_word(rng)
        if idents and rng.random() < 0.5:
            return rng.choice(idents).split("_")[0]
        if doc_words and rng.random() < 0.8:
            return rng.choice(doc_words)
        return rng.choice(_split(words, held_out))

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
    lists (verbs and adjectives too, held-out ones included: this is copying, not naming a tool) and
    words of the standard library's docstrings. The plainest copying exercise, over as many different
    tokens as the corpus has: a model copies into tool calls only words it has copied somewhere in
    training."""
    idents, words = stdlib_identifiers(), stdlib_words()

    def word():
        r = rng.random()
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
    return _chat(rng, user, text, "Repeat the words exactly.")


# ------------------------------------------------------------------------------- plain text
@lru_cache(maxsize=1)
def stdlib_texts() -> tuple[str, ...]:
    """Docstrings and source of the standard library's top-level modules, in sorted order."""
    out = []
    for src, tree in _stdlib_modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 80:
                    out.append(doc)
        for start in range(0, min(len(src), 60000), 3000):
            out.append(src[start:start + 3000])
    return tuple(out)


@lru_cache(maxsize=1)
def stdlib_words() -> tuple[str, ...]:
    """Lowercase words (3-12 letters) that occur at least three times in the standard library's
    docstrings, in sorted order."""
    counts: dict[str, int] = {}
    for text in stdlib_texts():
        if "def " in text or "import " in text:  # source chunks: identifiers, not prose
            continue
        for w in re.findall(r"\b[a-z]{3,12}\b", text):
            counts[w] = counts.get(w, 0) + 1
    return tuple(sorted(w for w, c in counts.items() if c >= 3))


@lru_cache(maxsize=1)
def _held_in_doc_words() -> tuple[str, ...]:
    """stdlib_words() less the held-out ones (is_held_out): names for training tools."""
    return tuple(w for w in stdlib_words() if not is_held_out(w))


def plain_text(rng: random.Random) -> str:
    texts = stdlib_texts()
    return rng.choice(texts) + "\n" + EOT if texts else json_doc(rng)


MIXTURE = ((counting, 0.18), (arithmetic, 0.10), (word_problem, 0.08), (json_doc, 0.10), (tool_chat, 0.32),
           (copy_chat, 0.08), (plain_text, 0.14))


def documents(n: int, seed: int) -> list[str]:
    """n documents drawn from MIXTURE with random.Random(seed)."""
    rng = random.Random(seed)
    fns, weights = zip(*MIXTURE)
    return [rng.choices(fns, weights)[0](rng) for _ in range(n)]
