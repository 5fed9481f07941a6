"""Corpus -> tokenizer -> packed token rows, saved as one xz-compressed file (small enough to
carry to a GPU machine that lacks `tokenizers`).

Rows: documents in generated order, packed greedily into rows of `seq_len` tokens without
splitting a document (one longer than a row is cut to the row), padded with -1 (no loss).
"""

from __future__ import annotations

import hashlib
import json
import lzma
from pathlib import Path

import numpy as np
import torch

from tpserve.train import corpus

TOKENIZER_DOCS = 20000  # documents the BPE is trained on (the first ones)


def pack(docs: list[list[int]], seq_len: int) -> torch.Tensor:
    rows, cur = [], []
    for ids in docs:
        ids = ids[:seq_len]
        if len(cur) + len(ids) > seq_len:
            rows.append(cur + [-1] * (seq_len - len(cur)))
            cur = []
        cur = cur + ids
    if cur:
        rows.append(cur + [-1] * (seq_len - len(cur)))
    return torch.tensor(rows, dtype=torch.int16)


def prepare(out: Path, *, docs: int, seed: int, vocab_size: int, seq_len: int) -> dict:
    """Write out/model tokenizer files and out/data.xz (rows) + out/data.json; returns the info."""
    from tpserve.train.tokenizer import train_tokenizer, write_tokenizer  # needs `tokenizers`

    out = Path(out)
    texts = corpus.documents(docs, seed)
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    tok = train_tokenizer(texts[:TOKENIZER_DOCS], vocab_size)
    info = write_tokenizer(tok, out / "model", model_max_length=4 * seq_len)
    rows = pack([e.ids for e in tok.encode_batch(texts)], seq_len)
    if vocab_size > 32767:
        raise ValueError("vocab_size: rows are stored as int16, keep it below 32768")
    (out / "data.xz").write_bytes(lzma.compress(rows.numpy().tobytes(), preset=6))
    info.update(rows=rows.shape[0], seq_len=seq_len, docs=docs, seed=seed, corpus_sha256=digest,
                tokens=int((rows >= 0).sum()))
    (out / "data.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def load_rows(out: Path) -> tuple[torch.Tensor, dict]:
    out = Path(out)
    info = json.loads((out / "data.json").read_text())
    raw = np.frombuffer(lzma.decompress((out / "data.xz").read_bytes()), dtype=np.int16)
    return torch.from_numpy(raw.copy()).view(info["rows"], info["seq_len"]), info
