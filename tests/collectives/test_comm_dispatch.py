"""Communicator.run's dispatch to a workspace, checked with fake workspaces (no GPU, no peers):
a "chunked" all-gather / reduce-scatter must ask the CUDA workspace for its pipelined kernel even
where the tensor fits one slot (the bench and the tuner time that backend under that name), and
the bench's CUDA-graph check must capture those pipelined paths too."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tpserve.tools.bench import collectives_rank as workspace_bench
from tpserve.collectives.comm import Communicator

FITS = 1000  # elements the fake workspaces carry in one round


class FakeWorkspace:
    """Records each call's method and keyword arguments; returns its input."""

    topology = "mesh"

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def supports(self, x: torch.Tensor) -> bool:
        return True

    def fits(self, op: str, x: torch.Tensor) -> bool:
        return x.numel() <= FITS

    def all_reduce(self, x: torch.Tensor, **kw) -> torch.Tensor:
        self.calls.append(("all_reduce", kw))
        return x

    def all_gather(self, x: torch.Tensor, dim: int = 0, **kw) -> torch.Tensor:
        self.calls.append(("all_gather", kw))
        return x

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0, **kw) -> torch.Tensor:
        self.calls.append(("reduce_scatter", kw))
        return x


class FakePeerWorkspace(FakeWorkspace):
    """Like the CUDA PeerWorkspace: it has a pipelined all-reduce (and a `pipelined` switch on
    all-gather / reduce-scatter)."""

    def all_reduce_chunked(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(("all_reduce_chunked", {}))
        return x


def _comm(ws: FakeWorkspace) -> Communicator:
    comm = Communicator.__new__(Communicator)  # no process group: only the dispatch is tested
    comm.rank, comm.world_size, comm.device = 0, 2, torch.device("cpu")
    comm._ws, comm._symm, comm.table = ws, None, None
    return comm


@pytest.mark.parametrize("numel", [64, 5 * FITS], ids=["fits_a_slot", "larger_than_a_slot"])
def test_chunked_all_gather_and_reduce_scatter_run_the_pipelined_kernel(numel):
    ws = FakePeerWorkspace()
    comm = _comm(ws)
    x = torch.ones(numel)
    for op in ("all_gather", "reduce_scatter"):
        assert "chunked" in comm.available_backends(op, x)
        ws.calls.clear()
        comm.run(op, x, "chunked")
        assert ws.calls == [(op, {"pipelined": True})]
        if numel <= FITS:  # the one-round kernel stays the one-round kernel
            ws.calls.clear()
            comm.run(op, x, "oneshot")
            assert ws.calls == [(op, {})]
    ws.calls.clear()
    comm.run("all_reduce", x, "chunked")
    assert ws.calls == [("all_reduce_chunked", {})]


def test_cpu_workspace_gets_no_pipelined_switch():
    """The CPU workspace pipelines every call; its methods take no `pipelined` argument."""
    ws = FakeWorkspace()
    comm = _comm(ws)
    ran = 0
    for numel in (64, 5 * FITS):
        for op in ("all_gather", "reduce_scatter"):
            for backend in ("oneshot", "chunked"):
                if backend in comm.available_backends(op, torch.ones(numel)):
                    ws.calls.clear()
                    comm.run(op, torch.ones(numel), backend)
                    assert ws.calls == [(op, {})]
                    ran += 1
    assert ran >= 4  # chunked at both sizes for both ops at least


def test_graph_check_captures_the_pipelined_all_gather_and_reduce_scatter(monkeypatch):
    """_graph_check (CUDA only) run on CPU at world 1 with the graph capture faked: the paths it
    captures include "chunked" (pipelined) all-gather and reduce-scatter, and it finds no fault
    in an identity communicator."""

    class Recorder:
        world_size, rank = 1, 0
        _ws = object()  # no fused kernels

        def __init__(self) -> None:
            self.seen: set[tuple[str, str]] = set()

        def run(self, op: str, x: torch.Tensor, backend: str, dim: int = 0) -> torch.Tensor:
            self.seen.add((op, backend))
            return x  # world 1: every collective is the identity; aliasing stands in for replay

    class FakeGraph:
        def replay(self) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    comm = Recorder()
    assert workspace_bench._graph_check(comm, torch.device("cpu"), 4096) == []
    assert {("all_gather", "chunked"), ("reduce_scatter", "chunked"),
            ("all_gather", "oneshot"), ("reduce_scatter", "oneshot"),
            ("all_reduce", "chunked")} <= comm.seen
