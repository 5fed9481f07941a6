"""Shared pieces of the generated corpus: the chat template as the server renders it, chat
documents, the held-out word split and made-up words."""

from __future__ import annotations

import hashlib
import random
import re
from functools import lru_cache
from pathlib import Path

from tpserve.train.words import ADJECTIVES, NOUNS, VERBS

EOT = "<|endoftext|>"
TEMPLATE_PATH = Path(__file__).resolve().parent.parent / "server" / "glm_chat_template.jinja"


def is_held_out(word: str) -> bool:
    """About one word in six is kept out of training tool names (stable across runs)."""
    return hashlib.sha256(word.encode()).digest()[0] % 6 == 0


@lru_cache(maxsize=32)
def split_words(words: tuple[str, ...], held_out: bool) -> tuple[str, ...]:
    return tuple(w for w in words if is_held_out(w) == held_out)


def held_out_vocabulary(extra: tuple[str, ...] = ()) -> frozenset[str]:
    """The held-out words of the word lists (and of `extra`): never in a training tool's name or
    description."""
    return frozenset(w for w in VERBS + NOUNS + ADJECTIVES + tuple(extra) if is_held_out(w))


def words_of(text: str) -> set[str]:
    """Lowercase words of a name or description (snake_case split)."""
    return set(re.findall(r"[a-z]+", text.lower()))


@lru_cache(maxsize=1)
def _template():
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(TEMPLATE_PATH.read_text(encoding="utf-8"))


def render_chat(messages: list[dict], tools: list[dict] | None = None, *, thinking: bool,
                add_generation_prompt: bool = False) -> str:
    """The chat template exactly as the server renders it (transformers' jinja environment)."""
    return _template().render(messages=messages, tools=tools or None, enable_thinking=thinking,
                              add_generation_prompt=add_generation_prompt)


def chat_doc(rng: random.Random, user: str, answer: str, reasoning: str) -> str:
    """One user turn and its answer, with reasoning half of the time."""
    thinking = rng.random() < 0.5
    msg = {"role": "assistant", "content": answer}
    if thinking:
        msg["reasoning_content"] = reasoning
    return render_chat([{"role": "user", "content": user}, msg], thinking=thinking) + EOT


SYLLABLES = tuple("ba be bi bo bu da de di do ka ke ki ko ku la le li lo lu ma me mi mo mu na ne ni no nu "
                  "pa pe pi po ra re ri ro ru sa se si so ta te ti to tu va ve vi vo za ze zi zo "
                  "bar ken lor mix nor pel rak sim tor vex zan dul fin gor hap jem wix yat".split())


def pseudo_word(rng: random.Random) -> str:
    """A made-up word of 2-3 syllables: names nobody can guess, so the model learns to copy them.
    Never a held-out one: syllables can spell real words ("to" + "ken"), and held-out words must
    not name a training tool."""
    while True:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))
        if not is_held_out(word):
            return word
