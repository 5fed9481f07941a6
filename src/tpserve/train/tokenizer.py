"""A byte-level BPE trained on the demo corpus, with GLM's added tokens and our chat template.

Why not the tiny tokenizer: its 512 ids are almost all single bytes, so a count to 200 or a JSON
object costs about one token per character. This BPE splits numbers into single digits (a space
may ride on the first digit: " 12" -> " 1", "2"), so counting and arithmetic see the same digit
tokens everywhere, and learns merges for the words, JSON punctuation and code of the corpus.
A space before a letter is a token of its own, so a word is the same tokens after a space, a quote
or a tag ("Use notify_x", `"name": "notify_x"`, `<tool_call>notify_x`): copying a name the model
has never seen from the prompt into a tool call is then a copy of tokens, not a respelling (the
first demo models, with GPT-2's " word" tokens, wrote "noti_address" for notify_address).
The files load with transformers' AutoTokenizer (PreTrainedTokenizerFast).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from tpserve.model.tiny_tokenizer import (CHAT_TEMPLATE_PATH, GLM_EOS_TOKENS, GLM_SPECIAL_TOKENS, GLM_TEXT_TOKENS,
                                          PAD_TOKEN)

_ADDED = re.compile("|".join(re.escape(t) for t in (*GLM_SPECIAL_TOKENS, *GLM_TEXT_TOKENS)))


def _pieces(texts: Iterable[str]) -> Iterable[str]:
    for text in texts:
        yield from (p for p in _ADDED.split(text) if p)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    n_added = len(GLM_SPECIAL_TOKENS) + len(GLM_TEXT_TOKENS)
    if vocab_size < 256 + n_added + 1:
        raise ValueError(f"vocab_size: {vocab_size} leaves no room for merges")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" ?\p{N}"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r" (?=\p{L})"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_added, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_pieces(texts), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GLM_SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in GLM_TEXT_TOKENS])
    return tok


def write_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> dict:
    """tokenizer.json + tokenizer_config.json (with the chat template) + special_tokens_map.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": GLM_EOS_TOKENS[0], "pad_token": PAD_TOKEN,
              "bos_token": None, "clean_up_tokenization_spaces": False, "model_max_length": model_max_length,
              "chat_template": CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": GLM_EOS_TOKENS[0], "pad_token": PAD_TOKEN}, indent=2) + "\n")
    return {"eos_token_id": [tok.token_to_id(t) for t in GLM_EOS_TOKENS], "pad_token_id": tok.token_to_id(PAD_TOKEN),
            "vocab_size": tok.get_vocab_size(with_added_tokens=True)}
