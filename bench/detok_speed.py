"""Incremental detokenization cost per generated token (engine/detokenize.py), on the built-in
demo model's tokenizer: 1,000 tokens of counting text fed one at a time, with the backend decode
and with transformers' decode.

    python bench/detok_speed.py
"""

from __future__ import annotations

import time

from transformers import AutoTokenizer

from tpserve.engine.detokenize import Detokenizer
from tpserve.engine.setup import builtin_demo_model
from tpserve.sampling_params import SamplingParams


def per_token_us(tok, ids: list[int], backend: bool) -> float:
    best = float("inf")
    for _ in range(3):
        d = Detokenizer(tok, SamplingParams(max_tokens=len(ids)))
        if not backend:
            d._backend_decode = None
        t = time.perf_counter()
        for n in range(1, len(ids) + 1):
            d.update(ids[:n], final=False)
        best = min(best, (time.perf_counter() - t) / len(ids) * 1e6)
    return best


def main() -> None:
    tok = AutoTokenizer.from_pretrained(str(builtin_demo_model()))
    ids = tok.encode(", ".join(str(i) for i in range(1, 400)), add_special_tokens=False)[:1000]
    hf, fast = per_token_us(tok, ids, False), per_token_us(tok, ids, True)
    print(f"| decode path | us per token (best of 3, {len(ids)} tokens) |\n| --- | --- |")
    print(f"| transformers | {hf:.2f} |\n| tokenizers backend | {fast:.2f} |")


if __name__ == "__main__":
    main()
