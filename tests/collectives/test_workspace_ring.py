"""The neighbour-only ring all-reduce and the pipelined mesh paths on CPU shared memory, world 3
and 4: bitwise equal to each other and to a rank-order sum, on odd sizes, strided views and sizes
many times the workspace; the ring maps only its two neighbours' segments; the fused all-reduce +
add + RMSNorm and all-reduce + mHC expand equal the unfused ops. One spawn per world size
(start-up dominates the cost).
"""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.distributed as dist

from tpserve.engine.tp.launch import spawn_ranks

WORKSPACE_BYTES = 40 << 10  # 4 slots of ~9 KiB: the big shapes take dozens of rounds


def plain_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    acc = xs[0].float().clone() if xs[0].dtype in (torch.bfloat16, torch.float16) else xs[0].clone()
    for x in xs[1:]:
        acc += x
    return acc.to(xs[0].dtype)


def strided(t: torch.Tensor) -> torch.Tensor:
    wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1] + 1), dtype=t.dtype)
    view = wide[..., 1::2]
    view.copy_(t)
    return view


def battery(rank: int, world: int) -> dict:
    from tpserve.config import EngineConfig
    from tpserve.collectives import fused
    from tpserve.collectives.comm import Communicator
    from tpserve.model.mhc import HyperConnection

    torch.set_num_threads(1)
    group = dist.group.WORLD
    mesh = Communicator(group, torch.device("cpu"), prepare_all=True, timeout_s=60,
                        workspace_bytes=WORKSPACE_BYTES)
    ring = Communicator(group, torch.device("cpu"), timeout_s=60, workspace_bytes=WORKSPACE_BYTES,
                        config=EngineConfig(allreduce_topology="ring"))
    bad: dict[str, str] = {}
    digests: list[int] = []
    cap = mesh._ws.capacity(torch.float32)
    rounds = 0
    shapes = [(7,), (33, 129), (int(cap * 6.3) + 1,), (3, int(cap * 2.7)), ()]
    for case, dtype in enumerate((torch.float32, torch.bfloat16, torch.int64)):
        for j, shape in enumerate(shapes):
            g = [torch.Generator().manual_seed(1000 * case + 10 * j + r) for r in range(world)]
            xs = [(torch.randn(shape, generator=gr) * 100).to(dtype) for gr in g]
            want = plain_sum(xs)
            for layout in ("contiguous", "strided"):
                if layout == "strided" and (not shape or (dtype == torch.int64 and j < 3)):
                    continue
                x = xs[rank] if layout == "contiguous" else strided(xs[rank])
                before = ring._ws._round
                got = {"ring topology": ring.all_reduce(x)}
                rounds = max(rounds, ring._ws._round - before)
                for b in ("oneshot", "twoshot", "chunked", "ring"):
                    if b in mesh.available_backends("all_reduce", x):
                        got[f"mesh {b}"] = mesh.run("all_reduce", x, b)
                for name, y in got.items():
                    label = f"{name} {dtype} {shape} {layout}"
                    if y.shape != want.shape or not torch.equal(y, want):
                        bad[label] = f"got {y.flatten()[:3]} want {want.flatten()[:3]}"
                    digests.append(zlib.crc32(y.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()))
    # which segments each topology maps
    mapped = {"mesh": sorted(p for p, d in enumerate(mesh._ws.seg.data) if d is not None),
              "ring": sorted(p for p, d in enumerate(ring._ws.seg.data) if d is not None)}
    picks = {op: ring.backend_for(op, torch.ones(world * 8)) for op in
             ("all_reduce", "all_gather", "reduce_scatter")}
    # ring topology: all-gather / reduce-scatter go through the process group and still work
    xs = [torch.full((world, 3), float(r + 1)) for r in range(world)]
    if not torch.equal(ring.all_gather(xs[rank]), torch.cat(xs)):
        bad["ring topology all_gather"] = "mismatch"
    # fused all-reduce + add + RMSNorm == all_reduce, then add and RMSNorm, bit for bit on CPU
    for dtype in (torch.float32, torch.bfloat16):
        for comm, name in ((mesh, "mesh"), (ring, "ring")):
            for shape in [(3, 64)] if name == "ring" else [(3, 64), (int(cap / 50) + 1, 100)]:
                g = [torch.Generator().manual_seed(7 + r) for r in range(world)]
                parts = [torch.randn(shape, generator=gr).to(dtype) for gr in g]
                res = torch.randn(shape, generator=torch.Generator().manual_seed(99)).to(dtype)
                w = torch.rand(shape[-1], generator=torch.Generator().manual_seed(5)).to(dtype)
                normed, new_res = comm.all_reduce_add_rmsnorm(parts[rank], res, w, 1e-6)
                want_n, want_r = fused.add_rmsnorm(plain_sum(parts), res, w, 1e-6)
                if not (torch.equal(normed, want_n) and torch.equal(new_res, want_r)):
                    bad[f"fused {name} {dtype} {shape}"] = "differs from the unfused ops"
    # fused all-reduce + mHC expand == all_reduce, then HyperConnection.expand, bit for bit
    for dtype in (torch.float32, torch.bfloat16):
        for comm, name in ((mesh, "mesh"), (ring, "ring")):
            g = [torch.Generator().manual_seed(11 + r) for r in range(world)]
            parts = [torch.randn(3, 64, generator=gr).to(dtype) for gr in g]
            gs = torch.Generator().manual_seed(12)
            streams = torch.randn(3, 4, 64, generator=gs).to(dtype)
            post, comb = torch.rand(3, 4, generator=gs), torch.rand(3, 4, 4, generator=gs)
            got = comm.all_reduce_hc_expand(parts[rank].clone(), streams, post, comb)
            unfused = HyperConnection.expand(comm.all_reduce(parts[rank].clone()), streams, post,
                                             comb)
            if not (torch.equal(got, unfused) and torch.equal(
                    got, HyperConnection.expand(plain_sum(parts), streams, post, comb))):
                bad[f"fused hc expand {name} {dtype}"] = "differs from the unfused ops"
    mesh.close()
    ring.close()
    return {"bad": bad, "digests": digests, "mapped": mapped, "picks": picks, "rounds": rounds,
            "checks": len(digests)}


@pytest.fixture(scope="module", params=[3, 4], ids=["world3", "world4"])
def run(request):
    return request.param, spawn_ranks(battery, request.param, timeout=300)


def test_ring_and_pipelined_mesh_equal_the_rank_order_sum(run):
    world, ranks = run
    for rank, out in enumerate(ranks):
        assert not out["bad"], f"rank {rank}: {out['bad']}"
        assert out["checks"] > 90
        assert out["rounds"] >= 15  # the largest shape really went through many rounds


def test_every_rank_gets_the_same_bits(run):
    world, ranks = run
    for out in ranks[1:]:
        assert out["digests"] == ranks[0]["digests"]


def test_ring_maps_only_its_neighbours(run):
    world, ranks = run
    for rank, out in enumerate(ranks):
        assert out["mapped"]["mesh"] == list(range(world))
        assert out["mapped"]["ring"] == sorted({rank, (rank - 1) % world, (rank + 1) % world})
        assert out["picks"] == {"all_reduce": "ring", "all_gather": "torch",
                                "reduce_scatter": "torch"}
    if world == 4:
        assert 2 not in ranks[0]["mapped"]["ring"]


def test_fused_op_at_world_one_and_its_argument_checks():
    from tpserve.collectives import fused
    from tpserve.collectives.comm import Communicator

    comm = Communicator(None, torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    x, res = torch.randn(4, 32, generator=g), torch.randn(4, 32, generator=g)
    w = torch.rand(32, generator=g)
    normed, new_res = comm.all_reduce_add_rmsnorm(x, res, w, 1e-5)
    assert torch.equal(new_res, res + x)
    h = new_res.double()
    want = (w.double() * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.allclose(normed.double(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="residual shape"):
        comm.all_reduce_add_rmsnorm(x, res[:2], w, 1e-5)
    with pytest.raises(ValueError, match="weight shape"):
        comm.all_reduce_add_rmsnorm(x, res, w[:3], 1e-5)
    with pytest.raises(ValueError, match="residual dtype"):
        comm.all_reduce_add_rmsnorm(x, res.double(), w, 1e-5)
    bound = fused.rmsnorm_bound(new_res, w, 1e-5, normed)
    assert bool((bound > 0).all()) and float(bound.max()) < 1e-4  # fp32: a few ulp


def test_bad_topology_is_refused():
    from tpserve.config import EngineConfig

    with pytest.raises(ValueError, match="allreduce_topology"):
        EngineConfig(allreduce_topology="torus")
