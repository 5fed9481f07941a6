"""The neighbour-only ring all-reduce kernel (workspace_triton_ring.py) run by Triton's CPU
interpreter at world 2, 3 and 4, as test_peer_workspace_interpreter.py runs the mesh kernels: every
rank maps the ranks' POSIX shared-memory segments and hands their addresses to a PeerWorkspace.

Checked: the ring's result is bitwise the mesh kernels' (one-round and pipelined) and the
rank-order float32 sum, on every rank, for odd sizes, a strided view, sizes several times the
workspace (many rounds: every slot reused), float32 / bfloat16 / float16, with ring and mesh calls
interleaved on one workspace (the ring's entry and exit fences). And that a rank touches only its
neighbours: at world 4 each rank maps only its two neighbours' segments and is handed, for the
rank opposite, a private buffer of 0x7F bytes (data 3.4e38, flags "already there"): a read of it
would give wrong sums or skip a wait, a write would change it.
"""

from __future__ import annotations

import hashlib

import pytest
import torch
import torch.distributed as dist

from tpserve.engine.tp.launch import spawn_ranks

WORKSPACE_BYTES = 16 << 10  # small: few programs, many rounds (the interpreter is slow)
POISON = 0x7F


def _skip_without_the_interpreter() -> None:
    """Skip where Triton or its interpreter is unusable (test_peer_workspace_interpreter's probe)."""
    pytest.importorskip("triton")
    from test_peer_workspace_interpreter import _interpreter_works

    problem = _interpreter_works()
    if problem:
        pytest.skip(problem)


def _inputs(case: int, shape: tuple[int, ...], dtype: torch.dtype, world: int) -> list[torch.Tensor]:
    return [torch.randn(shape, generator=torch.Generator().manual_seed(97 * case + r)).to(dtype)
            for r in range(world)]


def _strided(x: torch.Tensor) -> torch.Tensor:
    """A non-contiguous view of x's first even number of elements."""
    return x.view(-1)[: x.numel() // 2 * 2].view(2, -1).t()


def _workspace(rank: int, world: int, neighbours_only: bool):
    from tpserve.collectives.shm import ShmSegments
    from tpserve.collectives.workspace_group import GroupOps
    from tpserve.collectives.workspace_peer import PeerWorkspace, buffer_bytes_for

    torch.set_num_threads(1)
    ops = GroupOps(dist.group.WORLD, torch.device("cpu"))
    nbytes = buffer_bytes_for(WORKSPACE_BYTES)
    peers = {(rank - 1) % world, (rank + 1) % world} if neighbours_only else None
    seg = ShmSegments(ops, nbytes, peers=peers)
    poison = torch.full((nbytes,), POISON, dtype=torch.uint8)  # handed over for unmapped ranks
    ptrs = [d.data_ptr() if d is not None else poison.data_ptr() for d in seg.data]
    ws = PeerWorkspace(rank, world, ptrs, nbytes, torch.device("cpu"), interpret=True,
                       topology="ring" if neighbours_only else "mesh", keepalive=poison)
    return ws, seg, poison


def _ring_vs_mesh(rank: int, world: int) -> dict:
    """Every rank maps every segment: the ring against the mesh kernels and the reference."""
    from test_peer_workspace_interpreter import plain_sum
    from tpserve.collectives.workspace_triton_pipe import PIPE_SLOTS

    ws, seg, _ = _workspace(rank, world, False)
    cap = ws.ring_capacity(torch.bfloat16)
    bad: dict[str, str] = {}
    digests, most_rounds = [], 0
    cases = [(torch.float32, (7,), False), (torch.bfloat16, (5, 3), False),
             (torch.float16, (2 * cap + 1,), False), (torch.bfloat16, (cap + 9,), True),
             (torch.float32, (3, cap + 1), True),
             (torch.bfloat16, (WORKSPACE_BYTES // 2 + 5,), False)]  # larger than the workspace
    for case, (dtype, shape, strided) in enumerate(cases):
        xs = _inputs(case, shape, dtype, world)
        if strided:
            xs = [_strided(x) for x in xs]
        want = plain_sum([x.contiguous() for x in xs])
        x = xs[rank]
        label = f"{dtype} {tuple(x.shape)}{' strided' if strided else ''}"
        one = ws.all_reduce(x, two_shot=world > 2)  # one round where it fits, else pipelined
        before = int(ws.ring_counters[0])
        got = ws.all_reduce(x, ring=True)
        most_rounds = max(most_rounds, int(ws.ring_counters[0]) - before)
        chunked = ws.all_reduce_chunked(x)  # the pipelined mesh kernel, after the ring
        for name, other in (("reference", want), ("mesh", one), ("mesh pipelined", chunked)):
            if got.dtype != dtype or got.shape != other.shape or not torch.equal(got, other):
                bad[f"ring vs {name}: {label}"] = f"got {got.flatten()[:3]} want {other.flatten()[:3]}"
        digests.append(hashlib.sha256(got.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest())
    ring_counters = [int(c) for c in ws.ring_counters]
    error = ws.error_flag()
    seg.close()
    return {"bad": bad, "digests": digests, "rounds": most_rounds, "slots": PIPE_SLOTS,
            "error": error, "ring_counters": ring_counters}


def _neighbours_only(rank: int, world: int) -> dict:
    """Each rank maps only its neighbours; the opposite rank's address is a poisoned buffer."""
    from test_peer_workspace_interpreter import plain_sum
    from tpserve.config import EngineConfig
    from tpserve.collectives.comm import Communicator

    ws, seg, poison = _workspace(rank, world, True)
    cap = ws.ring_capacity(torch.bfloat16)
    bad: dict[str, str] = {}
    cases = [(torch.bfloat16, (4 * cap + 7,), False), (torch.float32, (2, 33), True),
             (torch.float16, (11,), False)]
    for case, (dtype, shape, strided) in enumerate(cases):
        xs = _inputs(100 + case, shape, dtype, world)
        if strided:
            xs = [_strided(x) for x in xs]
        got = ws.all_reduce(xs[rank])  # a ring workspace: the ring by default
        want = plain_sum([x.contiguous() for x in xs])
        if got.shape != want.shape or not torch.equal(got, want):
            bad[f"{dtype} {shape}"] = f"got {got.flatten()[:3]} want {want.flatten()[:3]}"
    # the Communicator's dispatch: "ring" serves the all-reduce, the process group the rest
    comm = Communicator(dist.group.WORLD, torch.device("cpu"),
                        config=EngineConfig(custom_allreduce=False))
    comm._ws = ws
    x = _inputs(200, (2 * cap + 3,), torch.bfloat16, world)
    if "ring" not in comm.available_backends("all_reduce", x[rank]):
        bad["communicator: ring available"] = str(comm.available_backends("all_reduce", x[rank]))
    elif not torch.equal(comm.run("all_reduce", x[rank], "ring"), plain_sum(x)):
        bad["communicator: ring all-reduce"] = "wrong sum"
    if comm.available_backends("all_gather", x[rank]) != ["torch"]:
        bad["communicator: all-gather on a ring workspace"] = "not the process group only"
    comm._ws = None
    # ipc.py's start-up self-test of a ring workspace runs only the ring: it passes with the opposite rank poisoned
    from types import SimpleNamespace

    from tpserve.collectives.ipc import _self_test
    problem = _self_test(ws, SimpleNamespace(world_size=world, rank=rank), torch.device("cpu"))
    if problem:
        bad["start-up self-test of a ring workspace"] = problem
    untouched = bool((poison == POISON).all())
    error = ws.error_flag()
    seg.close()
    return {"bad": bad, "untouched": untouched, "error": error, "mapped":
            sorted(p for p, d in enumerate(seg.data) if d is not None)}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_is_bitwise_the_mesh_in_the_interpreter(world):
    _skip_without_the_interpreter()
    ranks = spawn_ranks(_ring_vs_mesh, world, timeout=600, env={"TRITON_INTERPRET": "1"})
    for rank, out in enumerate(ranks):
        assert not out["bad"], f"world {world} rank {rank}: {out['bad']}"
        assert not out["error"]
        assert out["rounds"] > out["slots"]  # the largest call reused every slot
    assert len({tuple(out["digests"]) for out in ranks}) == 1  # identical on every rank
    assert len({tuple(out["ring_counters"]) for out in ranks}) == 1


def test_ring_touches_only_neighbours_in_the_interpreter():
    _skip_without_the_interpreter()
    world = 4
    ranks = spawn_ranks(_neighbours_only, world, timeout=600, env={"TRITON_INTERPRET": "1"})
    for rank, out in enumerate(ranks):
        assert not out["bad"], f"rank {rank}: {out['bad']}"
        assert not out["error"]
        assert out["untouched"], f"rank {rank} wrote into rank {(rank + 2) % world}'s buffer"
        assert (rank + 2) % world not in out["mapped"]


def test_cuda_ring_topology_builds_the_peer_workspace(monkeypatch):
    """For a ring above 2 ranks on CUDA, comm._make_workspace builds the peer workspace with the ring
    topology, not NCCL (no GPU needed: the builder is stubbed)."""
    from tpserve.collectives import ipc
    from tpserve.collectives.comm import Communicator

    built = {}

    def fake(ops, nbytes, device, **kw):
        built.update(kw, device=device)
        return "workspace"

    monkeypatch.setattr(ipc, "create_peer_workspace", fake)
    comm = Communicator.__new__(Communicator)  # no process group: only the construction step
    comm._ops, comm.workspace_bytes, comm.world_size = None, 1 << 20, 4
    comm.device, comm.topology = torch.device("cuda", 0), "ring"
    assert comm._make_workspace(1.0) == "workspace"
    assert built == {"topology": "ring", "device": torch.device("cuda", 0)}
