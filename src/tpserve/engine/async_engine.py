"""AsyncEngine: the LLMEngine stepped by a background thread, with one asyncio stream per request.

`add` validates and queues a request at once (so bad input fails before any response starts)
and returns a RequestStream; iterating it yields cumulative RequestOutputs. Leaving the
iteration early (a client that went away) aborts the request and frees its cache.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from tpserve.engine.engine import LLMEngine
from tpserve.engine.executor import EngineDeadError
from tpserve.engine.outputs import RequestOutput
from tpserve.sampling_params import SamplingParams

log = logging.getLogger("tpserve.async")


class QueueFullError(RuntimeError):
    """The waiting queue is at its limit (the server answers 503)."""


class RequestStream:
    def __init__(self, engine: "AsyncEngine", request_id: str, loop: asyncio.AbstractEventLoop):
        self.engine, self.request_id, self.loop = engine, request_id, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False
        self.arrival = time.monotonic()

    def push(self, item: RequestOutput | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    async def __aiter__(self):
        try:
            while True:
                item = await self.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    self.finished = True
                yield item
                if item.finished:
                    return
        finally:
            if not self.finished:
                self.engine.abort(self.request_id)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_waiting: int = 1024):
        self.engine, self.max_waiting = engine, max_waiting
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="tpserve-engine", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- public
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def dead_reason(self) -> str | None:
        reason = self.engine.dead or getattr(self.engine.executor, "dead_reason", None)
        if reason is None and not self._thread.is_alive() and not self._stopping:
            reason = "engine thread stopped"
        return reason

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
            prompt: str | None = None) -> RequestStream:
        if self.dead_reason:
            raise EngineDeadError(self.dead_reason)
        stream = RequestStream(self, request_id, asyncio.get_running_loop())
        with self._lock:
            if len(self.engine.scheduler.waiting) >= self.max_waiting:
                raise QueueFullError(f"the server is busy: {self.max_waiting} requests are already waiting; "
                                     "retry later")
            self.engine.add_request(request_id, prompt_token_ids, params, prompt)
            self._streams[request_id] = stream
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)
            self.engine.abort(request_id)

    def stats(self) -> dict:
        with self._lock:
            return self.engine.stats()

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)
        self.engine.shutdown()

    # ------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while not self._stopping:
            if not self.engine.has_unfinished():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                self._check_workers()
                continue
            with self._lock:
                try:
                    outputs = self.engine.step()
                except EngineDeadError as exc:
                    self._fail_all(exc)
                    return
                except Exception as exc:  # a bug in a step: the engine cannot go on safely
                    log.exception("engine step failed")
                    self.engine.dead = f"engine step failed: {exc}"
                    self._fail_all(EngineDeadError(self.engine.dead))
                    return
                for out in outputs:
                    stream = self._streams.get(out.request_id)
                    if stream is not None:
                        stream.push(out)
                        if out.finished:
                            del self._streams[out.request_id]

    def _check_workers(self) -> None:
        try:
            self.engine.executor.check_alive()
        except EngineDeadError as exc:
            self.engine.dead = str(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for stream in self._streams.values():
            stream.push(exc)
        self._streams.clear()
