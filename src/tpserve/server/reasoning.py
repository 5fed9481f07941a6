"""Split GLM output into reasoning (`<think>...</think>`) and content, one-shot or streaming.

Where the output starts depends on how the prompt ended, given as a `ReasoningMode`
(`reasoning_mode_for_prompt` derives it from the prompt text):

* OFF: the prompt closed thinking (`<think></think>`) or thinking is disabled: all content.
* OPEN: the prompt ended inside `<think>` (our template and GLM-4.7/5's when thinking is on):
  text up to the first `</think>` is reasoning (a repeated leading `<think>` is dropped);
  with no `</think>` at all (cut by max_tokens) everything is reasoning.
* AUTO: the prompt ended with a bare `<|assistant|>` (GLM-4.5 style): if the output starts
  (after whitespace) with `<think>`, text up to `</think>` is reasoning; otherwise it is all
  content, verbatim (a stray `</think>` then stays in the content: a stream cannot take
  back content it already sent, and one-shot parsing must agree with streaming).

After `</think>`, leading whitespace of the content is dropped (GLM writes `</think>\\n`).
Reasoning text is kept verbatim. The streaming parser never emits part of a tag: a chunk
ending in e.g. `</th` is held back until the next chunk (or `finish()`) decides it, and its
concatenated output always equals the one-shot `parse`.
"""

from __future__ import annotations

from enum import Enum

THINK_START = "<think>"
THINK_END = "</think>"


class ReasoningMode(str, Enum):
    OFF = "off"
    OPEN = "open"
    AUTO = "auto"


def reasoning_mode_for_prompt(prompt: str, enable_thinking: bool = True) -> ReasoningMode:
    """The mode for output that continues `prompt` (see the module docstring)."""
    if not enable_thinking:
        return ReasoningMode.OFF
    tail = prompt.rstrip()
    if tail.endswith(THINK_END):
        return ReasoningMode.OFF
    if tail.endswith(THINK_START):
        return ReasoningMode.OPEN
    return ReasoningMode.AUTO


def partial_tag_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (0 if none)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _split_after_start(text: str) -> tuple[str, str]:
    """(reasoning, content) of text that begins inside a think block."""
    end = text.find(THINK_END)
    if end < 0:
        return text, ""
    return text[:end], text[end + len(THINK_END) :].lstrip()


class ReasoningParser:
    """One-shot parser: `parse(text) -> (reasoning_content or None, content)`."""

    def __init__(self, mode: ReasoningMode | str = ReasoningMode.AUTO):
        self.mode = ReasoningMode(mode)

    def parse(self, text: str) -> tuple[str | None, str]:
        if self.mode is ReasoningMode.OFF:
            return None, text
        stripped = text.lstrip()
        if stripped.startswith(THINK_START):
            reasoning, content = _split_after_start(stripped[len(THINK_START) :])
        elif self.mode is ReasoningMode.OPEN:
            reasoning, content = _split_after_start(text)
        else:
            return None, text
        return reasoning, content


class ReasoningStreamParser:
    """Streaming parser: `feed(delta) -> (reasoning_delta, content_delta)`, then `finish()`.

    The deltas concatenate to what `ReasoningParser(mode).parse` returns for the whole text
    (reasoning None there corresponds to an empty concatenation here).
    """

    _START = "start"  # undecided: only whitespace / a prefix of <think> seen so far
    _REASONING = "reasoning"
    _CONTENT_START = "content_start"  # just after </think>: skipping whitespace
    _CONTENT = "content"

    def __init__(self, mode: ReasoningMode | str = ReasoningMode.AUTO):
        self.mode = ReasoningMode(mode)
        self._state = self._CONTENT if self.mode is ReasoningMode.OFF else self._START
        self._buf = ""
        self._saw_reasoning = False

    @property
    def saw_reasoning(self) -> bool:
        """True once the output has been found to contain a reasoning part."""
        return self._saw_reasoning

    def feed(self, delta: str) -> tuple[str, str]:
        self._buf += delta
        reasoning: list[str] = []
        content: list[str] = []
        while self._buf:
            if self._state == self._START:
                stripped = self._buf.lstrip()
                if stripped.startswith(THINK_START):
                    self._buf = stripped[len(THINK_START) :]
                    self._enter_reasoning()
                elif THINK_START.startswith(stripped):
                    break  # whitespace and maybe a partial <think>: wait for more
                elif self.mode is ReasoningMode.OPEN:
                    self._enter_reasoning()
                else:
                    self._state = self._CONTENT
            elif self._state == self._REASONING:
                end = self._buf.find(THINK_END)
                if end >= 0:
                    reasoning.append(self._buf[:end])
                    self._buf = self._buf[end + len(THINK_END) :]
                    self._state = self._CONTENT_START
                    continue
                hold = partial_tag_suffix(self._buf, THINK_END)
                reasoning.append(self._buf[: len(self._buf) - hold])
                self._buf = self._buf[len(self._buf) - hold :]
                break
            elif self._state == self._CONTENT_START:
                self._buf = self._buf.lstrip()
                if self._buf:
                    self._state = self._CONTENT
            else:
                content.append(self._buf)
                self._buf = ""
        return "".join(reasoning), "".join(content)

    def _enter_reasoning(self) -> None:
        self._state = self._REASONING
        self._saw_reasoning = True

    def finish(self) -> tuple[str, str]:
        """Flush what was held back; call once at the end of the output."""
        buf, self._buf = self._buf, ""
        if self._state == self._REASONING:
            return buf, ""
        if self._state == self._START and self.mode is ReasoningMode.OPEN:
            self._enter_reasoning()
            return buf, ""
        if self._state == self._CONTENT_START:
            return "", ""
        return "", buf
