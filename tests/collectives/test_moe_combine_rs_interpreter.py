"""The CUDA workspace's fused MoE combine + reduce-scatter (PeerWorkspace.reduce_scatter_moe_combine:
the one-round kernel, workspace_triton.py, and the pipelined one, workspace_triton_pipe.py) in
Triton's CPU interpreter, ranks emulated as in test_peer_workspace_interpreter.py (every rank maps
every rank's shared-memory segment). Each call is checked bit for bit against the unfused path,
fused.pad_rows(fused.moe_combine(...)) reduce-scattered through the same workspace, and against
the rank-order sum of every rank's padded combine: one slot (one-round kernel, and forced through
the pipelined one), several slots (more pipelined rounds than slots: slot reuse), rows split
across rounds with two column tiles per row, ragged token counts (T not a multiple of the world),
k 1 / 2 / 8, with and without shared experts, bf16 and fp32, world 2 and 4. Then the argument
checks (ValueError naming the argument; these need Triton importable, the others its interpreter
too, else they are skipped) and, with fake workspaces, Communicator.reduce_scatter_moe_combine's
choice of the fused path."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tpserve.engine.tp.launch import spawn_ranks

WORKSPACE_BYTES = 12 << 10  # a slot of 2 KiB; 3 pipeline programs x 4 slots of 1 KiB regions


def _skip_without_the_interpreter() -> None:
    pytest.importorskip("triton")
    from test_peer_workspace_interpreter import _interpreter_works

    problem = _interpreter_works()
    if problem:
        pytest.skip(problem)


def moe_inputs(seed: int, t: int, k: int, d: int, dtype: torch.dtype, with_shared: bool):
    """y [t*k, d] in expert order, order [t*k], weights [t, k], shared [t, d] or None."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(8, generator=g)[:k] for _ in range(t)])
    return (torch.randn(t * k, d, generator=g).to(dtype), torch.argsort(ids.view(-1), stable=True),
            torch.rand(t, k, generator=g),
            torch.randn(t, d, generator=g).to(dtype) if with_shared else None)


def _cases(ws, world: int, quick: bool) -> list[tuple]:
    """(label, t, k, d, dtype, shared, pipelined, kernel expected: "one-round" / "pipelined");
    `quick` (world 4, whose spinning ranks share the cores): the several-slot case in bf16 only,
    no wide rows."""
    from tpserve.collectives.workspace_triton_pipe import PIPE_SLOTS

    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        # enough padded rows for PIPE_SLOTS + 2 pipelined rounds of every program, 3/4 of a
        # program's piece wide (pieces start inside rows)
        region = ws.rs_region(dtype)
        d = region * 3 // 4
        per = -(-(PIPE_SLOTS + 2) * region * ws.pipe_programs // d)
        cases += [(f"{dtype} one slot, ragged", 2 * world + 1, 8, 40, dtype, True, None, "one-round"),
                  (f"{dtype} one slot, pipelined", 2 * world + 1, 8, 40, dtype, True, True, "pipelined"),
                  (f"{dtype} several slots, ragged", per * world - 1, 2, d, dtype, False, None,
                   "pipelined")][: 2 if quick and dtype == torch.float32 else 3]
        if not quick:  # rows of two column tiles (512 + 88) split across rounds; k 1
            cases.append((f"{dtype} wide rows", world + 1, 1, 600, dtype, True, True, "pipelined"))
    return cases


def _battery(rank: int, world: int, quick: bool) -> dict:
    from tpserve.collectives import fused
    from tpserve.collectives.shm import ShmSegments
    from tpserve.collectives.workspace_group import GroupOps
    from tpserve.collectives.workspace_peer import PeerWorkspace, buffer_bytes_for
    from tpserve.collectives.workspace_triton_pipe import PIPE_SLOTS

    torch.set_num_threads(1)
    ops = GroupOps(dist.group.WORLD, torch.device("cpu"))
    nbytes = buffer_bytes_for(WORKSPACE_BYTES)
    seg = ShmSegments(ops, nbytes)
    ws = PeerWorkspace(rank, world, [d.data_ptr() for d in seg.data], nbytes, torch.device("cpu"),
                       interpret=True)
    bad: dict[str, str] = {}
    most_rounds = 0
    cases = _cases(ws, world, quick)
    for n, (label, t, k, d, dtype, with_shared, pipelined, kernel) in enumerate(cases):
        every = [moe_inputs(100 * n + r, t, k, d, dtype, with_shared) for r in range(world)]
        y, order, w, shared = every[rank]
        if n % 2:
            order = order.int()  # either index dtype
        calls, rounds = int(ws.state[0]), int(ws.pipe_counters[0])
        got = ws.reduce_scatter_moe_combine(y, order, w, shared, pipelined=pipelined)
        calls, rounds = int(ws.state[0]) - calls, int(ws.pipe_counters[0]) - rounds
        most_rounds = max(most_rounds, rounds)
        took = "pipelined" if rounds else "one-round" if calls == 1 else f"{calls} calls"
        if took != kernel:
            bad[f"{label}: kernel"] = f"took {took}, want {kernel}"
        unfused = ws.reduce_scatter(fused.pad_rows(fused.moe_combine(y, order, w, shared), world))
        acc = None
        for inputs in every:  # the rank-order float32 sum of every rank's padded combine
            c = fused.pad_rows(fused.moe_combine(*inputs), world).float()
            acc = c if acc is None else acc + c
        for name, want in (("unfused", unfused), ("rank-order sum", acc.to(dtype).chunk(world)[rank])):
            if got.dtype != dtype or got.shape != want.shape or not torch.equal(got, want):
                bad[f"{label} (t={t} k={k} d={d}) vs {name}"] = (
                    f"got {tuple(got.shape)} {got.flatten()[:3]} want {want.flatten()[:3]}")
    error = ws.error_flag()
    seg.close()
    return {"bad": bad, "cases": len(cases), "rounds": most_rounds, "slots": PIPE_SLOTS,
            "error": error}


@pytest.mark.parametrize("world", [2, 4])
def test_fused_moe_combine_rs_equals_unfused_in_the_interpreter(world):
    _skip_without_the_interpreter()
    ranks = spawn_ranks(_battery, world, world > 2, timeout=600, env={"TRITON_INTERPRET": "1"})
    for rank, out in enumerate(ranks):
        assert not out["bad"], f"world {world} rank {rank}: {out['bad']}"
        assert not out["error"] and out["cases"] >= 5
        assert out["rounds"] > out["slots"]  # more rounds than slots: every slot reused


def test_fused_moe_combine_rs_argument_checks():
    """Wrong arguments raise ValueError naming the argument, before anything is launched."""
    pytest.importorskip("triton")
    from tpserve.collectives.workspace_peer import PeerWorkspace, buffer_bytes_for

    def workspace(workspace_bytes, world=2):
        nbytes = buffer_bytes_for(workspace_bytes)
        bufs = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(world)]
        return PeerWorkspace(0, world, [b.data_ptr() for b in bufs], nbytes, torch.device("cpu"),
                             interpret=True, keepalive=bufs)

    ws = workspace(WORKSPACE_BYTES)
    y, order, w, shared = moe_inputs(0, 5, 2, 16, torch.float32, True)
    cases = [((y, order, w[0], shared), {}, "weights"),
             ((y[:-1], order, w, shared), {}, "y shape"),
             ((y, order[:-1], w, shared), {}, "order shape"),
             ((y, order, w, shared[:, :3]), {}, "shared shape"),
             ((y, order.float(), w, shared), {}, "order must be"),
             ((y.double(), order, w, shared.double()), {}, "y must be"),
             ((y[:0], order[:0], w[:0], shared[:0]), {}, "y must be"),
             ((y.repeat(200, 1), order.repeat(200), w.repeat(200, 1), shared.repeat(200, 1)),
              {"pipelined": False}, "pipelined=False")]
    for args, kw, message in cases:
        with pytest.raises(ValueError, match=message):
            ws.reduce_scatter_moe_combine(*args, **kw)
    tiny = workspace(8192 + 4096, world=8)  # slots, but pipeline regions of 32 fp32 per rank
    assert tiny.rs_region(torch.float32) < 64
    with pytest.raises(ValueError, match="pipelined=True"):
        tiny.reduce_scatter_moe_combine(y, order, w, shared, pipelined=True)
    big = torch.empty(2 * tiny.capacity(torch.float32), 16)
    assert ws.fits_moe_combine(big) and not tiny.fits_moe_combine(big)


@pytest.mark.parametrize("want", ["oneshot", "chunked", "torch"])
@pytest.mark.parametrize("cuda_like", [True, False])
def test_communicator_folds_wherever_the_workspace_serves_the_reduce_scatter(want, cuda_like):
    """Communicator.reduce_scatter_moe_combine with fake workspaces (test_comm_dispatch.py): the
    fused path whenever the table's reduce-scatter resolves to the workspace, at any size; on the
    CUDA workspace "chunked" asks for the pipelined kernel (as `run` does), the CPU one gets no
    switch; the table's "torch" (NCCL / gloo) gives combine, pad and that reduce-scatter."""
    from test_comm_dispatch import FITS, FakePeerWorkspace, FakeWorkspace, _comm

    from tpserve.collectives import fused

    class Fused(FakePeerWorkspace if cuda_like else FakeWorkspace):
        MOE_COMBINE = "torch"

        def fits_moe_combine(self, x):
            return True

        def reduce_scatter_moe_combine(self, y, order, weights, shared, **kw):
            self.calls.append(("reduce_scatter_moe_combine", kw))
            return fused.moe_combine(y, order, weights, shared)

    for t in (3, 5 * FITS):  # padded rows x 2 columns: within a slot, larger than a slot
        ws = Fused()
        comm = _comm(ws)
        comm.backend_for = lambda op, x: comm._resolve(op, want, x)  # the table says `want`
        comm.run = lambda op, x, backend, dim=0: ws.calls.append((backend, {})) or x  # unfused
        y, order, weights, shared = moe_inputs(t, t, 1, 2, torch.float32, True)
        comm.reduce_scatter_moe_combine(y, order, weights, shared)
        backend = comm._resolve("reduce_scatter", want, torch.empty(t + t % 2, 2))
        if want == "torch":
            assert ws.calls == [("torch", {})]
        else:
            pipelined = cuda_like and backend == "chunked"
            assert ws.calls == [("reduce_scatter_moe_combine", {"pipelined": True} if pipelined else {})]
            assert backend == ("chunked" if t > FITS else want)
