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


@pytest.mark.parametrize("which", ["tiny", "demo"])
def test_backend_decode_equals_transformers_decode(tok, which):
    """The direct `tokenizers` call gives exactly transformers' string: random ids over the whole
    vocabulary (special and added tokens included), both skip_special_tokens settings."""
    import random

    from tpserve.engine.setup import builtin_demo_model

    t = tok if which == "tiny" else AutoTokenizer.from_pretrained(str(builtin_demo_model()))
    rng = random.Random(0)
    for skip in (True, False):
        d = Detokenizer(t, SamplingParams(skip_special_tokens=skip))
        assert d._backend_decode is not None
        for _ in range(200):
            ids = [rng.randrange(len(t)) for _ in range(rng.randrange(1, 12))]
            assert d._decode(ids) == t.decode(ids, skip_special_tokens=skip), ids


def test_tokenizers_that_clean_up_spaces_keep_the_transformers_decode(tok):
    class CleaningUp:  # a tokenizer whose decode post-processes: the backend alone would differ
        backend_tokenizer = tok.backend_tokenizer
        clean_up_tokenization_spaces = True

        def decode(self, ids, skip_special_tokens=False):
            return "cleaned"

    d = Detokenizer(CleaningUp(), SamplingParams())
    assert d._backend_decode is None and d._decode([1, 2]) == "cleaned"


def test_final_only_requests_report_once_and_decode_once(tiny):
    """LLM.generate's requests (final_only): step() reports them once, finished; without stop strings the
    text is decoded once at the end, with the same result as token by token; stop strings keep the
    incremental path (they must be found as tokens arrive)."""
    from tpserve import LLM

    llm = LLM(str(tiny("default")), device="cpu", kv_cache_memory="16MiB")
    eng = llm.engine
    calls = []
    update = Detokenizer.update

    def counted(self, token_ids, final):
        calls.append(final)
        return update(self, token_ids, final)

    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    try:
        Detokenizer.update = counted
        texts = {}
        for final_only in (False, True):
            calls.clear()
            eng.add_request(f"r{final_only}", [5, 9, 13, 2], sp, final_only=final_only)
            reports = []
            while eng.has_unfinished():
                reports += eng.step()
            texts[final_only] = reports[-1].outputs[0].text
            if final_only:
                assert len(reports) == 1 and reports[0].finished
                assert calls == [True]                        # one full decode, at the end
            else:
                assert len(reports) == 12 and len(calls) == 13  # a report and an update per token (+ final)
        assert texts[True] == texts[False]
        assert len(texts[True]) >= 6
        eng.add_request("stop", [5, 9, 13, 2], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                                stop=[texts[True][3:6]]), final_only=True)
        calls.clear()
        while eng.has_unfinished():
            out = eng.step()
        assert len(calls) > 1 and out[0].outputs[0].finish_reason == "stop"
        assert out[0].outputs[0].text == texts[True][:3]
    finally:
        Detokenizer.update = update
        llm.shutdown()
