"""Sparse MLA decode attention: the Triton kernel (kernels/mla_triton.py) against the torch form of
model/mla.py `_sparse`, at GLM-5.3-Flash's widths (TP=1: 64 heads, latent 512, selection 2048 + 3).

    python bench/mla_sparse_bench.py [--tokens 1 8 32 64] [--heads 64] [--dtype bfloat16] [--ranges 4 8 ...] [--json F]
    python bench/mla_sparse_bench.py --prefill 256 4096 --configs h64r64w8s2 h32r32w4 ... [--json F] [--plot PNG]
    python bench/mla_sparse_bench.py --plot PNG --from-json F [F ...]   # the PNG of earlier prefill runs (no GPU)

Per token count: the largest error of each form against a float64 reference (and the kernel's against
the torch form), and the median time of 200 CUDA-graph replays after warm-up (CUDA events); the floor is the selected
latent rows read once (bytes / the card's HBM bandwidth).

With --prefill: the queries of one sequence (as a sparse prefill chunk sends them), each with its own random
selection of `--width` rows of the `--context`-long cache, timed per launch config (kernels/mla_triton.py
`SparseConfig`: heads per program, rows per step, warps, pipeline stages); the floor is
the FLOPs (2 dots of H x W x C per token) / the card's dense bf16 peak, and each config's output is compared with the
decode config's (max |difference| / max |output|).
"""

from __future__ import annotations

import argparse
import json

import torch
from quant_kernels import card_figures  # bench/ (the script's directory)

HBM, PEAK = card_figures()  # the card's HBM bytes/s and bf16 FLOP/s; (None, None) without CUDA


def torch_form(q_lat, sel, seq, tables, latent, bs, scaling):
    rows = tables[seq[:, None], sel.clamp(min=0) // bs] * bs + sel.clamp(min=0) % bs
    lat = latent[rows].to(q_lat.dtype)
    scores = torch.einsum("bhc,bwc->bhw", q_lat, lat).float() * scaling
    scores = scores.masked_fill((sel < 0).unsqueeze(1), float("-inf"))
    probs = scores.softmax(dim=-1).masked_fill((sel < 0).all(-1)[:, None, None], 0.0).to(q_lat.dtype)
    return torch.einsum("bhw,bwc->bhc", probs, lat)


def median_us(fn, reps: int = 200) -> float:
    """Median time of one replay of a CUDA graph of fn (as a decode step runs it: no launch gaps)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 8, 32, 64])
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--latent", type=int, default=512)
    ap.add_argument("--width", type=int, default=2051)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--ranges", type=int, nargs="*", default=[],
                    help="also time these fixed range counts (the selection split per token) at each token count")
    ap.add_argument("--prefill", type=int, nargs="*", default=[], help="query counts of one sequence (prefill mode)")
    ap.add_argument("--configs", nargs="*", default=[], help="launch configs to time in prefill mode")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--plot", default=None, help="prefill mode: a PNG of each shape's time per query count, floor drawn")
    ap.add_argument("--from-json", nargs="*", default=[], help="with --plot: draw these earlier --prefill JSONs")
    args = ap.parse_args()
    if args.from_json:
        if not args.plot:
            ap.error("--from-json: give --plot too")
        rows = [r for f in args.from_json for r in json.load(open(f))["rows"]]
        plot_prefill(rows, args.plot)
        return
    if args.prefill:
        rows = prefill(args)
        if args.plot:
            plot_prefill(rows, args.plot)
        return
    from tpserve.kernels.attention.mla_triton import sparse_mla

    dev, dtype, bs = torch.device("cuda"), getattr(torch, args.dtype), 64
    g = torch.Generator(device="cpu").manual_seed(0)
    rows_out = []
    print("| tokens | torch form us | triton us | triton / torch | floor us | kernel err vs fp64 | torch err vs fp64 |"
          "\n| --- | --- | --- | --- | --- | --- | --- |")
    for n in args.tokens:
        nb = args.context // bs
        blocks = nb * n + 1
        latent = torch.randn(blocks * bs, args.latent, generator=g).to(dtype).to(dev)
        tables = torch.randperm(blocks - 1, generator=g)[:n * nb].view(n, nb).to(dev)
        seq = torch.arange(n, device=dev)
        sel = torch.stack([torch.randperm(args.context, generator=g)[:args.width] for _ in range(n)]).to(dev)
        sel[:, -3:] = -1  # an unfinished tail
        q_lat = (torch.randn(n, args.heads, args.latent, generator=g) * 0.05).to(dtype).to(dev)
        scaling = 192 ** -0.5
        rows = tables[seq[:, None], sel.clamp(min=0) // bs] * bs + sel.clamp(min=0) % bs
        lat64 = latent[rows].double()
        s = torch.einsum("bhc,bwc->bhw", q_lat.double(), lat64) * scaling
        ref = torch.einsum("bhw,bwc->bhc", s.masked_fill((sel < 0)[:, None], float("-inf")).softmax(-1), lat64)
        want = torch_form(q_lat, sel, seq, tables, latent, bs, scaling)
        got = sparse_mla(q_lat, sel, seq, tables, latent, bs, scaling)
        t_torch = median_us(lambda: torch_form(q_lat, sel, seq, tables, latent, bs, scaling))
        t_triton = median_us(lambda: sparse_mla(q_lat, sel, seq, tables, latent, bs, scaling))
        floor = n * args.width * args.latent * latent.element_size() / HBM * 1e6
        row = dict(tokens=n, torch_us=t_torch, triton_us=t_triton, floor_us=floor,
                   kernel_err=float((got.double() - ref).abs().max()), torch_err=float((want.double() - ref).abs().max()),
                   kernel_vs_torch=float((got.double() - want.double()).abs().max()))
        for r in args.ranges:
            row[f"triton_us_ranges_{r}"] = median_us(lambda: sparse_mla(q_lat, sel, seq, tables, latent, bs, scaling, r))
        rows_out.append(row)
        print(f"| {n} | {t_torch:.1f} | {t_triton:.1f} | {t_triton / t_torch:.2f} | {floor:.2f} | "
              f"{row['kernel_err']:.2e} | {row['torch_err']:.2e} |")
        if args.ranges:
            print("    ranges: " + ", ".join(f"{r}: {row[f'triton_us_ranges_{r}']:.1f} us" for r in args.ranges))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(vars(args), rows=rows_out), f, indent=1)


def prefill(args) -> list[dict]:
    from tpserve.kernels.attention.mla_triton import DECODE, SparseConfig, sparse_mla

    dev, dtype, bs = torch.device("cuda"), getattr(torch, args.dtype), 64
    g = torch.Generator(device="cpu").manual_seed(0)
    nb = args.context // bs
    latent = torch.randn(nb * bs, args.latent, generator=g).to(dtype).to(dev)
    tables = torch.randperm(nb, generator=g).view(1, nb).to(dev)
    configs = [DECODE] + [c for c in map(SparseConfig.parse, args.configs) if c != DECODE]
    rows_out = []
    print("| queries | config | ms | TFLOP/s | of peak | floor ms | difference |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")
    for n in args.prefill:
        sel = torch.argsort(torch.rand(n, args.context, device=dev), dim=1)[:, :args.width].int()
        seq = torch.zeros(n, dtype=torch.int32, device=dev)
        q_lat = (torch.randn(n, args.heads, args.latent, device=dev) * 0.05).to(dtype)
        scaling = 192 ** -0.5
        flops = 4.0 * n * args.heads * args.width * args.latent
        base = None
        for cfg in configs:
            try:
                out = sparse_mla(q_lat, sel, seq, tables, latent, bs, scaling, config=cfg)
                us = median_us(lambda: sparse_mla(q_lat, sel, seq, tables, latent, bs, scaling, config=cfg), reps=20)
            except Exception as e:  # a config the compiler cannot fit (shared memory, registers)
                print(f"| {n} | {cfg} | failed: {type(e).__name__}: {str(e)[:120]} | | | | |")
                rows_out.append(dict(queries=n, config=str(cfg), error=str(e)[:400]))
                continue
            base = out if base is None else base
            diff = float((out.float() - base.float()).abs().max() / base.float().abs().max())
            tflops = flops / us / 1e6
            row = dict(queries=n, config=str(cfg), ms=us / 1e3, tflops=tflops, of_peak=tflops / (PEAK / 1e12),
                       floor_ms=flops / PEAK * 1e3, difference=diff)
            rows_out.append(row)
            print(f"| {n} | {cfg} | {row['ms']:.3f} | {tflops:.1f} | {row['of_peak']:.1%} | {row['floor_ms']:.3f} | "
                  f"{diff:.1e} |")
        q_lat = sel = base = out = None  # freed before the next size is made
    try:  # registers and spills of each compiled variant (Triton's cache of the kernel; internals, so best effort)
        from tpserve.kernels.attention.mla_triton import _sparse_kernel
        for cache in _sparse_kernel.device_caches.values():
            for k in cache[0].values():
                if hasattr(k, "n_regs"):
                    print(f"compiled: regs {k.n_regs}, spills {k.n_spills}, shared {k.metadata.shared} "
                          f"warps {k.metadata.num_warps} stages {k.metadata.num_stages}")
    except Exception as e:  # noqa: BLE001 - diagnostics only
        print(f"compiled: not available ({type(e).__name__}: {e})")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(vars(args), rows=rows_out), f, indent=1)
    return rows_out


def plot_prefill(rows: list[dict], path: str) -> None:
    """One bar per launch shape at the largest query count measured (its fastest time where runs repeat), the
    FLOP floor as a line; shapes that failed to compile are left out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(r["queries"] for r in rows if "ms" in r)
    best: dict[str, dict] = {}
    for r in rows:
        if r["queries"] == n and "ms" in r and (r["config"] not in best or r["ms"] < best[r["config"]]["ms"]):
            best[r["config"]] = r
    shown = sorted(best.values(), key=lambda r: r["ms"])
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(shown) + 1.4))
    ax.barh([r["config"] for r in shown], [r["ms"] for r in shown], color="tab:blue")
    floor = shown[0]["floor_ms"]
    ax.axvline(floor, color="black", linestyle="--", label=f"FLOP floor {floor:.2f} ms")
    ax.invert_yaxis()
    ax.set_xlabel(f"ms per call, {n:,} queries x their selected rows (H200)")
    ax.set_title("sparse MLA prefill launch shapes\n(h heads, r rows, w warps, s stages; c / q / +rows: removed variants)", fontsize=10)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
