"""The CUDA workspace kernels (workspace_triton.py) run by Triton's CPU interpreter.

Each rank maps every rank's POSIX shared-memory segment and hands the addresses to a
PeerWorkspace exactly as ipc.py hands it the symmetric-memory addresses on GPUs; the interpreter
runs the same kernels (flags through plain volatile loads/stores instead of the PTX ones). This
checks the protocol (epochs, slot parity, per-program partitions), the chunking, the strided
gathers and the numerics without a GPU. Skipped where Triton is not installed (CI).
"""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.distributed as dist

from tpserve.engine.tp.launch import spawn_ranks

triton = pytest.importorskip("triton")


def _interpreter_works() -> str:
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language as tl

        @triton.jit
        def probe(x_ptr, n):
            for i in range(tl.program_id(0), n, tl.num_programs(0)):
                tl.store(x_ptr + i, i)

        x = torch.zeros(4, dtype=torch.int32)
        probe[(2,)](x, 4)
        return "" if x.tolist() == [0, 1, 2, 3] else "probe kernel gave wrong values"
    except Exception as exc:  # noqa: BLE001 - e.g. numpy too new for this Triton's interpreter
        return f"Triton interpreter unusable here: {exc!r}"
    finally:
        os.environ.pop("TRITON_INTERPRET", None)


def plain_sum(xs):
    acc = xs[0].float().clone()
    for x in xs[1:]:
        acc += x.float()
    return acc.to(xs[0].dtype)


def _peer_battery(rank: int, world: int, quick: bool = False, narrow: bool = False) -> dict:
    """Every kernel against plain sums; `quick`: only the pipelined and fused kernels, fewer
    cases (world 4, where the interpreter's spinning ranks share two cores); `narrow`: every case
    in one dtype (bfloat16; the MoE combine float16): world 3, whose three spinning ranks on two
    cores took 3x world 2's time with every dtype (the dtypes are covered at world 2)."""
    from tpserve.collectives.shm import ShmSegments
    from tpserve.collectives.workspace_group import GroupOps
    from tpserve.collectives import fused
    from tpserve.collectives.workspace_peer import PeerWorkspace, buffer_bytes_for

    torch.set_num_threads(1)
    ops = GroupOps(dist.group.WORLD, torch.device("cpu"))
    nbytes = buffer_bytes_for(24 << 10)
    seg = ShmSegments(ops, nbytes)  # only the data area (zeroed memory) is handed over
    ptrs = [d.data_ptr() for d in seg.data]
    ws = PeerWorkspace(rank, world, ptrs, nbytes, torch.device("cpu"), interpret=True)
    cap = ws.capacity(torch.float32)
    bad: dict[str, str] = {}
    n_checks = 0

    def gen(case, shape, dtype):
        return [torch.randn(shape, generator=torch.Generator().manual_seed(31 * case + r)).to(dtype)
                for r in range(world)]

    def check(name, got, want):
        nonlocal n_checks
        n_checks += 1
        if got.shape != want.shape or not torch.equal(got, want):
            bad[name] = f"got {got.flatten()[:3]} want {want.flatten()[:3]}"

    case = 0
    for dtype in () if quick else (torch.bfloat16,) if narrow else (torch.float32, torch.bfloat16, torch.float16):
        for shape in [(7,), (5, 3), (int(cap * 2.3) + 1,)]:
            case += 1
            xs = gen(case, shape, dtype)
            for two_shot in (False, True):
                check(f"ar {dtype} {shape} two={two_shot}", ws.all_reduce(xs[rank], two_shot=two_shot),
                      plain_sum(xs))
            tx = [x.view(-1)[: (x.numel() // 2) * 2].view(2, -1).t() for x in xs]  # strided
            check(f"ar strided {dtype} {shape}", ws.all_reduce(tx[rank], two_shot=True),
                  plain_sum([t.contiguous() for t in tx]))
        xs = gen(100, (3, 5, 2), dtype)
        check(f"ag dim1 {dtype}", ws.all_gather(xs[rank], 1), torch.cat(xs, 1))
        xs = gen(101, (int(cap * 1.5),), dtype)
        check(f"ag chunked {dtype}", ws.all_gather(xs[rank], 0), torch.cat(xs, 0))
        for shape, dim in [((world * 3, 4), 0), ((2, world * 5), 1), ((world * (cap // 2), 3), 0)]:
            xs = gen(102 + dim, shape, dtype)
            check(f"rs {dtype} {shape} dim={dim}", ws.reduce_scatter(xs[rank], dim),
                  plain_sum(xs).chunk(world, dim)[rank])
    # the pipelined kernel: one launch, several rounds per program, strided and odd sizes
    rounds = 0
    for dtype in (torch.bfloat16,) if quick or narrow else (torch.float32, torch.bfloat16):
        for shape in [(int(cap * 3.4) + 3,)] if quick else [(5,), (int(cap * 3.4) + 3,),
                                                             (7, int(cap * 0.6) + 1)]:
            case += 1
            xs = gen(case, shape, dtype)
            before = int(ws.pipe_counters[0])
            check(f"pipelined {dtype} {shape}", ws.all_reduce_chunked(xs[rank]), plain_sum(xs))
            rounds = max(rounds, int(ws.pipe_counters[0]) - before)
            tx = [x.view(-1)[: (x.numel() // 2) * 2].view(2, -1).t() for x in xs]
            check(f"pipelined strided {dtype} {shape}", ws.all_reduce_chunked(tx[rank]),
                  plain_sum([t.contiguous() for t in tx]))
        case += 1  # pipelined all-gather / reduce-scatter, strided, along dim 1
        xs = [x.t() for x in gen(case, (int(cap * 0.4) + 1, 3), dtype)]
        check(f"ag pipelined strided {dtype}", ws.all_gather(xs[rank], 1, pipelined=True),
              torch.cat(xs, 1))
        xs = [x.t() for x in gen(case, (world * (int(cap * 0.2) + 1), 3), dtype)]
        check(f"rs pipelined strided {dtype}", ws.reduce_scatter(xs[rank], 1, pipelined=True),
              plain_sum(xs).chunk(world, 1)[rank])
        big = gen(case + 1, (int(cap * 2.2),), dtype)  # larger than a slot: all_reduce pipelines
        check(f"ar larger than the slot {dtype}", ws.all_reduce(big[rank], two_shot=True),
              plain_sum(big))
    # fused all-reduce + add + RMSNorm: total and residual bitwise, normed within the bound
    fused_bad = {}
    for dtype in (torch.bfloat16,) if quick or narrow else (torch.float32, torch.bfloat16):
        for shape in [(3, 100)] if quick else [(3, 64), (5, 100), (2, 1000)]:
            case += 1
            parts = gen(case, shape, dtype)
            res = gen(case + 500, shape, dtype)[0]
            w = (torch.rand(shape[-1], generator=torch.Generator().manual_seed(case)) + 0.5).to(dtype)
            normed, new_res = ws.all_reduce_add_rmsnorm(parts[rank], res, w, 1e-6)
            want_n, want_r = fused.add_rmsnorm(plain_sum(parts), res, w, 1e-6)
            check(f"fused residual {dtype} {shape}", new_res, want_r)
            err = (normed.float() - want_n.float()).abs()
            bound = fused.rmsnorm_bound(want_r, w, 1e-6, want_n)
            n_checks += 1
            if not bool((err <= bound).all()):
                fused_bad[f"fused normed {dtype} {shape}"] = f"max err {float(err.max()):.3g}"
    # fused all-reduce + mHC expand: post 1 and comb 0 give `total` itself (bitwise the
    # all-reduce's), random post / comb new streams within fused.hc_expand_bound; shapes with
    # several column tiles per row, more tiles than programs, one stream, odd stream counts.
    # More tiles than programs (200 rows on 128 programs) in bfloat16 at world 2 only: the
    # interpreter's slowest case (every program waits on its peers), the same loop in any dtype
    # and world
    for dtype in (torch.bfloat16,) if quick or narrow else (torch.float32, torch.bfloat16, torch.float16):
        many = [(200, 2, 8)] if dtype == torch.bfloat16 and not quick and not narrow else []
        for t, n, d in [(3, 4, 100)] if quick else [(3, 4, 64), (1, 4, 1500), *many, (2, 3, 700),
                                                    (5, 1, 33)]:
            case += 1
            parts = gen(case, (t, d), dtype)
            streams = gen(case + 500, (t, n, d), dtype)[0]
            g = torch.Generator().manual_seed(case)
            post, comb = torch.rand(t, n, generator=g) * 2, torch.rand(t, n, n, generator=g)
            total = plain_sum(parts)
            check(f"hc expand total {dtype} {(t, n, d)}",
                  ws.all_reduce_hc_expand(parts[rank], streams, torch.ones_like(post),
                                          torch.zeros_like(comb)),
                  total.unsqueeze(1).expand(-1, n, -1))
            got = ws.all_reduce_hc_expand(parts[rank], streams, post, comb)
            err = (got.double() - fused.hc_expand(total, streams, post, comb).double()).abs()
            n_checks += 1
            if got.dtype != dtype or not bool((err <= fused.hc_expand_bound(total, streams, post,
                                                                           comb)).all()):
                fused_bad[f"hc expand {dtype} {(t, n, d)}"] = f"max err {float(err.max()):.3g}"
    bad.update(fused_bad)
    _moe_combine_cases(ws, rank, world, quick, check, cap, narrow)
    if not quick:  # ipc.py's start-up self-test (every kernel, exact sums) passes here too
        from tpserve.collectives.ipc import _self_test
        problem = _self_test(ws, ops, torch.device("cpu"))
        n_checks += 1
        if problem:
            bad["start-up self-test"] = problem
    calls = int(ws.state[0])
    error = ws.error_flag()
    seg.close()
    return {"bad": bad, "checks": n_checks, "calls": calls, "error": error, "rounds": rounds,
            "pipe": [int(c) for c in ws.pipe_counters]}


def _moe_combine_cases(ws, rank: int, world: int, quick: bool, check, cap: int, narrow: bool = False) -> None:
    """The one-round fused MoE combine + reduce-scatter kernel: bitwise
    kernels/moe/route_triton.combine_sorted (+ shared) padded and reduce-scattered, and the torch
    definition fused.moe_combine (Triton's interpreter sums the k choices in order, as the
    definition does); odd token counts (padding rows), k 1 / 3 / 8, two column tiles per row,
    shared or not. Then through a Communicator (CPU device, this workspace in place of its own):
    the fused path serves a call that fits a slot (one-round kernel) and one larger than a slot
    (pipelined kernel), bitwise the unfused combine_sorted + reduce-scatter. (The pipelined kernel
    in detail: test_moe_combine_rs_interpreter.py.)"""
    import torch.nn.functional as F

    from tpserve.collectives import fused
    from tpserve.collectives.comm import Communicator
    from tpserve.kernels.moe.route_triton import combine_sorted

    def inputs(seed, t, k, d, dtype, with_shared):
        g = torch.Generator().manual_seed(seed)
        ids = torch.stack([torch.randperm(8, generator=g)[:k] for _ in range(t)])
        return (torch.randn(t * k, d, generator=g).to(dtype), torch.argsort(ids.view(-1), stable=True),
                torch.rand(t, k, generator=g),
                torch.randn(t, d, generator=g).to(dtype) if with_shared else None)

    def reference(per_rank, t, kernel_sum):
        pad = (-t) % world
        combined = []
        for y, order, w, sh in per_rank:
            if kernel_sum:
                c = combine_sorted(y, order, w)
                c = c if sh is None else c + sh
            else:
                c = fused.moe_combine(y, order, w, sh)
            combined.append(F.pad(c, (0, 0, 0, pad)))
        return plain_sum(combined).chunk(world)[rank]

    shapes = [(2 * world + 1, 8, 40, True)] if quick else [
        (2 * world + 1, 8, 40, True), (world + 1, 1, 16, False), (1, 3, 9, True), (world, 2, 520, True)]
    for dtype in (torch.float16,) if quick or narrow else (torch.float32, torch.float16):
        for n, (t, k, d, with_shared) in enumerate(shapes):
            per_rank = [inputs(1000 * n + r, t, k, d, dtype, with_shared) for r in range(world)]
            probe = torch.empty(-(-t // world) * world, d, dtype=dtype)
            if not (ws.fits_moe_combine(probe) and ws.fits("reduce_scatter", probe)):  # one round
                check(f"moe combine {dtype} {(t, k, d)} fits a slot", torch.zeros(1), torch.ones(1))
                continue
            got = ws.reduce_scatter_moe_combine(*per_rank[rank])
            check(f"moe combine {dtype} {(t, k, d)} vs combine_sorted", got, reference(per_rank, t, True))
            check(f"moe combine {dtype} {(t, k, d)} vs moe_combine", got, reference(per_rank, t, False))
    if quick:
        return
    from tpserve.config import EngineConfig
    comm = Communicator(dist.group.WORLD, torch.device("cpu"), config=EngineConfig(custom_allreduce=False))
    comm._ws, served = ws, []
    real = ws.reduce_scatter_moe_combine
    ws.reduce_scatter_moe_combine = lambda *a, **kw: served.append(1) or real(*a, **kw)
    for t, d in [(2 * world + 1, 24), (world * 16, 96)]:  # one slot; larger than a slot
        per_rank = [inputs(77 + r, t, 4, d, torch.float32, True) for r in range(world)]
        got = comm.reduce_scatter_moe_combine(*per_rank[rank], combine="triton")
        check(f"communicator moe combine {(t, d)}", got, reference(per_rank, t, True))
    ws.reduce_scatter_moe_combine = real
    if len(served) != 2:
        check("communicator moe combine: the fused path served both calls",
              torch.tensor([len(served)]), torch.tensor([2]))


def test_peer_kernels_in_the_interpreter():
    problem = _interpreter_works()
    if problem:
        pytest.skip(problem)
    for world in (2, 3):
        ranks = spawn_ranks(_peer_battery, world, False, world == 3, timeout=600, env={"TRITON_INTERPRET": "1"})
        for rank, out in enumerate(ranks):
            assert not out["bad"], f"world {world} rank {rank}: {out['bad']}"
            assert not out["error"]
            assert out["checks"] > 30
        assert len({out["calls"] for out in ranks}) == 1 and ranks[0]["calls"] > 30
        assert len({tuple(out["pipe"]) for out in ranks}) == 1
        assert ranks[0]["rounds"] >= 3  # the largest pipelined call took several rounds


def test_pipelined_and_fused_kernels_at_world_4_in_the_interpreter():
    problem = _interpreter_works()
    if problem:
        pytest.skip(problem)
    ranks = spawn_ranks(_peer_battery, 4, True, timeout=900, env={"TRITON_INTERPRET": "1"})
    for rank, out in enumerate(ranks):
        assert not out["bad"], f"world 4 rank {rank}: {out['bad']}"
        assert not out["error"] and out["checks"] >= 5 and out["rounds"] >= 3
    assert len({tuple(out["pipe"]) for out in ranks}) == 1


def test_strided_layout():
    from tpserve.collectives.workspace_peer import strided_layout

    x = torch.arange(24.0).view(2, 3, 4)
    assert strided_layout(x)[2] is True
    t, layout, contig = strided_layout(x.transpose(0, 2))
    assert contig is False and t is not None
    d1, d2, d3, t0, t1, t2, t3 = layout
    flat = [t0 * (k // (d1 * d2 * d3)) + t1 * (k // (d2 * d3) % d1) + t2 * (k // d3 % d2) + t3 * (k % d3)
            for k in range(24)]
    assert torch.equal(x.view(-1)[flat], x.transpose(0, 2).reshape(-1))
    y = torch.zeros(2, 1, 3, 2, 2, 5)[..., 1:4]  # 5 dims > 4 after merging: copied
    t, layout, contig = strided_layout(y.permute(5, 4, 3, 2, 1, 0))
    assert contig is True and t.is_contiguous()


def test_kernels_compile_for_sm90_without_a_gpu():
    """Triton + ptxas (shipped in the triton wheel) build the real kernels for an H100/H200:
    the inline PTX assembles, flags use acquire/release at system scope, data moves in 16 B."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tpserve.collectives import workspace_triton as k

    try:
        GPUTarget("cuda", 90, 32)
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no CUDA backend in this Triton: {exc}")

    def build(fn, **const):
        sig, attrs = {}, {}
        for i, name in enumerate(fn.arg_names):
            if name in const:
                sig[name] = "constexpr"
            elif name in ("state_ptr", "cnt_ptr", "pcnt_ptr", "rcnt_ptr", "inv_ptr"):
                sig[name] = "*i64"
            elif name == "w_ptr":
                sig[name] = "*fp32"
            elif name.endswith("_ptr"):
                sig[name] = "*bf16"
            elif name == "eps":
                sig[name] = "fp32"
            else:
                sig[name] = "i64" if name.startswith("B") or name.startswith("t") else "i32"
            unaligned = ("max_spin", "trap", "t0", "t1", "t2", "t3", "eps", "rows", "D")
            if sig[name] != "constexpr" and name not in unaligned:
                attrs[(i,)] = [["tt.divisibility", 16]]
        src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})

    common = dict(RANK=1, WORLD=2, BLOCK=1024, INTERP=False)
    for two_shot in (False, True):
        ptx = build(k.allreduce_kernel, TWO_SHOT=two_shot, CONTIG=True, **common).asm["ptx"]
        assert "ld.acquire.sys.global.b64" in ptx and "st.release.sys.global.b64" in ptx
        assert "ld.global.v4.b32" in ptx and "trap;" in ptx
        assert "multimem" not in ptx
    build(k.allreduce_kernel, TWO_SHOT=True, CONTIG=False, **common)
    build(k.allgather_kernel, CONTIG=False, **common)
    build(k.reducescatter_kernel, CONTIG=False, **dict(common, WORLD=8, RANK=7))
    from tpserve.collectives import workspace_triton_pipe as p
    for mode, world in ((p.AR1, 2), (p.AR2, 4)):
        ptx = build(p.pipelined_kernel, MODE=mode, NSLOTS=p.PIPE_SLOTS, CONTIG=True,
                    **dict(common, WORLD=world)).asm["ptx"]
        assert "ld.acquire.sys.global.b64" in ptx and "st.release.sys.global.b64" in ptx
        assert "multimem" not in ptx
    for mode in (p.AR2, p.AG, p.RS):
        build(p.pipelined_kernel, MODE=mode, NSLOTS=p.PIPE_SLOTS, CONTIG=False,
              **dict(common, WORLD=8, RANK=7))
    from tpserve.collectives import workspace_triton_ring as ring
    b0 = ring.ring_kernel.arg_names.index("B0")
    for world, rank, contig in ((2, 1, True), (4, 0, True), (4, 3, False), (8, 5, False)):
        ptx = build(ring.ring_kernel, NSLOTS=p.PIPE_SLOTS, CONTIG=contig,
                    **dict(common, WORLD=world, RANK=rank)).asm["ptx"]
        assert "ld.acquire.sys.global.b64" in ptx and "st.release.sys.global.b64" in ptx
        assert "trap;" in ptx and "multimem" not in ptx
        # the neighbour-only ring reads the buffer addresses of itself and its neighbours only
        params = {int(i) - b0 for i in re.findall(r"\[ring_kernel_param_(\d+)\]", ptx)}
        assert {q for q in params if 0 <= q < 8} == {(rank - 1) % world, rank, (rank + 1) % world}
    ptx = build(p.allreduce_add_rmsnorm_kernel, RANK=0, WORLD=2, BLOCK_D=8192,
                INTERP=False).asm["ptx"]
    assert "ld.acquire.sys.global.b64" in ptx and "trap;" in ptx
    ptx = build(p.allreduce_hc_expand_kernel, RANK=1, WORLD=2, HC=4, HC_P2=4, BLOCK_D=512,
                INTERP=False).asm["ptx"]
    assert "ld.acquire.sys.global.b64" in ptx and "trap;" in ptx
    for world, shared in ((2, True), (8, False)):
        ptx = build(k.reducescatter_moe_combine_kernel, RANK=1, WORLD=world, TOP_K=8, K_PAD=8,
                    BLOCK_D=512, HAS_SHARED=shared, INTERP=False).asm["ptx"]
        assert "ld.acquire.sys.global.b64" in ptx and "st.release.sys.global.b64" in ptx
        assert "trap;" in ptx and "multimem" not in ptx
        assert ("add.rn.f32" in ptx) is shared  # the shared experts' add, never fused into an FMA
        ptx = build(p.pipelined_moe_combine_kernel, RANK=1, WORLD=world, NSLOTS=p.PIPE_SLOTS,
                    TOP_K=8, K_PAD=8, BLOCK_D=512, HAS_SHARED=shared, BLOCK=1024,
                    INTERP=False).asm["ptx"]
        assert "ld.acquire.sys.global.b64" in ptx and "st.release.sys.global.b64" in ptx
        assert "trap;" in ptx and "multimem" not in ptx
        assert ("add.rn.f32" in ptx) is shared
