"""Start one process per rank on this machine (tests, `tpserve bench/tune collectives`).

`spawn_ranks(fn, world_size, *args)` starts `world_size` fresh interpreters (the spawn start
method: no inherited CUDA state; `mp_context`), initialises torch.distributed in each over a tcp:// address on a
free loopback port, runs `fn(rank, world_size, *args)` and returns the ranks' return values in
rank order. An exception in any rank is re-raised here as `RankFailed` carrying that rank's
traceback; the other ranks are killed at once (they would block in their next collective). A
rank that dies without reporting (killed, segfault) and the overall `timeout` are errors too, so
a caller never hangs forever.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import time
import traceback
from typing import Any, Callable

DEFAULT_TIMEOUT_S = 600.0
START_METHODS = ("spawn", "forkserver")
PRELOAD = ["torch", "tpserve.engine.engine"]  # what a fork server imports once for every rank it starts


class RankFailed(RuntimeError):
    """A rank raised, died or timed out; the message holds what each failing rank reported."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that the OS reports free right now (bind to port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def mp_context():
    """The multiprocessing context ranks start in (here and engine/tp/executor.py): "spawn", fresh interpreters
    (the default), or with TPSERVE_MP_START=forkserver forks of a server process that imported PRELOAD once, so a
    rank starts in milliseconds instead of the seconds an import of torch takes (the CPU test suite sets it).
    A fork server's children start with its environment: ranks apply the parent's (`set_environ`)."""
    import torch.multiprocessing as mp

    method = os.environ.get("TPSERVE_MP_START", "spawn")
    if method not in START_METHODS:
        raise ValueError(f"TPSERVE_MP_START must be one of {', '.join(START_METHODS)}, got {method!r}")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)  # (no effect once the server runs)
    return ctx


def set_environ(environ: dict[str, str]) -> None:
    """A rank's environment made the parent's as it was when the rank started (what spawn gives)."""
    if environ != os.environ:
        os.environ.clear()
        os.environ.update(environ)


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, port: int, backend: str,
               timeout_s: float, results: Any, args: tuple, environ: dict[str, str]) -> None:
    """Body of one rank's process: init, run, report, tear down."""
    set_environ(environ)
    try:
        import torch
        import torch.distributed as dist

        kwargs: dict[str, Any] = {}
        if backend == "nccl":
            torch.cuda.set_device(rank)
            kwargs["device_id"] = torch.device("cuda", rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        results.put((rank, "error", f"init_process_group failed:\n{traceback.format_exc()}"))
        return
    try:
        value = fn(rank, world_size, *args)
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001
        results.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the result is already reported
            pass


def spawn_ranks(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
                timeout: float = DEFAULT_TIMEOUT_S, env: dict[str, str] | None = None) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` processes; return their results.

    `fn` and `args` must be picklable (a module-level function). `backend` is "gloo" (CPU) or
    "nccl" (one GPU per rank, GPU `rank`). `env` entries are set in the children only.
    """
    if world_size < 1:
        raise ValueError(f"spawn_ranks: world_size must be >= 1, got {world_size}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"spawn_ranks: backend must be 'gloo' or 'nccl', got {backend!r}")
    if timeout <= 0:
        raise ValueError(f"spawn_ranks: timeout must be > 0, got {timeout}")
    ctx = mp_context()
    results = ctx.Queue()
    port = free_port()
    saved = {k: os.environ.get(k) for k in (env or {})}
    procs = []
    try:
        os.environ.update(env or {})
        environ = dict(os.environ)
        for rank in range(world_size):
            proc = ctx.Process(target=_rank_main, name=f"tpserve-rank{rank}", daemon=True,
                               args=(fn, rank, world_size, port, backend, timeout, results, args, environ))
            proc.start()
            procs.append(proc)
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
    ok = False
    try:
        values = _collect(procs, results, world_size, timeout)
        ok = True
        return values
    finally:
        _stop(procs, grace=5.0 if ok else 0.0)
        results.close()


def _collect(procs: list, results: Any, world_size: int, timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    values: dict[int, Any] = {}
    errors: dict[int, str] = {}
    exit_seen: dict[int, float] = {}
    while len(values) + len(errors) < world_size:
        try:
            rank, status, payload = results.get(timeout=0.05)
            if status == "ok":
                values[rank] = payload
            else:
                errors[rank] = payload
                break  # the others are probably blocked in a collective: stop them now
            continue
        except queue.Empty:
            pass
        now = time.monotonic()
        for rank, proc in enumerate(procs):
            if rank in values or rank in errors or proc.is_alive():
                continue
            # exited without a result yet: give the queue's feeder a moment to deliver it
            first = exit_seen.setdefault(rank, now)
            if now - first > 2.0:
                errors[rank] = f"process exited with code {proc.exitcode} without reporting"
        if errors:
            break
        if now > deadline:
            missing = [r for r in range(world_size) if r not in values]
            raise RankFailed(f"spawn_ranks: timed out after {timeout:.0f}s waiting for rank(s) "
                             f"{missing}; killed all ranks")
    if errors:  # a short grace period: the first error may be an echo of another rank's
        grace = time.monotonic() + 1.0
        while len(values) + len(errors) < world_size and time.monotonic() < grace:
            try:
                rank, status, payload = results.get(timeout=0.05)
            except queue.Empty:
                continue
            if status != "ok":
                errors[rank] = payload
        text = "\n".join(f"--- rank {r} ---\n{msg}" for r, msg in sorted(errors.items()))
        raise RankFailed(f"spawn_ranks: {len(errors)} rank(s) failed:\n{text}")
    return [values[r] for r in range(world_size)]


def _stop(procs: list, grace: float) -> None:
    """Join ranks that finish within `grace` seconds; terminate, then kill, the rest."""
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=2.0)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=2.0)
