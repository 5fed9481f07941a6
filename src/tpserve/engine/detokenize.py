"""Incremental detokenization with stop strings.

Each step decodes only a short window: the tokens since the last point where the text was
certain, plus the few before it (so tokenizers that merge a leading space or split a character
across tokens decode the new piece correctly), and appends the difference. The visible text
never runs ahead of what is certain: a trailing partial UTF-8 character and (while generation
goes on) the last len(longest stop string) - 1 characters are held back, so a stop string split
across tokens never leaks into streamed output. The final text is one full decode.

Decoding calls the `tokenizers` backend directly where transformers' decode would return the same
string (a fast tokenizer without clean_up_tokenization_spaces): its wrapper costs more than the decode
itself, twice per generated token (bench/detok_speed.py).
"""

from __future__ import annotations

from tpserve.sampling_params import SamplingParams


class Detokenizer:
    def __init__(self, tokenizer, params: SamplingParams):
        self.tokenizer, self.params = tokenizer, params
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend_decode = (backend.decode if backend is not None
                                and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False else None)
        self.hold = max((len(s) for s in params.stop_list), default=1) - 1
        self.text = ""
        self.stopped = False
        self._searched = 0  # stop strings cannot start before this index of the full text
        self._decoded = ""  # text of token_ids[:_read], certain
        self._prefix = 0    # window start: a few tokens before _read, for context
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        if self._backend_decode is not None:
            return self._backend_decode(ids, skip_special_tokens=self.params.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.params.skip_special_tokens)

    def _advance(self, token_ids: list[int]) -> None:
        before = self._decode(token_ids[self._prefix:self._read])
        after = self._decode(token_ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._decoded += after[len(before):]
            self._prefix, self._read = self._read, len(token_ids)

    def update(self, token_ids: list[int], final: bool) -> str | None:
        """Refresh `text` for the tokens so far; return the stop string that ended it, if any."""
        if self.stopped:
            return None
        if final:
            full = self._decode(token_ids)
        else:
            self._advance(token_ids)
            full = self._decoded
        hit, at = None, len(full)
        for stop in self.params.stop_list:
            idx = full.find(stop, max(0, self._searched - len(stop) + 1))
            if idx != -1 and idx < at:
                hit, at = stop, idx
        if hit is not None:
            self.stopped = True
            self.text = full[:at + (len(hit) if self.params.include_stop_str_in_output else 0)]
            return hit
        self._searched = len(full)
        if not final and self.hold:  # (_decoded never ends in a partial character)
            full = full[:max(len(self.text), len(full) - self.hold)]
        self.text = full if len(full) >= len(self.text) or final else self.text
        return None
