"""The tokenizer's BPE word cache is capped (EngineConfig.tokenizer_cache_words): unique long words no
longer pile up in the heap (the soak's slow RSS rise), and the cap does not change any encoding. `encode`
returns transformers' ids, through the backend where that is the same pipeline."""

import random
import string

import pytest

from tpserve.config import EngineConfig
from tpserve.engine.tokenizer import _backend, encode, load_tokenizer, splittable
from tpserve.engine.setup import builtin_demo_model
from tpserve.server.memory import heap_mib

_rng = random.Random(0)
WORDS = ["".join(_rng.choice(string.ascii_lowercase) for _ in range(200)) for _ in range(3000)]


def _heap_growth(cache_words: int) -> float:
    tok = load_tokenizer(builtin_demo_model(), cache_words)
    before = heap_mib()["in_use"]
    for w in WORDS:
        tok.encode(w, add_special_tokens=False)
    return heap_mib()["in_use"] - before


@pytest.mark.skipif(heap_mib() is None, reason="needs glibc's mallinfo2")
def test_capped_cache_keeps_the_heap_flat():
    # 3,000 unique 200-letter words: the default cache keeps all of them (~19 MiB), a cap of
    # 100 at most 100 (~0.6 MiB); the bounds leave a wide margin either way
    assert _heap_growth(10_000) > 8.0
    assert _heap_growth(100) < 3.0


def test_cap_does_not_change_encodings():
    text = "Count from 1 to 20: 1, 2, 3 " + " ".join(WORDS[:50])
    assert load_tokenizer(builtin_demo_model(), 0).encode(text) == load_tokenizer(builtin_demo_model(), 10_000).encode(text)


def test_negative_cap_is_a_clear_error():
    with pytest.raises(ValueError, match="tokenizer_cache_words"):
        EngineConfig(tokenizer_cache_words=-1)


TEXTS = ["", " ", "Count from 1 to 20: 1, 2, 3", "  two  spaces\n\n\tand tabs  ", "héllo wörld 日本語 🙂",
         "[gMASK]<sop><|user|>What is 2+2?<|assistant|><think></think>", "<|endoftext|> after the end",
         " ".join(WORDS[:20])]


def test_encode_gives_transformers_ids_through_the_backend():
    tok = load_tokenizer(builtin_demo_model(), 10_000)
    assert _backend(tok) is not None
    for text in TEXTS:
        for special in (True, False):
            assert encode(tok, text, add_special_tokens=special) == tok.encode(text, add_special_tokens=special)


def test_encode_falls_back_where_the_backend_would_differ():
    tok = load_tokenizer(builtin_demo_model(), 10_000)
    text = " ".join(WORDS[:20])
    tok.backend_tokenizer.enable_truncation(3)  # state transformers' encode resets, the backend would apply
    assert _backend(tok) is None
    assert encode(tok, text) == tok.encode(text) and len(encode(tok, text)) > 3

    tok = load_tokenizer(builtin_demo_model(), 10_000)
    tok.split_special_tokens = True  # transformers sets the backend's flag on its next encode
    assert _backend(tok) is None
    assert encode(tok, TEXTS[5]) == tok.encode(TEXTS[5])

    class Lowercase(type(tok)):
        def encode(self, text, **kw):
            return super().encode(text.lower(), **kw)

    tok.__class__ = Lowercase
    assert _backend(tok) is None
    assert encode(tok, "ABC abc") == tok.encode("ABC abc")


CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")


def _with_pre_tokenizer(kind: str):
    from tokenizers import Regex, pre_tokenizers

    tok = load_tokenizer(builtin_demo_model(), 10_000)
    if kind == "gpt2":
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif kind == "cl100k":
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(CL100K), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


def _random_text(rng: random.Random, n: int) -> str:
    parts = (list(string.ascii_letters) * 6 + [" "] * 30 + list(string.digits) + list(string.punctuation)
             + ["\n", "\n\n", "\t", "  ", "'s", "'ll", "é", "ß", "日本", "\u0301", "🙂", "<|endoftext|>", "[gMASK]",
                " 12", "Ab cd", "x y"])
    return "".join(rng.choice(parts) for _ in range(n))


@pytest.mark.parametrize("kind", ["demo", "gpt2", "cl100k"])
def test_long_texts_encode_in_pieces_with_the_whole_texts_ids(kind, monkeypatch):
    """Cut at every few characters (8 pieces a text), random texts of letters, spaces, digits, punctuation,
    newlines, contractions, non-ASCII, combining marks and special tokens encode to the ids of the whole text."""
    from tpserve.engine import tokenizer as mod

    tok = _with_pre_tokenizer(kind)
    assert mod.splittable(tok.backend_tokenizer)
    monkeypatch.setattr(mod, "PIECE_CHARS", 32)
    monkeypatch.setattr(mod.os, "cpu_count", lambda: 8)
    cut = []
    real = mod._cuts
    monkeypatch.setattr(mod, "_cuts", lambda text, n: cut.append(n) or real(text, n))
    rng = random.Random(kind)
    for i in range(150):
        text = _random_text(rng, rng.randrange(40, 600))
        special = bool(i % 2)
        assert encode(tok, text, add_special_tokens=special) == tok.encode(text, add_special_tokens=special), text
    assert len(cut) > 100  # the pieces path ran
    assert len(real("1 2, 3. " * 100, 8)) == 1  # no space between two letters: no cut
    text = "ab cd " * 200
    assert "".join(real(text, 8)) == text and len(real(text, 8)) == 8


def test_pre_tokenizers_not_checked_encode_whole():
    from tokenizers import normalizers, pre_tokenizers

    tok = load_tokenizer(builtin_demo_model(), 10_000)
    tok.backend_tokenizer.normalizer = normalizers.Lowercase()
    assert not splittable(tok.backend_tokenizer)
    for pre in (pre_tokenizers.Whitespace(), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)):
        tok = load_tokenizer(builtin_demo_model(), 10_000)
        tok.backend_tokenizer.pre_tokenizer = pre
        assert not splittable(tok.backend_tokenizer), pre
    from tokenizers import AddedToken

    tok = load_tokenizer(builtin_demo_model(), 10_000)
    tok.backend_tokenizer.add_special_tokens([AddedToken("<x>", rstrip=True)])
    assert not splittable(tok.backend_tokenizer)


def test_the_switch_turns_the_pieces_off(monkeypatch):
    from tpserve.engine import tokenizer as mod

    monkeypatch.setattr(mod, "PIECE_CHARS", 32)
    monkeypatch.setattr(mod.os, "cpu_count", lambda: 8)
    cut = []
    real = mod._cuts
    monkeypatch.setattr(mod, "_cuts", lambda text, n: cut.append(n) or real(text, n))
    text = "ab cd " * 100
    on, off = load_tokenizer(builtin_demo_model(), 10_000), load_tokenizer(builtin_demo_model(), 10_000, in_pieces=False)
    assert encode(off, text) == encode(on, text) == on.encode(text)
    assert cut == [8]  # only the tokenizer loaded with pieces on cut the text
    assert EngineConfig(tokenize_in_pieces=False).tokenize_in_pieces is False
