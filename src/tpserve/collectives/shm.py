"""CPU workspace memory: one POSIX shared-memory segment per rank, mapped by every rank.

Layout of each rank's segment (all offsets in bytes):

    [0, 4096)            header, int64 words: 0 barrier counter ("seq"), 1 pid,
                         2 pid-namespace inode, 3 abort flag, from FLAG_WORDS on: the per-slot
                         sequence flags of the workspace protocol (workspace.py)
    [4096, 4096 + D)     the data area of D bytes (cut into slots by workspace.py)

Creation (collective): group rank 0 draws a random name and broadcasts it; every rank creates
`/dev/shm/tpserve-ws-<name>-<rank>-<pid>` (O_EXCL, mode 0600, space reserved up front) and maps
it; after all ranks agree that creation worked, each maps its peers' segments; after all agree
that mapping worked, each rank unlinks its own segment at once. From then on the memory lives
only as long as the mappings, so nothing is left in /dev/shm even if a process is killed later.
A process killed inside that short window leaves its name behind: creation first removes such
names whose creator pid is gone. Any failure on any rank makes every rank clean up and raise
`WorkspaceUnavailable` (the Communicator then falls back to gloo).

Flags: each rank only ever writes its own header and only reads its peers'. `publish(word, v)`
stores v into the own header; `wait(peer, word, v)` returns once the peer's word is >= v (every
flag only grows). `barrier()` is the special case: bump word 0 and wait for every peer's.
A rank may map only some peers (`peers`; the ring topology maps its two neighbours), and then
touching any other peer's memory fails loudly instead of working by accident. Data written before
the barrier is visible to a peer that has seen the counter: x86-64 keeps stores in order (TSO)
and loads in order, and every write goes through a separate C call the compiler cannot reorder
with the counter store; other architectures are refused for that reason (no portable fence is
reachable from Python). Waiting spins for a few microseconds, then yields the CPU, then sleeps in
short naps, so three ranks on two cores still make progress. A wait gives up with an error when
the peer process has exited (checked by pid every few milliseconds), when the peer gave up itself
(its abort flag), when `abort()` was called here (e.g. by a watchdog thread), or after
`timeout_s`; giving up sets this rank's abort flag so its peers stop waiting too.
"""

from __future__ import annotations

import mmap
import os
import platform
import secrets
import time

import numpy as np
import torch

from tpserve.collectives.workspace_group import GroupOps

HEADER_BYTES = 4096
SHM_DIR = "/dev/shm"
NAME_PREFIX = "tpserve-ws-"
_SEQ, _PID, _PIDNS, _ABORT = 0, 1, 2, 3
FLAG_WORDS = 8                    # first header word free for the workspace's flags
HEADER_WORDS = HEADER_BYTES // 8
_SPIN_SECONDS = 50e-6      # busy-poll this long,
_YIELD_SECONDS = 0.002     # then sched_yield until this long, then nap
_NAP_SECONDS = 50e-6
_LIVENESS_SECONDS = 0.005  # how often a long wait checks that the peer still lives
_STALE_SECONDS = 60.0      # a leftover name older than this with a dead creator is removed
_TSO_MACHINES = ("x86_64", "amd64", "i386", "i686", "x86")


class WorkspaceUnavailable(RuntimeError):
    """The workspace could not be built on every rank; use the process group's collectives."""


class PeerLost(RuntimeError):
    """A peer exited or gave up while this rank waited for it in a workspace collective."""


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def reap_stale_segments(now: float | None = None) -> list[str]:
    """Remove leftover segment names whose creating process is gone; returns what was removed."""
    removed = []
    now = time.time() if now is None else now
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(NAME_PREFIX)]
    except OSError:
        return removed
    for name in names:
        try:
            pid = int(name.rsplit("-", 1)[1])
            path = os.path.join(SHM_DIR, name)
            if now - os.stat(path).st_mtime > _STALE_SECONDS and not _pid_alive(pid):
                os.unlink(path)
                removed.append(name)
        except (ValueError, IndexError, OSError):
            continue
    return removed


class ShmSegments:
    """Every rank's shared-memory segment, mapped here, plus the flag barrier over them."""

    def __init__(self, ops: GroupOps, data_bytes: int, *, timeout_s: float = 300.0,
                 peers: set[int] | None = None):
        """`data_bytes`: the data area per rank; `peers`: the ranks whose segments this rank maps
        (None: all)."""
        if data_bytes < 64 or data_bytes % 64:
            raise ValueError(f"data_bytes must be a positive multiple of 64, got {data_bytes}")
        self.rank, self.world_size = ops.rank, ops.world_size
        self.data_bytes = data_bytes
        self.mapped = set(range(self.world_size)) if peers is None else set(peers) | {self.rank}
        self.timeout_s = float(timeout_s)
        self.seq = 0
        self._aborted = ""
        self._maps: list[mmap.mmap | None] = [None] * self.world_size
        self.flags: list[np.ndarray | None] = []
        self.data: list[torch.Tensor | None] = []
        total = HEADER_BYTES + data_bytes
        token = ops.broadcast_ints([secrets.randbits(62)])[0]
        pids = [p for (p,) in ops.all_gather_ints([os.getpid()])]
        self.paths = [os.path.join(SHM_DIR, f"{NAME_PREFIX}{token:016x}-{r}-{pid}")
                      for r, pid in enumerate(pids)]
        reason = ""
        created = False
        try:
            if platform.machine().lower() not in _TSO_MACHINES:
                raise WorkspaceUnavailable(f"CPU workspace needs x86 store ordering; this is "
                                           f"{platform.machine()}")
            reap_stale_segments()
            self._maps[self.rank] = self._create(self.paths[self.rank], total)
            created = True
        except Exception as exc:  # noqa: BLE001 - agreed on below
            reason = f"rank {self.rank}: creating {self.paths[self.rank]}: {exc}"
        try:
            ok = ops.agree(created)
            if ok:
                try:
                    for peer in range(self.world_size):
                        if peer != self.rank and peer in self.mapped:
                            self._maps[peer] = self._open(self.paths[peer], total)
                except Exception as exc:  # noqa: BLE001
                    reason = f"rank {self.rank}: mapping peer {peer}'s segment: {exc}"
                    ok = False
                ok = ops.agree(ok)
        finally:
            if created:  # every rank has mapped it (or given up): the name is no longer needed
                try:
                    os.unlink(self.paths[self.rank])
                except FileNotFoundError:
                    pass
        if not ok:
            self.close()
            raise WorkspaceUnavailable(reason or "another rank could not build its workspace")
        for mm in self._maps:
            self.flags.append(None if mm is None else
                              np.frombuffer(mm, dtype=np.int64, count=HEADER_WORDS, offset=0))
            self.data.append(None if mm is None else
                             torch.frombuffer(mm, dtype=torch.uint8, count=data_bytes,
                                              offset=HEADER_BYTES))
        self.flags[self.rank][_PID] = os.getpid()
        self.flags[self.rank][_PIDNS] = _pid_namespace()
        ops.barrier()  # every header is filled in before anyone may wait on it

    @staticmethod
    def _create(path: str, size: int) -> mmap.mmap:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):  # a full /dev/shm fails here, not as SIGBUS later
                os.posix_fallocate(fd, 0, size)
            return mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)

    @staticmethod
    def _open(path: str, size: int) -> mmap.mmap:
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != size:
                raise WorkspaceUnavailable(f"{path} has {os.fstat(fd).st_size} bytes, want {size}")
            return mmap.mmap(fd, size)
        finally:
            os.close(fd)

    # -- synchronisation ----------------------------------------------------------------------
    def publish(self, word: int, value: int) -> None:
        """Store `value` into word `word` of this rank's header (after every earlier write)."""
        if self._aborted:
            raise PeerLost(f"rank {self.rank}: workspace aborted earlier: {self._aborted}")
        self.flags[self.rank][word] = value

    def wait(self, peer: int, word: int, target: int) -> None:
        """Return once word `word` of `peer`'s header is >= target."""
        if peer not in self.mapped:
            raise RuntimeError(f"rank {self.rank} does not map rank {peer}'s workspace")
        self._wait(peer, target, word)

    def barrier(self) -> None:
        """Publish everything written so far; return once every peer has done the same."""
        if self._aborted:
            raise PeerLost(f"rank {self.rank}: workspace aborted earlier: {self._aborted}")
        self.seq += 1
        self.flags[self.rank][_SEQ] = self.seq
        for peer in range(self.world_size):
            if peer != self.rank:
                self._wait(peer, self.seq, _SEQ)

    def abort(self, reason: str = "aborted") -> None:
        """Make current and future waits here (and the peers' waits on this rank) fail. Safe to
        call from another thread, e.g. a watchdog that saw a worker die."""
        self._aborted = self._aborted or reason
        try:
            self.flags[self.rank][_ABORT] = 1
        except IndexError:  # closed already
            pass

    def _wait(self, peer: int, target: int, word: int = _SEQ) -> None:
        flag = self.flags[peer]
        if flag[word] >= target:
            return
        start = time.perf_counter()
        next_check = start + _LIVENESS_SECONDS
        polls = 0
        while flag[word] < target:
            polls += 1
            if polls & 63:
                continue
            now = time.perf_counter()
            elapsed = now - start
            if elapsed < _SPIN_SECONDS:
                continue
            if elapsed < _YIELD_SECONDS:
                os.sched_yield()
            else:
                time.sleep(_NAP_SECONDS)
            if now >= next_check:
                next_check = now + _LIVENESS_SECONDS
                problem = self._peer_problem(peer, flag, elapsed, target, word)
                if problem and flag[word] < target:
                    self.abort(problem)
                    raise PeerLost(f"rank {self.rank}: {problem}")

    def _peer_problem(self, peer: int, flag: np.ndarray, elapsed: float, target: int,
                      word: int = _SEQ) -> str:
        if self._aborted:
            return f"aborted while waiting for rank {peer}: {self._aborted}"
        if flag[_ABORT]:
            return f"rank {peer} gave up on the workspace collectives"
        pid = int(flag[_PID])
        if pid and int(flag[_PIDNS]) == _pid_namespace() and not _pid_alive(pid):
            return f"rank {peer} (pid {pid}) exited during a collective"
        if elapsed > self.timeout_s:
            return (f"rank {peer} did not reach workspace flag {word} = {target} within "
                    f"{self.timeout_s:.0f}s (it is {int(flag[word])}); did all ranks "
                    f"issue the same collectives in the same order?")
        return ""

    def close(self) -> None:
        """Unmap every segment (already unlinked); safe to call twice."""
        self.flags, self.data = [], []
        for i, mm in enumerate(self._maps):
            if mm is None:
                continue
            try:
                mm.close()
            except BufferError:  # a view is still alive somewhere: the GC unmaps it later
                pass
            self._maps[i] = None
