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
