"""A tiny, deterministic GLM-style tokenizer for tests and `tpserve make-tiny`.

`write_tiny_tokenizer(out_dir, vocab_size)` writes `tokenizer.json`, `tokenizer_config.json`
(with our GLM chat template) and `special_tokens_map.json`, loadable with
`transformers.AutoTokenizer.from_pretrained(out_dir)`.

Layout of the ids (nothing is trained, so the files are byte-for-byte reproducible):

* 0..255: the byte-level alphabet (GPT-2 byte-to-unicode mapping), id == byte value, so any
  UTF-8 text round-trips through encode/decode;
* then a fixed list of merges of common English pairs, then (when `fill`) generated letter
  merges until the vocabulary uses every id the model can emit (a random tiny model samples
  any id below its embedding size, and every such id should decode to some text);
* last, GLM's added tokens: the special (control) tokens, then the tags that appear as text.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CHAT_TEMPLATE_PATH = Path(__file__).resolve().parent.parent / "server" / "glm_chat_template.jinja"

# Control tokens: decoded only with skip_special_tokens=False.
GLM_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
)
# Single-id tags that stay in decoded text (the reasoning and tool-call parsers read them).
GLM_TEXT_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<tool_response>",
    "</tool_response>",
)
# GLM ends an assistant turn at any of these.
GLM_EOS_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")
PAD_TOKEN = "<|endoftext|>"

_SPACE = "\u0120"  # byte-level symbol for " "
# Common English merges, in priority order; every part exists before it is used.
_COMMON_MERGES = (
    (_SPACE, "t"), ("h", "e"), ("i", "n"), ("e", "r"), ("a", "n"), (_SPACE, "a"),
    ("o", "n"), ("r", "e"), (_SPACE + "t", "he"), ("e", "n"), ("a", "t"), ("o", "u"),
    ("e", "s"), ("i", "s"), ("o", "r"), (_SPACE, "s"), (_SPACE, "w"), (_SPACE, "o"),
    ("i", "t"), ("e", "d"), ("in", "g"), (_SPACE, "c"), (_SPACE, "b"), (_SPACE, "f"),
    (_SPACE, "p"), ("a", "r"), ("a", "l"), (_SPACE, "m"), ("l", "e"), ("s", "t"),
    ("n", "d"), (_SPACE, "i"), (_SPACE + "o", "f"), (_SPACE + "a", "nd"), (_SPACE + "t", "o"),
    (_SPACE + "i", "s"), (_SPACE + "i", "n"), ("i", "on"), ("l", "l"), ("o", "m"),
)
_FILL_LETTERS = "etaoinshrdlucmfwypvbgkjqxz"


def byte_level_alphabet() -> list[str]:
    """The 256 byte-level symbols, indexed by byte value (GPT-2's byte-to-unicode mapping)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def _fill_merges(vocab: dict[str, int], count: int) -> list[tuple[str, str]]:
    """`count` new merges `token + letter`, breadth first from the space and letter symbols."""
    merges: list[tuple[str, str]] = []
    queue = [_SPACE, *_FILL_LETTERS]
    queued = set(queue)
    pos = 0
    while len(merges) < count:
        left = queue[pos]
        pos += 1
        for letter in _FILL_LETTERS:
            token = left + letter
            if token not in queued:
                queued.add(token)
                queue.append(token)
            if token in vocab:
                continue
            vocab[token] = len(vocab)
            merges.append((left, letter))
            if len(merges) == count:
                break
    return merges


def build_tiny_tokenizer(vocab_size: int, *, fill: bool = True) -> Tokenizer:
    """The `tokenizers.Tokenizer` behind `write_tiny_tokenizer` (see there for the arguments)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    num_added = len(GLM_SPECIAL_TOKENS) + len(GLM_TEXT_TOKENS)
    minimum = 256 + num_added
    if vocab_size < minimum:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for the tiny tokenizer: it needs at least "
            f"{minimum} ids (256 byte tokens + {num_added} GLM added tokens)"
        )
    vocab = {symbol: i for i, symbol in enumerate(byte_level_alphabet())}
    budget = vocab_size - minimum
    merges: list[tuple[str, str]] = []
    for left, right in _COMMON_MERGES[:budget]:
        vocab[left + right] = len(vocab)
        merges.append((left, right))
    if fill and len(merges) < budget:
        merges += _fill_merges(vocab, budget - len(merges))

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in GLM_SPECIAL_TOKENS]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in GLM_TEXT_TOKENS]
    )
    return tokenizer


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tiny_tokenizer(
    out_dir: Path,
    vocab_size: int,
    *,
    fill: bool = True,
    model_max_length: int | None = None,
) -> dict:
    """Write a GLM-style byte-level BPE tokenizer into `out_dir` and return its ids.

    Args:
        out_dir: folder to write into (created if missing).
        vocab_size: the model's embedding size; the tokenizer uses at most this many ids
            (exactly this many when `fill`). Raises ValueError below 276.
        fill: add generated merges so that every id below `vocab_size` is a token.
        model_max_length: stored in tokenizer_config.json when given.

    Returns:
        {"eos_token_id": [ids of <|endoftext|>, <|user|>, <|observation|>],
         "pad_token_id": id of <|endoftext|>, "bos_token_id": None,
         "num_tokens": tokens in the vocabulary, "token_ids": {added token: id}}.
    """
    tokenizer = build_tiny_tokenizer(vocab_size, fill=fill)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))

    config: dict = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": GLM_EOS_TOKENS[0],
        "pad_token": PAD_TOKEN,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE_PATH.read_text(encoding="utf-8"),
    }
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(
        out_dir / "special_tokens_map.json",
        {"eos_token": GLM_EOS_TOKENS[0], "pad_token": PAD_TOKEN},
    )

    token_ids = {t: tokenizer.token_to_id(t) for t in (*GLM_SPECIAL_TOKENS, *GLM_TEXT_TOKENS)}
    return {
        "eos_token_id": [token_ids[t] for t in GLM_EOS_TOKENS],
        "pad_token_id": token_ids[PAD_TOKEN],
        "bos_token_id": None,
        "num_tokens": tokenizer.get_vocab_size(with_added_tokens=True),
        "token_ids": token_ids,
    }
