"""AsyncEngine: the LLMEngine stepped by a background thread, with one asyncio stream per request.

`add` validates and queues a request at once (so bad input fails before any response starts)
and returns a RequestStream; iterating it yields cumulative RequestOutputs. Leaving the
iteration early (a client that went away) aborts the request and frees its cache.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time

from tpserve.engine.engine import LLMEngine
from tpserve.engine.executor import EngineDeadError
from tpserve.engine.outputs import RequestOutput
from tpserve.engine.prefix_cache import check_cache_salt
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
    """Only the engine thread touches the LLMEngine; the event loop sends it commands (add, abort)
    through a queue, so a busy engine never blocks the server."""

    def __init__(self, engine: LLMEngine, max_waiting: int = 1024):
        self.engine, self.max_waiting = engine, max_waiting
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}
        self._queued = 0  # adds sent but not yet taken by the engine thread (under _count_lock)
        self._count_lock = threading.Lock()
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
            prompt: str | None = None, cache_salt: str | None = None) -> RequestStream:
        """Validate and queue a request (raises ValueError / QueueFullError / EngineDeadError at once)."""
        if self.dead_reason:
            raise EngineDeadError(self.dead_reason)
        if len(self.engine.scheduler.waiting) + self._queued >= self.max_waiting:
            raise QueueFullError(f"the server is busy: {self.max_waiting} requests are already waiting; "
                                 "retry later")
        self.engine.validate_request(prompt_token_ids, params)
        check_cache_salt(cache_salt)
        stream = RequestStream(self, request_id, asyncio.get_running_loop())
        self._streams[request_id] = stream
        with self._count_lock:
            self._queued += 1
        self._commands.put(("add", (request_id, prompt_token_ids, params, prompt, False, cache_salt)))
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._commands.put(("abort", request_id))
        self._wake.set()

    def stats(self) -> dict:
        return self.engine.stats()

    async def reset_prefix_cache(self) -> bool:
        """LLMEngine.reset_prefix_cache, run by the engine thread between steps."""
        future = asyncio.get_running_loop().create_future()
        self._commands.put(("reset_prefix_cache", future))
        self._wake.set()
        return await future

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)
        self.engine.shutdown()

    # ------------------------------------------------------------ the thread
    def _drain_commands(self) -> None:
        while True:
            try:
                cmd, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd == "abort":
                self.engine.abort(arg)
                continue
            if cmd == "reset_prefix_cache":
                done = self.engine.reset_prefix_cache()
                arg.get_loop().call_soon_threadsafe(arg.set_result, done)
                continue
            with self._count_lock:
                self._queued -= 1
            rid = arg[0]
            stream = self._streams.get(rid)
            if stream is None:  # aborted before it was added
                continue
            try:
                self.engine.add_request(*arg)
            except Exception as exc:  # noqa: BLE001 - handed to the waiting client
                self._streams.pop(rid, None)
                stream.push(exc)

    def _loop(self) -> None:
        while not self._stopping:
            self._drain_commands()
            if not self.engine.has_unfinished():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                self._check_workers()
                continue
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
                        self._streams.pop(out.request_id, None)

    def _check_workers(self) -> None:
        try:
            self.engine.executor.check_alive()
        except EngineDeadError as exc:
            self.engine.dead = str(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for stream in list(self._streams.values()):
            stream.push(exc)
        self._streams.clear()
