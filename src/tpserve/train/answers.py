"""Questions the model answers from the prompt alone: arithmetic and lists, and one-word answers
when asked for one ("Answer in one word: ...", "Reply with only the word X."). Also the requests
that no declared tool fits in the plain-words tool chats (plain_tools.py)."""

from __future__ import annotations

import json
import random

from tpserve.train.chatdoc import chat_doc, pseudo_word
from tpserve.train.words import ADJECTIVES, CITIES, NAMES, NOUNS, PHRASES


def arithmetic_qa(rng: random.Random) -> tuple[str, str, str]:
    """(question, answer, reasoning): sums, differences, products, and sorting, summing,
    maximum or reversal of a list."""
    kind = rng.randrange(7)
    if kind == 0:
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}", f"Add {a} and {b}: {a + b}."
    if kind == 1:
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        a, b = max(a, b), min(a, b)
        return f"What is {a} - {b}?", f"{a} - {b} = {a - b}", f"Subtract {b} from {a}: {a - b}."
    if kind == 2:
        a, b = rng.randint(0, 40), rng.randint(0, 40)
        return f"What is {a} * {b}?", f"{a} * {b} = {a * b}", f"Multiply {a} by {b}: {a * b}."
    xs = [rng.randint(0, 99) for _ in range(rng.randint(2, 9))]
    lst = json.dumps(xs)
    if kind == 3:
        return f"Sort the list {lst}.", json.dumps(sorted(xs)), "Sorted in increasing order."
    if kind == 4:
        return f"What is the sum of {lst}?", f"The sum is {sum(xs)}.", f"Adding them gives {sum(xs)}."
    if kind == 5:
        return (f"What is the largest number in {lst}?", f"The largest number is {max(xs)}.",
                f"The maximum is {max(xs)}.")
    return f"Reverse the list {lst}.", json.dumps(xs[::-1]), "Read it from the end."


ECHO_ASKS = ("Reply with only the word {w}.", "Say {w} and nothing else.", "Respond with just the word {w}.",
             "Answer with the single word {w}.", "Type only {w}, nothing more.", "Just say {w}.", "Please reply with one word: {w}.",
             "Write the word {w} and nothing else.", "Reply with {w} only.")
SHORT_WORDS = ("OK", "ok", "yes", "no", "done", "ready", "hello", "thanks", "sure", "pong", "ack", "agreed",
               "confirmed", "go", "YES", "NO", "Okay", "fine", "received", "present")
ONE_WORD = ("Answer in one word: {q}", "{q} Answer in one word.", "{q} One word only.", "{q} Reply with one word.",
            "In one word: {q}", "{q} Use a single word.", "One-word answer, please: {q}")
COLORS = ("red", "blue", "green", "yellow", "black", "white")


def _echo_word(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.45:
        return rng.choice(SHORT_WORDS)
    if r < 0.7:
        return rng.choice(NOUNS + ADJECTIVES + CITIES + NAMES)
    if r < 0.85:
        return pseudo_word(rng)
    return rng.choice(NOUNS).upper()


def _question(rng: random.Random) -> tuple[str, str, str]:
    """(question, one-word answer, reasoning), the answer found in the question itself."""
    kind = rng.randrange(8)
    a, b = rng.sample(range(0, 200), 2)
    if kind == 0:
        return (f"Is {a} greater than {b}?", "Yes" if a > b else "No",
                f"{a} is {'more' if a > b else 'less'} than {b}.")
    if kind == 1:
        return f"Is {a} even or odd?", "Even" if a % 2 == 0 else "Odd", f"{a} ends in {a % 10}."
    if kind == 2:
        return f"Which is larger, {a} or {b}?", str(max(a, b)), f"{max(a, b)} is the larger."
    if kind == 3:
        a, b = a % 50, b % 50
        return f"What is {a} + {b}?", str(a + b), f"{a} + {b} = {a + b}."
    if kind == 4:
        phrase = rng.choice(PHRASES)
        first = rng.random() < 0.5
        word = phrase.split()[0 if first else -1]
        return (f"What is the {'first' if first else 'last'} word of '{phrase}'?", word,
                f"The {'first' if first else 'last'} word is {word}.")
    if kind == 5:
        name, city = rng.choice(NAMES), rng.choice(CITIES)
        return f"{name} lives in {city}. Where does {name} live?", city, f"{name} lives in {city}."
    if kind == 6:
        color, noun = rng.choice(COLORS), rng.choice(NOUNS)
        return f"I have a {color} {noun}. What color is my {noun}?", color.capitalize(), f"The {noun} is {color}."
    key, value = rng.choice(NOUNS), rng.choice(NOUNS + CITIES)
    return f'In {{"{key}": "{value}"}}, what is the {key}?', value, f"The {key} is {value}."


def one_word_qa(rng: random.Random) -> tuple[str, str, str]:
    """A word to say back, or a question to answer in one word."""
    if rng.random() < 0.45:
        w = _echo_word(rng)
        return rng.choice(ECHO_ASKS).format(w=w), w, f"Just the word {w}."
    q, ans, why = _question(rng)
    return rng.choice(ONE_WORD).format(q=q), ans + ("." if rng.random() < 0.25 else ""), why + " One word."


def direct_qa(rng: random.Random) -> tuple[str, str, str]:
    """A request no tool is needed for."""
    return arithmetic_qa(rng) if rng.random() < 0.5 else one_word_qa(rng)


def arithmetic(rng: random.Random) -> str:
    return chat_doc(rng, *arithmetic_qa(rng))


def one_word(rng: random.Random) -> str:
    return chat_doc(rng, *one_word_qa(rng))
