"""The checkpoint's tokenizer: loading it, and encoding text to ids.

`encode` calls the `tokenizers` backend's encode_batch_fast where transformers' encode would return the same ids
(its own fast tokenizer class, unchanged by a subclass, no truncation or padding set on the backend): the same
pipeline without tracking character offsets, which nothing here reads. On a 16k-token prompt that is about a
third less time, all of it before the first token (bench/prefix_ttft.py).
"""

from __future__ import annotations

from typing import Any


def load_tokenizer(model_dir, cache_words: int):
    """The checkpoint's tokenizer, its BPE word cache capped at cache_words: HF tokenizers caches up to
    10,000 words by count, not size, so a server that meets many unique long words (numbers, ids, hashes)
    keeps growing its heap until the cache is full (BENCHMARKS.md, soak). tokenizers exposes the
    capacity only as the model's `_resize_cache`; a tokenizer without one is left as it is."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
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


def encode(tok: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    """tok.encode(text, add_special_tokens=...), the same ids."""
    backend = _backend(tok)
    if backend is None:
        return tok.encode(text, add_special_tokens=add_special_tokens)
    return backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
