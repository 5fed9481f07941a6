"""The CPU workspace collectives (shared memory) against plain sums, at world 2 and 3, and
all-gather / reduce-scatter at world 4 too.

Each world size runs one battery in one spawn (process start-up dominates the cost); the tests
below assert on its results. A small workspace (64 KiB) makes "larger than the workspace" cheap.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch
import torch.distributed as dist

from tpserve.engine.tp.launch import spawn_ranks

WORKSPACE_BYTES = 64 << 10
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def plain_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    """Rank-order sum; bf16/fp16 accumulate in float32 (the documented workspace numerics)."""
    acc = xs[0].float().clone()
    for x in xs[1:]:
        acc += x.float()
    return acc.to(xs[0].dtype)


def strided(t: torch.Tensor) -> torch.Tensor:
    wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1] + 3), dtype=t.dtype)
    view = wide[..., 3::2]
    view.copy_(t)
    assert view.numel() <= 1 or not view.is_contiguous()
    return view


def inputs(case: int, shape: tuple[int, ...], dtype: torch.dtype, world: int) -> list[torch.Tensor]:
    return [torch.randn(shape, generator=torch.Generator().manual_seed(97 * case + r)).to(dtype)
            for r in range(world)]


def digest(t: torch.Tensor) -> int:
    return zlib.crc32(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())


ALL_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def battery(rank: int, world: int, ops: tuple[str, ...] = ALL_OPS) -> dict:
    """Runs every path of `ops`; returns {check name: problem or ''} plus digests and picks."""
    from tpserve.collectives.comm import Communicator

    torch.set_num_threads(1)
    comm = Communicator(dist.group.WORLD, torch.device("cpu"), prepare_all=True, timeout_s=60,
                        workspace_bytes=WORKSPACE_BYTES)
    cap = comm._ws.capacity(torch.float32)
    big = int(cap * 2.5)
    results: dict[str, str] = {}
    digests: list[int] = []

    def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        ok = got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)
        results[name] = "" if ok else f"got {got.flatten()[:4]} want {want.flatten()[:4]}"
        digests.append(digest(got) if got.shape == want.shape else 0)

    case = 0
    for dtype in DTYPES:
        for shape in [(7,), (3, 5), (1, 1), (33, 129), (big // 100 + 1, 100), (big + 5,), ()]:
            if "all_reduce" not in ops:
                break
            case += 1
            xs = inputs(case, shape, dtype, world)
            want = plain_sum(xs)
            for layout in ("contiguous", "strided"):
                if layout == "strided" and len(shape) == 0:
                    continue
                x = xs[rank] if layout == "contiguous" else strided(xs[rank])
                for backend in comm.available_backends("all_reduce", x):
                    if backend == "torch":
                        continue
                    got = comm.run("all_reduce", x, backend)
                    check(f"all_reduce {backend} {dtype} {shape} {layout}", got, want)
                    if not torch.equal(x, xs[rank]):
                        results[f"all_reduce {backend} {shape} input untouched"] = "input changed"
        for shape, dim in [((5,), 0), ((3, 7), 1), ((2, 3, 4), 2), ((big // 50 + 1, 50), 0),
                           ((2, big // 2 + 3), 1)]:
            if "all_gather" not in ops:
                break
            case += 1
            xs = inputs(case, shape, dtype, world)
            for layout in ("contiguous", "strided"):
                x = xs[rank] if layout == "contiguous" else strided(xs[rank])
                backend = comm.backend_for("all_gather", x)
                for b in {"oneshot", "chunked"} & set(comm.available_backends("all_gather", x)):
                    check(f"all_gather {b} {dtype} {shape} dim={dim} {layout}",
                          comm.run("all_gather", x, b, dim), torch.cat(xs, dim))
                results[f"all_gather pick {shape}"] = "" if backend in ("oneshot", "chunked") \
                    else f"picked {backend}"
        for shape, dim in [((world, 3), 0), ((3, 5 * world), 1), ((world * 2, 3, 5), 0),
                           ((world * (big // 40 // world + 1), 40), 0), ((3, world * 11), 1)]:
            if "reduce_scatter" not in ops:
                break
            case += 1
            xs = inputs(case, shape, dtype, world)
            want = plain_sum(xs).chunk(world, dim)[rank]
            for layout in ("contiguous", "strided"):
                x = xs[rank] if layout == "contiguous" else strided(xs[rank])
                for b in {"oneshot", "chunked"} & set(comm.available_backends("reduce_scatter", x)):
                    got = comm.run("reduce_scatter", x, b, dim)
                    results[f"reduce_scatter {b} {dtype} {shape} dim={dim} {layout}"] = (
                        "" if torch.equal(got, want) else "mismatch")
    # the public API picks a path by the table and agrees with a plain sum
    x = inputs(999, (4, 9), torch.float32, world)
    check("Communicator.all_reduce", comm.all_reduce(x[rank].clone()), plain_sum(x))
    check("Communicator.all_gather", comm.all_gather(x[rank], dim=1), torch.cat(x, 1))
    results["Communicator.reduce_scatter"] = "" if torch.equal(
        comm.reduce_scatter(torch.cat(x, 0)), plain_sum([torch.cat(x, 0)] * world).chunk(world)[rank]
    ) else "mismatch"
    paths = comm._ws.seg.paths
    picks = [comm.backend_for(op, torch.empty(shape, dtype=dt))
             for op in ("all_reduce", "all_gather", "reduce_scatter")
             for dt in DTYPES for shape in [(1,), (world * 64,), (world * 4096,), (world, 1 << 16)]]
    during = [p for p in paths if os.path.exists(p)]
    comm.close()
    comm.close()  # twice is fine
    after = [p for p in paths if os.path.exists(p)]
    return {"results": results, "digests": digests, "picks": picks, "paths": paths,
            "shm_during": during, "shm_after": after, "cap": cap}


@pytest.fixture(scope="module", params=[(2, ALL_OPS), (3, ALL_OPS),
                                        (4, ("all_gather", "reduce_scatter"))],
                ids=["world2", "world3", "world4_gather_scatter"])
def run(request):
    world, ops = request.param
    return world, ops, spawn_ranks(battery, world, ops, timeout=240)


def test_every_path_matches_a_plain_sum(run):
    world, ops, ranks = run
    for rank, out in enumerate(ranks):
        bad = {k: v for k, v in out["results"].items() if v}
        assert not bad, f"rank {rank}: {bad}"
    names = ranks[0]["results"]
    for op in ops:  # each op ran in one round and in several, contiguous and strided
        mine = [n for n in names if n.startswith(op + " ")]
        assert any("chunked" in n for n in mine) and any("oneshot" in n for n in mine), op
        assert any("strided" in n for n in mine), op
    if "all_reduce" in ops:
        assert any("twoshot" in n for n in names)
    assert len(names) > 100


def test_results_are_bitwise_identical_on_every_rank(run):
    world, ops, ranks = run
    for out in ranks[1:]:
        assert out["digests"] == ranks[0]["digests"]


def test_table_choice_is_the_same_on_every_rank(run):
    world, ops, ranks = run
    assert all(out["picks"] == ranks[0]["picks"] for out in ranks)
    assert set(ranks[0]["picks"]) <= {"oneshot", "twoshot", "chunked", "torch"}
    assert "chunked" in ranks[0]["picks"]  # the largest shapes exceed the 64 KiB workspace


def test_no_shared_memory_segment_is_left_behind(run):
    world, ops, ranks = run
    for out in ranks:
        assert len(out["paths"]) == world and all(p.startswith("/dev/shm/") for p in out["paths"])
        assert out["shm_during"] == [], "segments must be unlinked once every rank mapped them"
        assert out["shm_after"] == []
