"""The tokenizer's BPE word cache is capped (EngineConfig.tokenizer_cache_words): unique long words no
longer pile up in the heap (the soak's slow RSS rise), and the cap does not change any encoding."""

import random
import string

import pytest

from tpserve.config import EngineConfig
from tpserve.engine.engine import load_tokenizer
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
