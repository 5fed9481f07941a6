"""Prompts for `tpserve bench serve`: random token ids, a JSONL file, or the built-in structured,
code and prose sets (multi-turn conversations: multiturn.py); and the salt of cold-prefill mode
(a unique head on every prompt, and a cache_salt per request in load.py, so no prefix cache can
serve any of it).
"""

from __future__ import annotations

import json
import random
import uuid

DATASETS = ("random", "jsonl", "structured", "code", "prose", "multiturn")  # multiturn: tools/bench/multiturn.py

_STRUCTURED = [
    'Return a JSON object with keys "name", "age" and "city" for a fictional person born in {n}.',
    "Convert this CSV row to JSON: id,{n},status,active,score,{m}.",
    "Write a YAML config for a service named svc-{n} with {m} replicas and a health check.",
    'List {m} fictional products as a JSON array of objects with "sku" and "price" (start at {n}).',
]
_CODE = [
    "Write a Python function that returns the {n}-th Fibonacci number iteratively.",
    "Implement binary search over a sorted list in Python; test it on a list of {n} items.",
    "Write a C function that reverses a linked list of {m} nodes in place.",
    "Write a SQL query that returns the top {m} customers by revenue in {n}.",
]
_PROSE = [
    "Write a short story about a lighthouse keeper in the year {n}.",
    "Explain to a child why the sky is blue, in about {m} sentences.",
    "Describe a walk through a market town on a rainy morning in {n}.",
    "Summarise the causes of the industrial revolution in {m} short paragraphs.",
]
BUILTIN = {"structured": _STRUCTURED, "code": _CODE, "prose": _PROSE}


def load_prompts(dataset: str, num: int, *, prompt_len: int = 32, path: str | None = None, seed: int = 0,
                 vocab: int = 250) -> list[str | list[int]]:
    """`num` prompts (text, or token-id lists for `random`)."""
    rng = random.Random(seed)
    if dataset == "random":
        if prompt_len < 1:
            raise ValueError(f"--prompt-len must be at least 1, got {prompt_len}")
        return [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(num)]
    if dataset == "jsonl":
        if not path:
            raise ValueError("--dataset jsonl needs --dataset-path FILE (one {\"prompt\": ...} per line)")
        prompts = []
        with open(path) as f:
            for k, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except ValueError:
                    raise ValueError(f"{path}:{k}: not JSON") from None
                text = doc.get("prompt", doc.get("text")) if isinstance(doc, dict) else None
                if not isinstance(text, str) or not text:
                    raise ValueError(f"{path}:{k}: needs a non-empty string field 'prompt' (or 'text')")
                prompts.append(text)
        if not prompts:
            raise ValueError(f"{path}: no prompts")
        return [prompts[i % len(prompts)] for i in range(num)]
    if dataset in BUILTIN:
        templates = BUILTIN[dataset]
        return [templates[i % len(templates)].format(n=rng.randrange(1900, 2100), m=rng.randrange(3, 12))
                for i in range(num)]
    raise ValueError(f"--dataset must be one of {', '.join(DATASETS)}, got {dataset!r}")


def salt(prompts: list, seed: int | None = None, vocab: int = 250) -> list:
    """A unique head on every prompt (text: a run-and-request tag; token ids: 8 random ids)."""
    run = uuid.uuid4().hex[:12] if seed is None else f"{seed:012x}"
    rng = random.Random(run)
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            out.append(f"[run {run} request {i}] {p}")
        else:
            out.append([rng.randrange(3, vocab) for _ in range(8)] + list(p))
    return out
