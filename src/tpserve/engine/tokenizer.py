"""The checkpoint's tokenizer: loading it, and encoding text to ids.

`encode` calls the `tokenizers` backend's encode_batch_fast where transformers' encode would return the same ids
(its own fast tokenizer class, unchanged by a subclass, no truncation or padding set on the backend): the same
pipeline without tracking character offsets, which nothing here reads. A long text is also cut into pieces that
the backend encodes on all cores at once, where the pieces' ids are provably the whole text's (`_cuts`). Both
come before a prompt's first token (bench/prefix_ttft.py times them).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

PIECE_CHARS = 4096  # a piece encoded on its own: about a thousand tokens
# A space between two ASCII letters. Under the pre-tokenizers in _SPLITS a pre-token ends before such a space and
# the next one starts at it, scanning the whole text or starting from the space: their patterns look behind
# nothing, a lookahead from the space sees the same letter either way, and a letter run stops at the space. BPE
# then works on each pre-token alone, so the pieces' ids are the whole text's.
_BOUNDARY = re.compile(r"(?<=[A-Za-z]) (?=[A-Za-z])")
# Split patterns (Isolated) checked for that property: word-level ones (GPT-2's, cl100k-style as Qwen2 and GLM-4.5
# use), and ones that only cut off digits or a space before a letter
_WORDS = {r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"}
_SPLITS = _WORDS | {r" ?\p{N}", r"\p{N}", r" (?=\p{L})"}


def load_tokenizer(model_dir, cache_words: int, in_pieces: bool = True):
    """The checkpoint's tokenizer, its BPE word cache capped at cache_words: HF tokenizers caches up to
    10,000 words by count, not size, so a server that meets many unique long words (numbers, ids, hashes)
    keeps growing its heap until the cache is full (BENCHMARKS.md, soak). tokenizers exposes the
    capacity only as the model's `_resize_cache`; a tokenizer without one is left as it is. in_pieces:
    whether `encode` may cut long texts (EngineConfig.tokenize_in_pieces)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.tpserve_in_pieces = in_pieces
    resize = getattr(getattr(getattr(tok, "backend_tokenizer", None), "model", None), "_resize_cache", None)
    if resize is not None:
        resize(cache_words)
    return tok


def _backend(tok: Any):
    """tok's `tokenizers` backend when encoding through it gives transformers' ids, else None."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    backend = getattr(tok, "_tokenizer", None)
    if (type(tok).encode is not TokenizersBackend.encode or type(tok)._encode_plus is not TokenizersBackend._encode_plus
            or not hasattr(backend, "encode_batch_fast")):
        return None
    if backend.truncation is not None or backend.padding is not None:
        return None
    if backend.encode_special_tokens != bool(tok.split_special_tokens):
        return None
    return backend


def _stage_ok(stage: dict) -> bool:
    if stage.get("type") == "ByteLevel":
        return stage.get("add_prefix_space") is False
    return (stage.get("type") == "Split" and stage.get("behavior") == "Isolated" and stage.get("invert") is False
            and stage.get("pattern", {}).get("Regex") in _SPLITS)


def splittable(backend) -> bool:
    """Whether `backend` encodes a text cut at _BOUNDARY into the concatenation of the pieces' ids: no normalizer,
    BPE without dropout, added tokens without whitespace or stripping (none can span a cut or move it), and a
    pre-tokenizer made of the stages checked above, one of them splitting words (GPT-2's ByteLevel regex or a
    word-level Split pattern)."""
    if backend.normalizer is not None or type(backend.model).__name__ != "BPE" or backend.model.dropout:
        return False
    for t in backend.get_added_tokens_decoder().values():
        if t.lstrip or t.rstrip or t.single_word or any(c.isspace() for c in t.content):
            return False
    pre = backend.pre_tokenizer
    spec = json.loads(pre.__getstate__()) if pre is not None else {}
    stages = spec.get("pretokenizers", []) if spec.get("type") == "Sequence" else [spec]
    words = any(st.get("type") == "ByteLevel" and st.get("use_regex") or st.get("pattern", {}).get("Regex") in _WORDS
                for st in stages)
    return bool(stages) and words and all(_stage_ok(st) for st in stages)


def _cuts(text: str, pieces: int) -> list[str]:
    """text in up to `pieces` parts of about equal length, each cut at the first _BOUNDARY past its mark."""
    out, start = [], 0
    for j in range(1, pieces):
        m = _BOUNDARY.search(text, max(start + 1, len(text) * j // pieces))
        if m is None:
            break
        out.append(text[start:m.start()])
        start = m.start()
    return out + [text[start:]]


def encode(tok: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    """tok.encode(text, add_special_tokens=...), the same ids."""
    backend = _backend(tok)
    if backend is None:
        return tok.encode(text, add_special_tokens=add_special_tokens)
    pieces = min(os.cpu_count() or 1, len(text) // PIECE_CHARS)
    specials = add_special_tokens and backend.post_processor is not None \
        and backend.post_processor.num_special_tokens_to_add(False) > 0
    if pieces < 2 or specials or not getattr(tok, "tpserve_in_pieces", True) or not _splittable_cached(tok, backend):
        return backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
    return [i for e in backend.encode_batch_fast(_cuts(text, pieces), add_special_tokens=False) for i in e.ids]


def _splittable_cached(tok: Any, backend) -> bool:
    """splittable(backend), kept on tok while its backend and pre-tokenizer are the same objects."""
    key = (id(backend), id(backend.pre_tokenizer), id(backend.normalizer))
    hit = getattr(tok, "_tpserve_splittable", None)
    if hit is None or hit[0] != key:
        hit = (key, splittable(backend))
        tok._tpserve_splittable = hit
    return hit[1]
