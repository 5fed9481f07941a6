"""The CUDA ring all-reduce (dist/workspace_triton_ring.py) on ONE GPU: W ranks as W PeerWorkspaces in one process,
one stream each, their buffers all on this GPU. Checks the ring kernel's compiled code (real memory ordering of its
flags, no deadlock) against the mesh kernels and the rank-order reference at W = 2, 3, 4 (fp32 / bf16 / fp16,
contiguous and strided, sizes of many rounds), and at W = 4 with each rank's opposite buffer replaced by a poisoned
one that must stay untouched. Not a measure of links between GPUs: the host-synced times it prints are overheads.

    python bench/ring_one_gpu_check.py     (from the repo root; prints ALL OK or FAILED)
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tpserve.dist.workspace_peer import PeerWorkspace, buffer_bytes_for  # noqa: E402

dev = torch.device("cuda", 0)


def ref(xs):
    acc = xs[0].float().clone()
    for x in xs[1:]:
        acc += x.float()
    return acc.to(xs[0].dtype)


def collective(wss, streams, fn):
    torch.cuda.synchronize()
    outs = []
    for ws, s in zip(wss, streams):
        with torch.cuda.stream(s):
            outs.append(fn(ws))
    torch.cuda.synchronize()
    return outs


def run(world, wbytes, poison_opposite, iters):
    nbytes = buffer_bytes_for(wbytes)
    bufs = [torch.zeros(nbytes, dtype=torch.uint8, device=dev) for _ in range(world)]
    poison = torch.full((nbytes,), 0x7F, dtype=torch.uint8, device=dev)
    wss = []
    for r in range(world):
        ptrs = [b.data_ptr() for b in bufs]
        if poison_opposite:
            ptrs[(r + 2) % world] = poison.data_ptr()
        wss.append(PeerWorkspace(r, world, ptrs, nbytes, dev, max_spin=1 << 24,
                                 trap_on_timeout=False, topology="ring" if poison_opposite else "mesh"))
    streams = [torch.cuda.Stream() for _ in range(world)]
    cap = wss[0].ring_capacity(torch.bfloat16)
    g = torch.Generator(device=dev).manual_seed(world)
    bad = 0
    n_checks = 0
    for it in range(iters):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for shape in [(7,), (1000, 3), (cap * 5 + 13,), (3 * wbytes // 2 + 1,)]:
                xs = [torch.randn(shape, generator=g, device=dev).to(dtype) for _ in range(world)]
                if it % 2:
                    xs = [x.view(-1)[: x.numel() // 2 * 2].view(2, -1).t() for x in xs]
                want = ref([x.contiguous() for x in xs])
                ring = collective(wss, streams, lambda ws: ws.all_reduce(xs[ws.rank], ring=True))
                outs = {"ring": ring}
                if not poison_opposite:
                    outs["mesh"] = collective(wss, streams,
                                              lambda ws: ws.all_reduce(xs[ws.rank], two_shot=world > 2))
                    outs["chunked"] = collective(wss, streams, lambda ws: ws.all_reduce_chunked(xs[ws.rank]))
                    outs["ring2"] = collective(wss, streams, lambda ws: ws.all_reduce(xs[ws.rank], ring=True))
                for name, o in outs.items():
                    for r, y in enumerate(o):
                        n_checks += 1
                        if not torch.equal(y, want):
                            bad += 1
                            if bad < 5:
                                print("MISMATCH", world, name, r, dtype, shape, it,
                                      (y.float() - want.float()).abs().max().item())
    err = [ws.error_flag() for ws in wss]
    untouched = bool((poison == 0x7F).all())
    # latency, small bf16 call (one GPU: not a link measurement, just the kernel's overheads)
    x = torch.randn(4096, device=dev).to(torch.bfloat16)
    times = {}
    for name, fn in (("ring", lambda ws: ws.all_reduce_ring(x)),
                     ("chunked", lambda ws: ws.all_reduce_chunked(x))):
        if poison_opposite and name != "ring":
            continue
        for _ in range(5):
            collective(wss, streams, fn)
        t = time.perf_counter()
        for _ in range(50):
            collective(wss, streams, fn)
        times[name] = round((time.perf_counter() - t) / 50 * 1e6, 1)
    print(f"world {world} poison={poison_opposite}: checks {n_checks} bad {bad} errors {err} "
          f"poison untouched {untouched} rounds/prog {int(wss[0].ring_counters[0])} "
          f"programs {wss[0].pipe_programs} us/call(host-synced) {times}", flush=True)
    return bad == 0 and not any(err) and untouched


ok = True
for world in (2, 3, 4):
    ok &= run(world, 1 << 20, False, 4)
ok &= run(4, 1 << 20, True, 4)
ok &= run(4, 64 << 10, False, 2)
print("ALL OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
