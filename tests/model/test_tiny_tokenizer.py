"""The tiny deterministic GLM tokenizer written by `write_tiny_tokenizer`."""

from __future__ import annotations

import json
import random
import time

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tpserve.model.tiny_tokenizer import (
    GLM_EOS_TOKENS,
    GLM_SPECIAL_TOKENS,
    GLM_TEXT_TOKENS,
    write_tiny_tokenizer,
)
from tpserve.server.chat import default_chat_template


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_tok")
    info = write_tiny_tokenizer(path, 512)
    return path, info, AutoTokenizer.from_pretrained(path)


def test_loads_as_fast_tokenizer(written):
    path, info, tok = written
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert len(tok) == info["num_tokens"] == 512
    assert {p.name for p in path.iterdir()} >= {
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"
    }
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == default_chat_template()
    assert tok.chat_template == default_chat_template()


def test_ids_returned(written):
    _, info, tok = written
    assert info["eos_token_id"] == tok.convert_tokens_to_ids(list(GLM_EOS_TOKENS))
    assert info["pad_token_id"] == tok.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.eos_token == "<|endoftext|>"
    assert info["bos_token_id"] is None and tok.bos_token is None
    assert max(info["token_ids"].values()) < 512


def test_added_tokens(written):
    _, _, tok = written
    for token in (*GLM_SPECIAL_TOKENS, *GLM_TEXT_TOKENS):
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == token
    text = "[gMASK]<sop><|user|>hi<|assistant|><think>hm</think><tool_call>f</tool_call>"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    visible = tok.decode(ids, skip_special_tokens=True)
    assert visible == "hi<think>hm</think><tool_call>f</tool_call>"


def test_round_trips_text(written):
    _, _, tok = written
    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,;:!?'\"\n\t-_(){}[]/\\@#$%^&*"
    alphabet += "éüß日本語🙂"
    samples = ["The cat is on the mat.", "  spaces  ", "héllo wörld 日本語 🙂", ""]
    for _ in range(200):
        samples.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))))
    for text in samples:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert all(0 <= i < 512 for i in ids)
    assert len(tok.encode("the the the", add_special_tokens=False)) < len("the the the")


def test_every_id_decodes(written):
    _, _, tok = written
    tokens = tok.convert_ids_to_tokens(list(range(512)))
    assert None not in tokens and len(set(tokens)) == 512


def test_deterministic_and_fast(tmp_path):
    start = time.perf_counter()
    a = write_tiny_tokenizer(tmp_path / "a", 512)
    elapsed = time.perf_counter() - start
    b = write_tiny_tokenizer(tmp_path / "b", 512)
    assert elapsed < 1.0
    assert a == b
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_sizes(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        write_tiny_tokenizer(tmp_path / "small", 100)
    with pytest.raises(TypeError, match="vocab_size"):
        write_tiny_tokenizer(tmp_path / "float", 512.0)
    assert write_tiny_tokenizer(tmp_path / "min", 276)["num_tokens"] == 276
    assert write_tiny_tokenizer(tmp_path / "nofill", 4096, fill=False)["num_tokens"] < 400
    big = write_tiny_tokenizer(tmp_path / "big", 4096, model_max_length=2048)
    assert big["num_tokens"] == 4096
    tok = AutoTokenizer.from_pretrained(tmp_path / "big")
    assert len(tok) == 4096 and tok.model_max_length == 2048
    assert tok.decode(tok.encode("round trip ok", add_special_tokens=False)) == "round trip ok"
