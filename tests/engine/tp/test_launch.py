"""free_port and spawn_ranks: results in rank order, errors and hangs become RankFailed."""

from __future__ import annotations

import socket
import time

import pytest
import torch.distributed as dist

from tpserve.engine.tp.launch import RankFailed, free_port, spawn_ranks


def test_free_port_can_be_bound():
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def _echo(rank: int, world: int, tag: str) -> tuple:
    return tag, rank, world, dist.get_rank(), dist.get_world_size(), dist.get_backend()


def _fail_on_last(rank: int, world: int) -> None:
    if rank == world - 1:
        raise ValueError("boom from the last rank")
    dist.barrier()  # would block forever without the failing rank


def _hang(rank: int, world: int) -> None:
    time.sleep(3600)


def test_spawn_ranks_returns_results_in_rank_order():
    assert spawn_ranks(_echo, 2, "x", timeout=120) == [("x", 0, 2, 0, 2, "gloo"),
                                                       ("x", 1, 2, 1, 2, "gloo")]


def test_a_failing_rank_raises_with_its_traceback_and_stops_the_others():
    start = time.monotonic()
    with pytest.raises(RankFailed, match="boom from the last rank") as info:
        spawn_ranks(_fail_on_last, 2, timeout=120)
    assert "rank 1" in str(info.value) and "ValueError" in str(info.value)
    assert time.monotonic() - start < 60


def test_timeout_kills_the_ranks():
    start = time.monotonic()
    with pytest.raises(RankFailed, match="timed out"):
        spawn_ranks(_hang, 1, timeout=4)
    assert time.monotonic() - start < 20


def test_bad_arguments():
    with pytest.raises(ValueError):
        spawn_ranks(_echo, 0, "x")
    with pytest.raises(ValueError):
        spawn_ranks(_echo, 1, "x", backend="mpi")


def _env(rank: int, world: int) -> tuple:
    import os

    return os.environ.get("TPSERVE_LAUNCH_PROBE"), os.environ.get("TPSERVE_LAUNCH_CHILD"), os.getppid()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_ranks_see_the_environment_as_it_is_when_they_start(method, monkeypatch):
    """Both start methods give each rank the parent's environment at start, with `env` on top: a fork server
    started before a variable was set still passes it (its own environment is older). Fork-server ranks are its
    children, not ours. (Spawn: one rank, an interpreter's start is the cost.)"""
    import os

    monkeypatch.setenv("TPSERVE_MP_START", method)
    world = 1 if method == "spawn" else 2
    if method == "forkserver":
        spawn_ranks(_echo, 1, "start the fork server", timeout=120)
    monkeypatch.setenv("TPSERVE_LAUNCH_PROBE", method)
    got = spawn_ranks(_env, world, env={"TPSERVE_LAUNCH_CHILD": "yes"}, timeout=120)
    assert [g[:2] for g in got] == [(method, "yes")] * world and "TPSERVE_LAUNCH_CHILD" not in os.environ
    assert all((ppid == os.getpid()) == (method == "spawn") for *_, ppid in got)


def test_an_unknown_start_method_is_refused(monkeypatch):
    monkeypatch.setenv("TPSERVE_MP_START", "fork")
    with pytest.raises(ValueError, match="TPSERVE_MP_START must be one of spawn, forkserver, got 'fork'"):
        spawn_ranks(_echo, 1, "x", timeout=10)
