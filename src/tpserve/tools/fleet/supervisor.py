"""The fleet: N replicas behind the router. It boots them (the first alone when snapshots are on, so the
others restore its snapshot instead of each writing one), adds each to the router once it is healthy and
warmed up, replaces a replica that dies while the others serve, and runs rolling restarts one replica at
a time: out of the router, drain, restart (from the weight snapshot), healthy, warm-up, back in."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from tpserve.tools.fleet import replica as rep
from tpserve.tools.fleet.replica import Replica, ReplicaError
from tpserve.tools.fleet.router import RouterError

log = logging.getLogger("tpserve.fleet")
REMOVE_GRACE_S = 0.5  # after the router drops a replica: requests it had just picked the replica for arrive
MAX_BACKOFF_S = 30.0


class Fleet:
    def __init__(self, replicas: list[Replica], router, argv_for: Callable[[Replica], list[str]], env: dict,
                 *, api_key: str | None, drain_timeout: float, start_timeout: float,
                 remote_urls: list[str] = (), snapshot_first: bool = True):
        self.replicas, self.router, self.argv_for, self.env = replicas, router, argv_for, env
        self.api_key, self.drain_timeout, self.start_timeout = api_key, drain_timeout, start_timeout
        self.remote_urls, self.snapshot_first = list(remote_urls), snapshot_first
        self.stopping, self.started = threading.Event(), threading.Event()
        self._rolling = threading.Lock()
        self.last_roll: dict = {"running": False}

    # ------------------------------------------------------------------ boot and run
    def start(self) -> None:
        self.router.start()
        log.info("router listening on %s:%d (policy %s)", self.router.host, self.router.port, self.router.policy)
        first = self.replicas[:1] if self.snapshot_first else self.replicas
        self._boot(first)
        self._boot([r for r in self.replicas if r not in first])
        for url in self.remote_urls:
            self.router.add(url, wait=False)  # the router health-checks it and routes to it once it answers
            log.info("remote replica %s registered with the router", url)
        self.started.set()

    def _boot(self, group: list[Replica]) -> None:
        for r in group:
            rep.start(r, self.argv_for(r), self.env)
        for r in group:
            self._join(r)

    def _join(self, r: Replica) -> None:
        """Wait for a started replica's /health, warm it up and add it to the router."""
        t0 = time.monotonic()
        rep.wait_healthy(r, self.start_timeout, self.stopping)
        rep.warm_up(r, self.api_key)
        self.router.add(r.url)
        r.state = "serving"
        log.info("replica %d (pid %d, %s%s) in rotation, %.1f s after its start", r.index, r.proc.pid, r.url,
                 f", GPUs {','.join(r.gpus)}" if r.gpus else "", time.monotonic() - t0)

    def run(self) -> None:
        """Watch the router and the replicas until stop(): a dead one is restarted while the others serve."""
        while not self.stopping.wait(0.5):
            if not self.router.alive():
                self._restart_router()
            for r in self.replicas:
                if r.state in ("serving", "failed") and not r.alive() and r.busy.acquire(blocking=False):
                    threading.Thread(target=self._replace, args=(r,), name=f"replace-{r.index}", daemon=True).start()

    def _replace(self, r: Replica) -> None:
        try:
            code = r.proc.returncode if r.proc else None
            if r.state == "serving":
                log.error("replica %d (pid %s) exited with code %s: out of rotation, restarting it", r.index,
                          r.proc.pid if r.proc else None, code)
            r.state = "failed"
            try:
                self.router.remove(r.url)
            except RouterError as exc:
                log.warning("replica %d: %s", r.index, exc)
            rep.kill(r)  # its TP ranks, if any outlived it
            backoff = 1.0
            while not self.stopping.is_set():
                try:
                    self._restart(r)
                    return
                except (ReplicaError, RouterError) as exc:
                    log.error("replica %d: restart failed (%s); next try in %.0f s", r.index, exc, backoff)
                    rep.stop(r, 5.0)
                    if self.stopping.wait(backoff):
                        return
                    backoff = min(2 * backoff, MAX_BACKOFF_S)
        finally:
            r.busy.release()

    def _restart(self, r: Replica) -> None:
        rep.start(r, self.argv_for(r), self.env)
        r.restarts += 1
        self._join(r)

    def _restart_router(self) -> None:
        log.error("the router exited (code %s): restarting it", self.router.proc.returncode)
        try:
            self.router.start()
            for r in self.replicas:
                if r.state == "serving":
                    self.router.add(r.url, wait=False)
            for url in self.remote_urls:
                self.router.add(url, wait=False)
            log.info("router back on %s:%d", self.router.host, self.router.port)
        except RouterError as exc:
            log.error("router restart failed: %s", exc)

    # ------------------------------------------------------------------ rolling restart
    def rolling_restart(self, reason: str) -> bool:
        """Start a rolling restart in the background; False while the fleet starts or one is already running."""
        if not self.started.is_set():
            log.warning("rolling restart (%s) refused: the fleet is still starting", reason)
            return False
        if not self._rolling.acquire(blocking=False):
            log.warning("rolling restart (%s) refused: one is already running", reason)
            return False
        self.last_roll = {"running": True, "reason": reason, "started_at": time.time(), "restarted": [],
                          "error": None}
        threading.Thread(target=self._roll, args=(reason,), name="rolling-restart", daemon=True).start()
        return True

    def _roll(self, reason: str) -> None:
        t0 = time.monotonic()
        log.info("rolling restart (%s): %d replicas, one at a time", reason, len(self.replicas))
        try:
            for r in self.replicas:
                if self.stopping.is_set():
                    raise RuntimeError("the fleet is shutting down")
                with r.busy:
                    self._roll_one(r)
                self.last_roll["restarted"].append(r.index)
            log.info("rolling restart (%s) done: %d replicas restarted in %.1f s", reason, len(self.replicas),
                     time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001 - reported in the log and /admin/replicas
            self.last_roll["error"] = str(exc)
            log.error("rolling restart (%s) stopped: %s", reason, exc)
        finally:
            self.last_roll.update(running=False, finished_at=time.time())
            self._rolling.release()

    def _roll_one(self, r: Replica) -> None:
        t0, old_pid = time.monotonic(), r.proc.pid if r.proc else None
        r.state = "draining"
        try:
            self.router.remove(r.url)
        except RouterError:
            r.state = "serving"  # still running: a restarted router takes it back
            raise
        log.info("replica %d (pid %s): out of rotation; draining its running requests (up to %.0f s)", r.index,
                 old_pid, self.drain_timeout)
        time.sleep(REMOVE_GRACE_S)
        code = rep.stop(r, self.drain_timeout + 10.0)
        log.info("replica %d: stopped (exit code %s) %.1f s after leaving the router; restarting it", r.index,
                 code, time.monotonic() - t0)
        try:
            self._restart(r)
        except (ReplicaError, RouterError):
            r.state = "failed"  # the watch loop keeps trying it; the roll goes no further
            raise
        log.info("replica %d restarted (pid %s -> %d) in %.1f s", r.index, old_pid, r.proc.pid,
                 time.monotonic() - t0)

    # ------------------------------------------------------------------ status and shutdown
    def status(self) -> dict:
        return {"router": {"url": self.router.local_url, "policy": self.router.policy, "alive": self.router.alive(),
                           "pid": self.router.proc.pid if self.router.proc else None},
                "replicas": [r.info() for r in self.replicas], "remote": self.remote_urls,
                "rolling_restart": dict(self.last_roll, restarted=list(self.last_roll.get("restarted", ())))}

    def serving(self) -> int:
        return sum(r.state == "serving" and r.alive() for r in self.replicas)

    def shutdown(self) -> None:
        """The router first (it stops accepting and lets running requests finish), then the replicas."""
        self.stopping.set()
        self.router.stop(self.drain_timeout + 5.0)
        for r in self.replicas:
            if r.alive():
                r.proc.terminate()
        for r in self.replicas:
            rep.stop(r, self.drain_timeout + 10.0)
            r.state = "stopped"
        log.info("fleet stopped")
