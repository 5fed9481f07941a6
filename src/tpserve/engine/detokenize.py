"""Incremental detokenization with stop strings.

The visible text never runs ahead of what is certain: a trailing partial UTF-8 character and
(while generation goes on) the last len(longest stop string) - 1 characters are held back, so a
stop string split across tokens never leaks into streamed output.
"""

from __future__ import annotations

from tpserve.sampling_params import SamplingParams


class Detokenizer:
    def __init__(self, tokenizer, params: SamplingParams):
        self.tokenizer, self.params = tokenizer, params
        self.hold = max((len(s) for s in params.stop_list), default=1) - 1
        self.text = ""
        self.stopped = False
        self._searched = 0  # stop strings cannot start before this index of the full text

    def update(self, token_ids: list[int], final: bool) -> str | None:
        """Refresh `text` for the tokens so far; return the stop string that ended it, if any."""
        if self.stopped:
            return None
        full = self.tokenizer.decode(token_ids, skip_special_tokens=self.params.skip_special_tokens)
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
        if not final:
            full = full.rstrip("\ufffd")
            full = full[:max(len(self.text), len(full) - self.hold)] if self.hold else full
        self.text = full if len(full) >= len(self.text) or final else self.text
        return None
