"""Heap statistics and a periodic `malloc_trim(0)` for the server process (Linux / glibc only).

What it is for: RSS is the heap in use plus the free memory glibc keeps in its arenas for reuse
(it gives pages back only from the top of each heap). `malloc_trim(0)` hands every free page of
every arena back to the OS (madvise), so RSS follows the bytes in use after a burst of large
transient allocations. Under `tpserve bench soak` the RSS drift is heap *in use* (the tokenizer's
bounded BPE cache filling up), not free memory kept by malloc, so trimming does not change it;
hence off by default.

Switch: `--malloc-trim-interval SECONDS` on `tpserve serve`, or the environment variable
TPSERVE_MALLOC_TRIM_INTERVAL (also read by servers started in-process: benches, tests).
Default 0 (off). No effect without glibc (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("tpserve.memory")

ENV_TRIM_INTERVAL = "TPSERVE_MALLOC_TRIM_INTERVAL"
DEFAULT_TRIM_INTERVAL_S = 0.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc with malloc_trim and mallinfo2 (2.33+), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None
    return libc


def heap_mib(libc: ctypes.CDLL | None = None) -> dict[str, float] | None:
    """glibc's heap in MiB, all arenas: `in_use` (allocated), `free` (kept by malloc), `mmap`
    (large blocks mapped on their own). None without glibc."""
    libc = libc or glibc()
    if libc is None:
        return None
    m = libc.mallinfo2()
    return {"in_use": m.uordblks / 2**20, "free": m.fordblks / 2**20, "mmap": m.hblkhd / 2**20}


def trim_interval_from_env(default: float = DEFAULT_TRIM_INTERVAL_S) -> float:
    """TPSERVE_MALLOC_TRIM_INTERVAL (seconds, 0: off), else `default`. Raises ValueError if malformed."""
    raw = os.environ.get(ENV_TRIM_INTERVAL)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_TRIM_INTERVAL} must be a number of seconds (0: off), got {raw!r}") from None
    if not value >= 0:
        raise ValueError(f"{ENV_TRIM_INTERVAL} must be >= 0, got {raw!r}")
    return value


class MallocTrimmer:
    """A daemon thread that calls `trim` (glibc's malloc_trim(0)) every `interval` seconds.

    `start()` does nothing when the interval is 0 or there is no glibc. `calls` and `max_seconds`
    say what it did (it runs off the event loop)."""

    def __init__(self, interval: float, trim: Callable[[], object] | None = None):
        if not interval >= 0:
            raise ValueError(f"malloc trim interval must be >= 0 seconds, got {interval}")
        if trim is None and interval > 0:
            libc = glibc()
            trim = (lambda: libc.malloc_trim(0)) if libc is not None else None
        self.interval, self._trim = interval, trim
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.calls, self.max_seconds = 0, 0.0

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> MallocTrimmer:
        if self.interval > 0 and self._trim is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tpserve-malloc-trim", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def trim_now(self) -> None:
        start = time.perf_counter()
        self._trim()
        self.calls += 1
        self.max_seconds = max(self.max_seconds, time.perf_counter() - start)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.trim_now()
            except Exception:  # noqa: BLE001 - never take the server down for a trim
                log.exception("malloc_trim failed; not trimming any more")
                return
