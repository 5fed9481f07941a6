"""Incremental detokenization: streamed text is always a prefix of the full decode; stop strings
split across tokens never leak; the final text is the full decode."""

import pytest
from transformers import AutoTokenizer

from tpserve.engine.detokenize import Detokenizer
from tpserve.sampling_params import SamplingParams

TEXT = "Héllo wörld, ein schöner Tag — 你好, <think>plan</think> done."


@pytest.fixture(scope="module")
def tok(tiny):
    return AutoTokenizer.from_pretrained(str(tiny("default")))


def _feed(tok, params, ids):
    d = Detokenizer(tok, params)
    seen, hit = [], None
    for i in range(1, len(ids) + 1):
        hit = d.update(ids[:i], final=i == len(ids))
        seen.append(d.text)
        if hit is not None:
            break
    return d, seen, hit


def test_stream_is_prefix_and_final_is_full_decode(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    full = tok.decode(ids, skip_special_tokens=True)
    d, seen, _ = _feed(tok, SamplingParams(), ids)
    assert all(full.startswith(s) for s in seen)
    assert all(len(a) <= len(b) for a, b in zip(seen, seen[1:]))
    assert d.text == full == TEXT


def test_stop_string_across_tokens(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    d, seen, hit = _feed(tok, SamplingParams(stop=["schöner"]), ids)
    assert hit == "schöner" and d.text == "Héllo wörld, ein "
    assert not any("schö" in s for s in seen)
    d, _, _ = _feed(tok, SamplingParams(stop=["schöner"], include_stop_str_in_output=True), ids)
    assert d.text == "Héllo wörld, ein schöner"
