"""One line of an OpenAI-style SSE stream, read the same way by every client tool."""

from __future__ import annotations

import json


class SseError(ValueError):
    """A line that breaks the stream (the message says how)."""


def sse_event(line: str, done: bool) -> tuple[str, dict | None]:
    """-> ("skip", None) for blank lines and comments / fields other than data, ("done", None) for
    `data: [DONE]`, ("chunk", parsed JSON) otherwise; SseError for data after [DONE], a line that is
    not SSE, or an event that is not JSON."""
    if not line.strip():
        return "skip", None
    if done:
        raise SseError(f"data after [DONE]: {line[:80]!r}")
    if not line.startswith("data:"):
        if line.startswith((":", "event:", "id:", "retry:")):
            return "skip", None
        raise SseError(f"broken SSE stream, line {line[:80]!r}")
    data = line[5:].strip()
    if data == "[DONE]":
        return "done", None
    try:
        return "chunk", json.loads(data)
    except ValueError:
        raise SseError(f"broken SSE stream, undecodable event {data[:80]!r}") from None
